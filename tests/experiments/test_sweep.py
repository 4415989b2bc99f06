"""`multihead sweep`: trials from axes, run in parallel processes, equal to runs made one by
one; failed trials recorded; a killed sweep resumed to the index of an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError, load_config
from multihead.experiments.config.sweep_section import Distribution, sweep_spec
from multihead.experiments.sweep.sweep import (
    TIMING_KEYS,
    last_error,
    parse_grid_arg,
    parse_sample_arg,
    threads_per_trial,
    trial_overrides,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {
    "seed": 0,
    "data": {"kind": "mmoe", "train_size": 128, "eval_size": 32, "input_dim": 6},
    "model": {
        "trunk": {"mlp": {"units": [4]}},
        "heads": {h: {"layers": {"class_name": "Dense", "config": {"units": 1}}, "metrics": ["mae"],
                      "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}}}
                  for h in ("y1", "y2")},
    },
    "train": {"steps": 6, "batch_size": 32, "eval_every": 3},
    "log": {"every": 3, "histograms_every": 0},
}
LR = "model.heads.y1.optimizer.config.learning_rate"


def _write(tmp_path, config, name="tiny.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _sweep(*args, timeout=600):
    """`multihead sweep ...` as a process (the trials are processes too)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "multihead", "sweep", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _results(run_dir) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {k: v for k, v in metrics.items() if k not in TIMING_KEYS}  # timings are measurements


# -- axes ------------------------------------------------------------------------------


def test_grid_zip_and_random_axes_make_the_product_in_order():
    spec = sweep_spec({"grid": {"seed": [0, 1], "train.trunk.aggregator": ["sum", "pcgrad"]},
                       "zip": {"a": [1, 2, 3], "b": ["x", "y", "z"]},
                       "random": {"count": 2, "seed": 7, "axes": {"lr": {"loguniform": [1e-4, 1e-1]},
                                                                  "bs": [16, 32]}}})
    trials = trial_overrides(spec)
    assert len(trials) == 2 * 2 * 3 * 2
    assert [(t["seed"], t["train.trunk.aggregator"]) for t in trials[::6]] == \
        [(0, "sum"), (0, "pcgrad"), (1, "sum"), (1, "pcgrad")]
    assert [(t["a"], t["b"]) for t in trials[:6:2]] == [(1, "x"), (2, "y"), (3, "z")]  # paired
    assert all(1e-4 <= t["lr"] <= 1e-1 and t["bs"] in (16, 32) for t in trials)
    assert trial_overrides(spec) == trials  # seeded draws: the same trials every time
    assert len({t["lr"] for t in trials}) == 2  # two draws, each reused across grid x zip


def test_cli_axis_syntax():
    assert parse_grid_arg("model.trunk.mlp.units=[16],[32, 32]") == ("model.trunk.mlp.units", [[16], [32, 32]])
    assert parse_grid_arg("seed=0,1,2") == ("seed", [0, 1, 2])
    assert parse_sample_arg("lr=loguniform:1e-4:1e-1") == ("lr", Distribution("loguniform", (1e-4, 0.1)))
    assert parse_sample_arg("b=choice:32,64") == ("b", Distribution("choice", (32, 64)))
    with pytest.raises(ConfigError, match="--grid 'seed': expected KEY.PATH=VALUE1,VALUE2"):
        parse_grid_arg("seed")
    with pytest.raises(ConfigError, match="KIND one of choice, uniform, loguniform, int"):
        parse_sample_arg("lr=logunif:1:2")


@pytest.mark.parametrize("section,message", [
    ({"gird": {}}, "sweep.gird: unknown key (did you mean 'grid'?)"),
    ({"grid": {"seed": 3}}, "sweep.grid.seed: expected a non-empty list of values, got 3 (int)"),
    ({"zip": {"a": [1, 2], "b": [1]}}, "sweep.zip: paired axes need equal lengths"),
    ({"random": {"count": 0, "axes": {"a": [1]}}}, "sweep.random.count: expected an integer >= 1"),
    ({"random": {"count": 2, "axes": {"a": {"loguniform": [0, 1]}}}},
     "sweep.random.axes.a.loguniform: low must be > 0"),
    ({"random": {"count": 2, "axes": {"a": {"normal": [0, 1]}}}},
     "sweep.random.axes.a: unknown distribution 'normal'"),
    ({"grid": {"seed": [0]}, "zip": {"seed": [1]}}, "sweep.zip.seed: already an axis in sweep.grid"),
])
def test_bad_sweep_sections_name_the_key(tmp_path, section, message):
    path = _write(tmp_path, {**TINY, "sweep": section})
    with pytest.raises(ConfigError, match=None) as err:
        load_config(path)  # `multihead train` validates the section too
    assert message in str(err.value) and path in str(err.value)


def test_thread_rule():
    assert [threads_per_trial(jobs, available=8) for jobs in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


def test_last_error_skips_tensorflow_logging():
    text = ("I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on\nTraceback (most recent call last):\n"
            "  File \"x.py\", line 1\nFloatingPointError: the loss of head 'y1' became nan\n"
            "E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit\n")
    assert last_error(text) == "FloatingPointError: the loss of head 'y1' became nan"
    assert last_error("noise\nmultihead: error: x.yaml: train.steps: expected an integer\n") == \
        "x.yaml: train.steps: expected an integer"


# -- end to end ------------------------------------------------------------------------


def test_two_parallel_trials_one_failing_fast(tmp_path):
    """The short version of the two tests below: one trial done (equal to the run made alone),
    one failed by a config error, both recorded."""
    config = _write(tmp_path, TINY)
    out = _sweep(config, "--grid", "train.steps=6,six", "--jobs", "2", "--sweep-dir", str(tmp_path / "sw"))
    assert out.returncode == 1, out.stderr[-3000:]
    trials = json.loads((tmp_path / "sw" / "sweep.json").read_text())["trials"]
    assert [t["status"] for t in trials] == ["done", "failed"]
    assert "train.steps: expected an integer, got 'six' (str)" in trials[1]["error"]
    assert run_experiment(str(config), run_dir=str(tmp_path / "alone"), quiet=True).exit_code == 0
    assert _results(tmp_path / "sw" / "trials" / "t000") == _results(tmp_path / "alone")
    assert trials[0]["metrics"] == _results(tmp_path / "alone")["eval"]
    assert "2 running" in out.stderr and "1/2 done, 0 running, 1 failed; best eval/mean_loss" in out.stderr


@pytest.mark.slow
def test_parallel_grid_equals_the_runs_made_one_by_one(tmp_path):
    config = _write(tmp_path, TINY)
    out = _sweep(config, "--grid", "seed=0,1", "--grid", f"{LR}=0.01,0.1", "--jobs", "2",
                 "--sweep-dir", str(tmp_path / "sw"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "4/4 done, 0 running, 0 failed; best eval/mean_loss" in out.stderr  # the progress line
    index = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    expected = [{"seed": s, LR: lr} for s in (0, 1) for lr in (0.01, 0.1)]
    assert [t["overrides"] for t in index["trials"]] == expected
    for trial, overrides in zip(index["trials"], expected):
        alone = tmp_path / f"alone-{trial['id']}"
        assert run_experiment(config, run_dir=str(alone), quiet=True,
                              overrides=[f"{k}={v}" for k, v in overrides.items()]).exit_code == 0
        swept = _results(tmp_path / "sw" / trial["run_dir"])
        assert swept == _results(alone)  # bitwise: every number of metrics.json but timings
        assert trial["status"] == "done" and trial["error"] is None
        assert trial["metrics"] == swept["eval"]
        assert trial["objective"] == (swept["eval"]["y1"]["loss"] + swept["eval"]["y2"]["loss"]) / 2
    best = min(index["trials"], key=lambda t: t["objective"])
    assert f"best eval/mean_loss {best['objective']:.6g} ({best['id']})" in out.stderr


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_others_complete(tmp_path):
    # the third trial's weights reach ~1e30 in one Adam step: its next loss overflows float32
    config = _write(tmp_path, {**TINY, "train": {**TINY["train"], "max_nonfinite_steps": 1},
                               "sweep": {"zip": {"train.steps": [6, "six", 6],
                                                 LR: [0.01, 0.01, 1.0e30]}}})
    out = _sweep(config, "--jobs", "2", "--sweep-dir", str(tmp_path / "sw"))
    assert out.returncode == 1  # some trial failed
    trials = json.loads((tmp_path / "sw" / "sweep.json").read_text())["trials"]
    assert [t["status"] for t in trials] == ["done", "failed", "failed"]
    assert "train.steps: expected an integer, got 'six' (str)" in trials[1]["error"]
    assert trials[2]["error"].startswith("run failed at step 2: FloatingPointError: the loss of "
                                         "head 'y1' became nan")
    assert trials[0]["metrics"] == _results(tmp_path / "sw" / "trials" / "t000")["eval"]
    assert "t001 failed: " in out.stderr and "(3 trials, 2 failed" in out.stdout


def test_bad_sweep_input_exits_2_and_writes_nothing(tmp_path):
    config = _write(tmp_path, TINY)
    for args, message in [(["--grid", "seed"], "expected KEY.PATH=VALUE1,VALUE2"),
                          ([], "no axes to sweep"),
                          (["--grid", "seed=0,1", "--objective", "eval/y3/loss"], "no head 'y3'"),
                          (["--grid", "seed=0,1", "--jobs", "0"], "--jobs 0: must be >= 1")]:
        assert main(["sweep", config, "--sweep-dir", str(tmp_path / "sw"), *args]) == 2, args
        assert not (tmp_path / "sw").exists()
    with pytest.raises(SystemExit):
        main(["sweep", "--resume", str(tmp_path / "nope"), "--jobs", "x"])


@pytest.mark.slow
def test_resume_after_sigkill_runs_what_is_missing_and_ends_as_an_uninterrupted_sweep(tmp_path):
    config = _write(tmp_path, {**TINY, "train": {**TINY["train"], "steps": 60, "eval_every": 20},
                               "checkpoint": {"every": 10}})
    args = [config, "--grid", "seed=0,1,2"]
    whole = _sweep(*args, "--sweep-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "multihead", "sweep", *args, "--sweep-dir",
                             str(tmp_path / "cut"), "--quiet"], env=env)
    try:  # kill once trial t000 is done and t001 has a checkpoint to continue from
        deadline = time.monotonic() + 600
        index = tmp_path / "cut" / "sweep.json"
        while time.monotonic() < deadline:
            if index.exists() and (tmp_path / "cut/trials/t001/checkpoints/checkpoint").exists():
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the sweep did not reach trial t001's first checkpoint")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    cut = json.loads(index.read_text())
    assert [t["status"] for t in cut["trials"]] == ["done", "running", "pending"]
    time.sleep(1)  # the killed sweep's trial died with it (PR_SET_PDEATHSIG)
    mtime = (tmp_path / "cut/trials/t000/metrics.json").stat().st_mtime_ns
    resumed = _sweep("--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "cut/trials/t000/metrics.json").stat().st_mtime_ns == mtime  # not rerun
    log = (tmp_path / "cut/logs/t001.log").read_text()  # the command lines of its two starts
    assert log.count("$ ") == 2 and " --resume " in log.split("$ ")[2]  # from its checkpoint
    final = json.loads(index.read_text())
    assert final == json.loads((tmp_path / "whole" / "sweep.json").read_text())


def test_only_head_sweep_runs_the_config_of_train_only_head(tmp_path, capsys):
    """The short version of the slow test below: a bad head exits 2 before anything is
    written, and the base config every trial trains (the sweep's config.yaml) is the config
    `train --only-head` trains; a trial trains its config as `train` does
    (`test_two_parallel_trials_one_failing_fast`)."""
    from multihead.cli.sweep import _only_head
    from multihead.experiments.config.schema import to_dict
    from multihead.experiments.run.experiment import load_experiment
    from multihead.experiments.sweep.sweep import load_base

    config = _write(tmp_path, TINY)
    assert main(["sweep", config, "--only-head", "y3", "--grid", "seed=0,1",
                 "--sweep-dir", str(tmp_path / "bad")]) == 2
    assert "--only-head 'y3': the model has no head 'y3'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    base, _ = load_base(config, ["seed=3"])
    swept = _only_head(config, base, "y2", ())
    assert list(swept["model"]["heads"]) == ["y2"]
    assert swept == to_dict(load_experiment(config, ["seed=3"], only_head="y2"))


@pytest.mark.slow
def test_only_head_sweep_trains_the_head_alone_as_train_only_head(tmp_path, capsys):
    config = _write(tmp_path, TINY)
    assert main(["sweep", config, "--only-head", "y3", "--grid", "seed=0,1",
                 "--sweep-dir", str(tmp_path / "bad")]) == 2
    assert "--only-head 'y3': the model has no head 'y3'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    out = _sweep(config, "--only-head", "y2", "--grid", "seed=3", "--sweep-dir", str(tmp_path / "sw"))
    assert out.returncode == 0, out.stderr[-3000:]
    (trial,) = json.loads((tmp_path / "sw" / "sweep.json").read_text())["trials"]
    assert list(trial["metrics"]) == ["y2"] and trial["objective"] == trial["metrics"]["y2"]["loss"]
    assert run_experiment(str(config), run_dir=str(tmp_path / "alone"), overrides=["seed=3"],
                          only_head="y2", quiet=True).exit_code == 0
    assert _results(tmp_path / "sw" / "trials" / "t000") == _results(tmp_path / "alone")  # bitwise


def test_simplex_makes_one_trial_per_preference_on_the_heads_weights(tmp_path, capsys):
    """The short version of the slow test below: `--simplex 3` over two heads is a zip axis
    of the weights (1, 0), (0.5, 0.5), (0, 1) on model.heads.<h>.weight; `--simplex 1` exits 2
    with nothing written."""
    from multihead.cli.sweep import _simplex_axes
    from multihead.experiments.config.sweep_section import sweep_spec

    config = _write(tmp_path, TINY)
    assert main(["sweep", config, "--simplex", "1", "--sweep-dir", str(tmp_path / "bad")]) == 2
    assert "--simplex 1: simplex: expected an integer >= 2" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    spec = sweep_spec({})
    _simplex_axes(spec, ["y1", "y2"], 3)
    trials = trial_overrides(spec)
    assert [(t["model.heads.y1.weight"], t["model.heads.y2.weight"]) for t in trials] == \
        [(1.0, 0.0), (0.5, 0.5), (0.0, 1.0)]


@pytest.mark.slow
def test_simplex_sweep_trains_one_trial_per_preference_and_compare_reads_the_front(tmp_path, capsys):
    """`--simplex 3` over two heads: three trials with weights (1, 0), (0.5, 0.5), (0, 1) on
    model.heads.<h>.weight, each equal to `train --set` of those weights; `compare --pareto`
    then reads them as a front."""
    config = _write(tmp_path, TINY)
    assert main(["sweep", config, "--simplex", "1", "--sweep-dir", str(tmp_path / "bad")]) == 2
    assert "--simplex 1: simplex: expected an integer >= 2" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    out = _sweep(config, "--simplex", "3", "--sweep-dir", str(tmp_path / "sw"), "--jobs", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    trials = json.loads((tmp_path / "sw" / "sweep.json").read_text())["trials"]
    weights = [(t["overrides"]["model.heads.y1.weight"], t["overrides"]["model.heads.y2.weight"])
               for t in trials]
    assert weights == [(1.0, 0.0), (0.5, 0.5), (0.0, 1.0)]
    assert run_experiment(str(config), run_dir=str(tmp_path / "alone"), quiet=True, overrides=[
        "model.heads.y1.weight=0.5", "model.heads.y2.weight=0.5"]).exit_code == 0
    assert _results(tmp_path / "sw" / "trials" / "t001") == _results(tmp_path / "alone")  # bitwise
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "sw"), "--pareto", "--json"]) == 0
    front = json.loads(capsys.readouterr().out)["pareto"]
    assert front["pairs"] == ["y1/loss", "y2/loss"] and len(front["points"]) == 3
