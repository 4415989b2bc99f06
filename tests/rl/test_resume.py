"""Every RL task resumes exactly: a run SIGKILLed after a checkpoint and resumed with
`--resume` equals the uninterrupted run bitwise (weights, optimizer slots, target networks,
replay contents, generators, environments, evaluation history); a resumed run whose
environments cannot be restored says so in one line and restores everything else."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from multihead.experiments.config.schema import load_config
from multihead.experiments.run import runner as tasks
from multihead.experiments.run.rl import RLRun
from multihead.io.manager import CheckpointManager
from multihead.rl import driver as driver_module
from multihead.rl.host_state import from_json, generator_state

pytest.importorskip("gymnasium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Subprocess bounds: a CLI run of a few hundred env steps takes 10-40 s on a loaded 2-core box.
TIMEOUT = 300

#: task -> (config, --set overrides): a few hundred environment steps, checkpoints every 50ish,
#: evaluations, target syncs and (off-policy) updates from a replay buffer within the budget.
RUNS = {
    "dqn": ("dqn_cartpole.yaml", ["train.steps=300", "dqn.learning_starts=100", "dqn.buffer_size=1000",
                                  "dqn.epsilon_decay_steps=200", "dqn.target_every=25",
                                  "env.eval_episodes=2", "train.eval_every=100", "log.every=20",
                                  "checkpoint.every=50", "model.trunk.mlp.units=[32]"]),
    "actor_critic": ("a2c_cartpole.yaml", ["train.steps=300", "actor_critic.num_envs=2",
                                           "env.eval_episodes=2", "train.eval_every=100",
                                           "log.every=10", "checkpoint.every=50"]),
    "td3": ("td3_pendulum.yaml", ["train.steps=300", "td3.start_steps=100", "td3.learning_starts=100",
                                  "td3.buffer_size=1000", "train.batch_size=32", "env.eval_episodes=1",
                                  "train.eval_every=150", "log.every=20", "checkpoint.every=50"]),
    "sac": ("sac_pendulum.yaml", ["train.steps=300", "sac.start_steps=100", "sac.learning_starts=100",
                                  "sac.buffer_size=1000", "train.batch_size=32", "env.eval_episodes=1",
                                  "train.eval_every=150", "log.every=20", "checkpoint.every=50"]),
    "ppo": ("ppo_cartpole.yaml", ["train.steps=320", "ppo.num_envs=2", "ppo.n_steps=16", "ppo.n_epochs=2",
                                  "train.batch_size=16", "env.eval_episodes=2", "train.eval_every=160",
                                  "log.every=10", "checkpoint.every=64"]),
}


def _env():
    env = dict(os.environ, TF_DETERMINISTIC_OPS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def _argv(task):
    config, sets = RUNS[task]
    argv = [sys.executable, "-m", "multihead", "train", os.path.join(ROOT, "experiments", config), "--quiet"]
    for s in sets:
        argv += ["--set", s]
    return argv


def _cli(argv):
    result = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def _killed_after_a_checkpoint(argv, run_dir, signum=signal.SIGKILL):
    """Starts the run in `run_dir`, sends it `signum` once it has written a checkpoint;
    returns the env step of its newest checkpoint."""
    state_file = run_dir / "checkpoints" / "checkpoint"
    proc = subprocess.Popen([*argv, "--run-dir", str(run_dir)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not state_file.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"no checkpoint within {TIMEOUT} s"
            time.sleep(0.02)
        proc.send_signal(signum)
        proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stderr.close()
    # SIGTERM: the run stops at a loop boundary with a checkpoint and exits 128 + 15.
    assert proc.returncode == (-signal.SIGKILL if signum == signal.SIGKILL else 128 + signum)
    return CheckpointManager.step_of(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))


def _tensors(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if not key.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter", "run/"))}


def _resumed_equals_uninterrupted(task, tmp_path, signum=signal.SIGKILL):
    argv = _argv(task)
    total = int(next(s for s in RUNS[task][1] if s.startswith("train.steps=")).split("=")[1])
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    killed_at = _killed_after_a_checkpoint(argv, stopped, signum)
    assert 0 < killed_at < total  # killed mid-run, after a checkpoint
    if signum != signal.SIGKILL:
        status = json.loads((stopped / "status.json").read_text())
        assert status["status"] == "interrupted" and status["checkpoint"] == f"checkpoints/ckpt-{killed_at}"
    resumed = _cli([*argv, "--resume", str(stopped)])
    _cli([*argv, "--run-dir", str(full)])
    assert "resuming from checkpoints/ckpt-" not in resumed.stderr  # --quiet

    resumed_state = _tensors(str(stopped / "checkpoints" / f"ckpt-{total}"))
    full_state = _tensors(str(full / "checkpoints" / f"ckpt-{total}"))
    assert set(resumed_state) == set(full_state)
    # What must be there: optimizer slots, the host state (loop: envs, generators, evaluation
    # history; replay: the buffer's rows), and the target networks where the task has one.
    assert any(k.startswith("optimizers/") for k in full_state)
    assert "host/loop/.ATTRIBUTES/loop" in full_state
    if task in ("dqn", "td3", "sac"):
        assert any(k.startswith("targets/") for k in full_state)
        assert full_state["host/replay/.ATTRIBUTES/obs"].shape[0] == total
    for key, value in full_state.items():
        np.testing.assert_array_equal(resumed_state[key], value, err_msg=key)
    loop = from_json(full_state["host/loop/.ATTRIBUTES/loop"].decode())
    assert len(loop["evaluations"]["history"]) >= 2
    metrics = [json.loads((d / "metrics.json").read_text()) for d in (stopped, full)]
    assert metrics[0]["evals"] == metrics[1]["evals"]
    assert metrics[0]["updates"] == metrics[1]["updates"] and metrics[0]["episodes"] == metrics[1]["episodes"]
    status = json.loads((stopped / "status.json").read_text())
    assert status["status"] == "completed"


def test_dqn_killed_and_resumed_equals_the_uninterrupted_run(tmp_path):
    _resumed_equals_uninterrupted("dqn", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["actor_critic", "td3", "sac", "ppo"])
def test_killed_and_resumed_equals_the_uninterrupted_run(task, tmp_path):
    _resumed_equals_uninterrupted(task, tmp_path)


@pytest.mark.slow
def test_dqn_stopped_by_sigterm_at_a_loop_boundary_and_resumed_equals_the_uninterrupted_run(tmp_path):
    _resumed_equals_uninterrupted("dqn", tmp_path, signal.SIGTERM)


def test_a_non_restorable_environment_restarts_says_so_and_restores_the_rest(tmp_path, capsys,
                                                                             monkeypatch):
    config, sets = RUNS["dqn"]
    path = os.path.join(ROOT, "experiments", config)
    short = [s for s in sets if not s.startswith("train.steps=")]
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    tasks.prepare(load_config(path, short + ["train.steps=150"])).run(run_dir, verbose=False)
    saved = _tensors(os.path.join(run_dir, "checkpoints", "ckpt-150"))
    capsys.readouterr()

    restored = {}
    start = RLRun.start

    def start_and_record(self, generators=None, replay=None, records=None):
        start(self, generators, replay, records)
        restored["replay"] = {k: np.array(v) if not isinstance(v, str) else v
                              for k, v in replay.state().items()}
        restored["generators"] = {n: generator_state(g) for n, g in generators.items()}
        restored["env_steps"] = self.driver.env_steps

    monkeypatch.setattr(RLRun, "start", start_and_record)
    monkeypatch.setattr(driver_module.env_state, "restorable", lambda env: False)
    tasks.prepare(load_config(path, short + ["train.steps=200"])).run(run_dir, verbose=False, resume=True)
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "cannot be restored" in line]
    assert len(said) == 1 and "CartPole-v1" in said[0] and "restart with new episodes" in said[0]

    assert restored["env_steps"] == 150
    for name in ("obs", "next_obs", "action", "reward", "terminated"):
        np.testing.assert_array_equal(restored["replay"][name], saved[f"host/replay/.ATTRIBUTES/{name}"])
    assert from_json(restored["replay"]["position"]) == \
        from_json(saved["host/replay/.ATTRIBUTES/position"].decode())
    loop = from_json(saved["host/loop/.ATTRIBUTES/loop"].decode())
    assert restored["generators"] == loop["generators"]
