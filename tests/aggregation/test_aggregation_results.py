"""benchmarks/aggregation_results.py: the results table of docs/aggregation.md.

The table's per-head means and Δm% are checked against plain numpy on the runs'
metrics.json files (independent of multihead.experiments.results.compare, which the script uses).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def results_script():
    spec = importlib.util.spec_from_file_location(
        "aggregation_results", os.path.join(ROOT, "benchmarks", "aggregation_results.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _final(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as fh:
        return json.load(fh)["eval"]


def test_table_delta_m_equals_numpy_on_the_runs_metrics(results_script, tmp_path):
    out = str(tmp_path / "out")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = results_script.main([
            "--dataset", "synthetic", "--methods", "per_head,mean", "--seeds", "1", "--steps", "20",
            "--set", "data.train_size=256", "--set", "data.eval_size=64", "--out", out])
    assert code == 0
    table = stdout.getvalue()
    with open(os.path.join(out, "results-synthetic.json"), encoding="utf-8") as fh:
        summary = json.load(fh)["synthetic"]
    root = os.path.join(out, "synthetic")
    # Single-task baselines: each head trained alone; its eval loss (the MSE) is B_i.
    base = {h: _final(os.path.join(root, f"single-{h}", "seed0"))[h]["loss"] for h in ("y1", "y2")}
    assert set(_final(os.path.join(root, "single-y1", "seed0"))) == {"y1"}  # really one head
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert f"{base['y1']:.4f}" in rows["single-task"] and f"{base['y2']:.4f}" in rows["single-task"]
    expected_dm = {}
    for method in ("per_head", "mean"):
        final = _final(os.path.join(root, method, "seed0"))
        m = np.array([final["y1"]["loss"], final["y2"]["loss"]])
        b = np.array([base["y1"], base["y2"]])
        expected = 100.0 * np.mean((m - b) / b)  # MSE: lower is better, sign +1
        expected_dm[method] = expected
        entry = summary["methods"][method]
        assert entry["delta_m"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert entry["delta_m_per_seed"]["0"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert entry["mean"] == pytest.approx({"y1": m[0], "y2": m[1]}, rel=1e-12)
        cells = [c.strip() for c in rows[method].split("|")[1:-1]]
        assert cells[1].startswith(f"{m[0]:.4f} ± ") and cells[2].startswith(f"{m[1]:.4f} ± ")
        assert cells[3] == f"{expected:+.2f}" and cells[4] == f"{expected:+.2f} ± 0.00"
    # The paired column: mean's Δm% minus per_head's on the same seed.
    paired = expected_dm["mean"] - expected_dm["per_head"]
    assert summary["methods"]["mean"]["vs_per_head"]["mean"] == pytest.approx(paired, rel=1e-9, abs=1e-9)
    assert rows["mean"].split("|")[-2].strip() == f"{paired:+.2f} ± 0.00"
    assert "vs_per_head" not in summary["methods"]["per_head"]
    # The two methods trained differently: the table is not one run printed twice.
    assert summary["methods"]["per_head"]["mean"] != summary["methods"]["mean"]["mean"]


def test_every_registered_method_makes_a_valid_config(results_script):
    """A method added to the registries that needs an option fails here, not an hour into a run."""
    from multihead.step.trunk_policy import TRUNK_AGGREGATORS
    from multihead.experiments.config.schema import load_config

    methods = results_script.all_methods()
    assert methods == ["per_head", *TRUNK_AGGREGATORS]
    for name, dataset in results_script.DATASETS.items():
        path = os.path.join(ROOT, dataset.config)
        heads = list(load_config(path).model.heads)
        for method in methods:
            config = load_config(path, results_script.method_overrides(method, len(heads)))
            trunk = config.train.trunk
            assert (trunk == "per_head") if method == "per_head" else trunk.aggregator == method, name


def test_a_failed_method_is_a_row_that_says_why(results_script):
    """A method whose every seed failed is listed with its error, not dropped from the table."""
    error = "FloatingPointError: the loss of head 'y1' became nan at step 7"
    summary = {"config": "experiments/aggregation_per_head.yaml", "metric": "loss", "heads": ["y1", "y2"],
               "seeds": [0], "baseline": {"y1": {"mean": 1.0, "std": 0.0, "n": 1},
                                          "y2": {"mean": 2.0, "std": 0.0, "n": 1}},
               "methods": {"pcgrad": {"errors": {"0": error}, "runs": []}}}
    table = results_script.markdown(summary, "synthetic", 20)
    (row,) = [line for line in table.splitlines() if line.startswith("| pcgrad ")]
    assert row == f"| pcgrad | - | - | failed: {error} | | |"


def test_a_run_claimed_by_a_live_process_is_left_to_it(results_script, tmp_path):
    """Two invocations on one --out never train the same run; a dead process's claim is taken over."""
    import subprocess

    run_dir = str(tmp_path / "synthetic" / "sum" / "seed0")
    os.makedirs(os.path.dirname(run_dir))
    with open(run_dir + ".lock", "w") as fh:
        fh.write(str(os.getppid()))  # a live process other than this one
    assert results_script.run_one("unused.yaml", run_dir, []) == results_script.BUSY
    assert not os.path.exists(run_dir)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(run_dir + ".lock", "w") as fh:
        fh.write(dead)
    assert results_script._lock(run_dir)
    with open(run_dir + ".lock") as fh:
        assert fh.read() == str(os.getpid())
