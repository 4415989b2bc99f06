"""`benchmarks/rl_peers.py`: runs in the suite without SB3 (its rows skipped with one line), and
gives SB3 the hyper-parameters of the committed configs."""

import importlib.util
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("gymnasium")


def _bench():
    spec = importlib.util.spec_from_file_location(
        "rl_peers", os.path.join(ROOT, "benchmarks", "rl_peers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_runs_without_sb3_and_skips_its_rows_with_one_line():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "rl_peers.py"), "--quick",
                          "--tasks", "dqn"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("SB3 rows skipped: no --sb3-python")
    row = next(line for line in lines if line.startswith("| dqn |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "600" and float(cells[3]) > 0 and cells[4] == "-"


def test_a_python_without_sb3_is_one_line():
    line = _bench().sb3_available(sys.executable)
    assert line is not None and line.startswith(f"SB3 rows skipped: --sb3-python {sys.executable} "
                                                "cannot import stable_baselines3")


def _yaml(name):
    with open(os.path.join(ROOT, "experiments", name)) as fh:
        return yaml.safe_load(fh)


def test_sb3_gets_the_configs_hyper_parameters():
    bench = _bench()
    dqn, td3, sac, ppo = (_yaml(bench.ROWS[t]) for t in ("dqn", "td3", "sac", "ppo"))
    spec = bench.sb3_spec("dqn", 0, 100000, 10)["kwargs"]
    assert spec["learning_rate"] == float(dqn["model"]["heads"]["q"]["optimizer"]["config"]["learning_rate"])
    assert spec["policy_kwargs"]["net_arch"] == dqn["model"]["trunk"]["mlp"]["units"]
    assert (spec["buffer_size"], spec["gamma"], spec["batch_size"]) == (
        dqn["dqn"]["buffer_size"], dqn["dqn"]["gamma"], dqn["train"]["batch_size"])
    assert spec["target_update_interval"] == dqn["dqn"]["target_every"] * dqn["dqn"]["train_every"]
    assert spec["exploration_fraction"] == dqn["dqn"]["epsilon_decay_steps"] / 100000
    spec = bench.sb3_spec("td3", 0, 20000, 10)["kwargs"]
    assert (spec["policy_delay"], spec["tau"], spec["target_policy_noise"],
            spec["action_noise_sigma"]) == (td3["model"]["heads"]["actor"]["every"], td3["td3"]["tau"],
                                            td3["td3"]["policy_noise"], td3["td3"]["exploration_noise"])
    assert spec["policy_kwargs"]["net_arch"] == td3["model"]["heads"]["q1"]["layers"]["mlp"]["units"]
    spec = bench.sb3_spec("sac", 0, 20000, 10)["kwargs"]
    assert spec["ent_coef"] == f"auto_{float(sac['sac']['initial_alpha'])}"
    spec = bench.sb3_spec("ppo", 0, 100000, 10)["kwargs"]
    section = ppo["ppo"]
    assert (spec["n_envs"], spec["n_steps"], spec["n_epochs"], spec["gae_lambda"],
            spec["batch_size"]) == (section["num_envs"], section["n_steps"], section["n_epochs"],
                                    section["gae_lambda"], ppo["train"]["batch_size"])
    assert spec["clip_range"] == {"linear": section["clip_range"]}
    assert spec["vf_coef"] == ppo["model"]["heads"]["value"]["weight"]
