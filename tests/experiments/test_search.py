"""`multihead sweep --search optuna` (pruning at evaluations) and `--backend ray` (a local
Ray instance on 127.0.0.1): smoke checks against the grid and the local backend."""

from __future__ import annotations

import json
import os

import pytest
from test_sweep import TINY, _results, _sweep, _write

from multihead.experiments.run.experiment import run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "experiments", "quickstart.yaml")
SMALL = ["--set", "data.eval_size=500", "--set", "train.steps=300",
         "--set", "train.eval_every=100", "--set", "model.trunk.mlp.units=[16]", "--set", "log.every=100"]
LR = "model.heads.y1.optimizer.config.learning_rate"


@pytest.mark.slow
def test_optuna_finds_a_learning_rate_no_worse_than_the_grid_middle(tmp_path):
    pytest.importorskip("optuna")
    out = _sweep(QUICKSTART, *SMALL, "--search", "optuna", "--trials", "6", "--search-seed", "0",
                 "--sample", f"{LR}=loguniform:1e-4:1e-1", "--objective", "eval/y1/loss",
                 "--sweep-dir", str(tmp_path / "search"), timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    index = json.loads((tmp_path / "search" / "sweep.json").read_text())
    trials = index["trials"]
    assert len(trials) == 6 and {t["status"] for t in trials} <= {"done", "pruned"}
    assert all(1e-4 <= t["overrides"][LR] <= 1e-1 for t in trials)
    for trial in trials:  # what Optuna was told at each evaluation: the run's own evaluations
        evals = {str(e["step"]): e["eval"]["y1"]["loss"]
                 for e in json.loads((tmp_path / "search" / trial["run_dir"] / "metrics.json").read_text())["evals"]} \
            if trial["status"] == "done" else None
        if evals is not None:
            assert trial["intermediate"].keys() == evals.keys()
            assert all(abs(trial["intermediate"][k] - v) <= 1e-6 * abs(v) for k, v in evals.items())
    best = min((t for t in trials if t["status"] == "done"), key=lambda t: t["objective"])
    # the grid over the same range in log space: 1e-4, 10**-2.5, 1e-1; its middle point
    middle = tmp_path / "middle"
    overrides = [a for a in SMALL if a != "--set"] + [f"{LR}={10 ** -2.5!r}"]
    assert run_experiment(QUICKSTART, run_dir=str(middle), overrides=overrides, quiet=True).exit_code == 0
    assert best["objective"] <= _results(middle)["eval"]["y1"]["loss"]


@pytest.mark.slow
def test_ray_backend_equals_the_local_backend(tmp_path):
    pytest.importorskip("ray")
    config = _write(tmp_path, TINY)
    args = [config, "--grid", f"{LR}=0.01,0.1", "--jobs", "2"]
    local = _sweep(*args, "--sweep-dir", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-3000:]
    remote = _sweep(*args, "--backend", "ray", "--ray-cpus", "2", "--sweep-dir", str(tmp_path / "ray"),
                    timeout=900)
    assert remote.returncode == 0, remote.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "sweep.json").read_text()) for d in ("local", "ray"))
    assert a == b and [t["status"] for t in a["trials"]] == ["done", "done"]
    for trial in a["trials"]:
        assert _results(tmp_path / "local" / trial["run_dir"]) == _results(tmp_path / "ray" / trial["run_dir"])
