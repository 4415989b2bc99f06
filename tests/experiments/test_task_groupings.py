"""From a run's affinities to grouped runs: `log.affinity_every` in configs, the mean
affinity in `metrics.json` and `report`, `report --groups N --groups-config FILE`, and the
file trained through `multihead sweep`, one run per group on the run's own data."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.run.experiment import load_experiment, run_experiment
from multihead.datasets.multitask import _task_weights
from multihead.experiments.config.schema import ConfigError, apply_override, from_dict
from multihead.monitoring.report import read_scalars
from multihead.experiments.sweep.sweep import load_base, trial_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADS = ("a", "b", "c")
TINY = {
    "seed": 0,
    "data": {"kind": "mmoe", "correlation": 0.8, "clusters": [["a", "b"], ["c"]],
             "train_size": 128, "eval_size": 32, "input_dim": 6},
    "model": {"trunk": {"mlp": {"units": [6]}},
              "heads": {h: {"layers": {"class_name": "Dense", "config": {"units": 1}},
                            "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.02}}}
                        for h in HEADS}},
    "train": {"steps": 8, "batch_size": 32},
    "log": {"every": 4, "histograms_every": 0, "affinity_every": 2},
}


def _write(tmp_path, config, name="tiny.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _with(**sections):
    return {**TINY, **{k: {**TINY.get(k, {}), **v} for k, v in sections.items()}}


@pytest.mark.parametrize("sections, message", [
    ({"log": {"tensorboard": False}}, "log.affinity_every: the affinities are written to "
                                      "TensorBoard, which is off (log.tensorboard: false)"),
    ({"distribute": {"strategy": "mirrored"}}, "log.affinity_every: inter-task affinity is not "
                                               "supported with distribute.strategy mirrored"),
    ({"log": {"affinity_lookahead": "adam"}}, "log.affinity_lookahead: must be one of"),
    ({"train": {"only_heads": ["a", "x"]}}, "train.only_heads: the model has no head 'x'"),
    ({"train": {"only_heads": []}}, "train.only_heads: give at least one head"),
    ({"train": {"only_heads": ["a", "a"]}}, "train.only_heads: a head is named twice"),
    ({"data": {"clusters": [["a"], ["b"]]}}, "data.clusters: tasks ['c'] are in no cluster"),
    ({"data": {"clusters": [["a", "b"], ["b", "c"]]}}, "data.clusters: task 'b' is in two clusters"),
])
def test_bad_settings_name_the_key(sections, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        from_dict(_with(**sections))


def test_clusters_make_tasks_correlated_within_and_orthogonal_across():
    rng = np.random.default_rng(0)
    w = _task_weights(5, 12, 0.7, 2.0, rng, clusters=[[0, 3], [1, 2, 4]])
    cosines = (w @ w.T) / 4.0  # scale 2: every norm is 2
    expected = np.eye(5)
    for members in ([0, 3], [1, 2, 4]):
        for i in members:
            for j in members:
                expected[i, j] = 1.0 if i == j else 0.7
    np.testing.assert_allclose(cosines, expected, atol=1e-12)


def _sweep(*args, timeout=900):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "multihead", "sweep", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("trained", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["written", "swept"])
def test_report_groups_writes_a_sweep_of_one_run_per_group(tmp_path, capsys, trained):
    """By default the written sweep's trials are read back as `multihead sweep` reads them;
    with -m slow they are also trained through `multihead sweep` (a sweep process and a
    trial process per group)."""
    config = _write(tmp_path, TINY)
    run = tmp_path / "run"
    assert run_experiment(str(config), run_dir=str(run), quiet=True).exit_code == 0
    # metrics.json: the mean of each logged affinity/<i>/<j> over the run
    logged = read_scalars(str(run / "train"))
    metrics = json.loads((run / "metrics.json").read_text())
    for i in HEADS:
        for j in HEADS:
            series = logged[f"affinity/{i}/{j}"]
            assert list(series.steps) == [1, 2, 4, 6, 8]
            assert metrics["affinity"][i][j] == pytest.approx(float(np.mean(series.values)))
    capsys.readouterr()
    groups = tmp_path / "groups.yaml"
    assert main(["report", str(run), "--groups", "2", "--groups-config", str(groups)]) == 0
    out = capsys.readouterr().out
    assert "inter-task affinity of the row's update onto the column's loss" in out
    assert "task groupings: at most 2 groups" in out and f"wrote {groups}" in out
    assert main(["report", str(run), "--groups", "2", "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["affinity"] == metrics["affinity"]
    proposed = [g["heads"] for g in tree["groupings"]["groups"]]
    assert sorted(h for g in proposed for h in g) == sorted(HEADS) and len(proposed) <= 2
    written = yaml.safe_load(groups.read_text())
    assert written["sweep"] == {"grid": {"train.only_heads": proposed}}
    assert written["log"]["affinity_every"] == 0 and written["train"]["only_heads"] is None
    base, spec = load_base(str(groups), [])
    assert trial_overrides(spec) == [{"train.only_heads": g} for g in proposed]
    for group in proposed:  # each trial's config, as `train` loads it: the group alone
        raw = copy.deepcopy(base)
        apply_override(raw, f"train.only_heads={json.dumps(group)}")
        trial = _write(tmp_path, raw, name="trial.yaml")
        assert list(load_experiment(trial).model.heads) == group
    if not trained:
        return

    done = _sweep(str(groups), "--sweep-dir", str(tmp_path / "sweep"), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    index = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [t["overrides"] for t in index["trials"]] == [{"train.only_heads": g} for g in proposed]
    for trial, group in zip(index["trials"], proposed):
        trial_metrics = json.loads((tmp_path / "sweep" / "trials" / trial["id"] / "metrics.json")
                                   .read_text())
        assert list(trial_metrics["eval"]) == group
        for head in group:  # the same generated data as the all-heads run
            assert trial_metrics["baseline"][head] == metrics["baseline"][head]


def test_only_head_takes_a_set_of_heads(tmp_path):
    config = _write(tmp_path, _with(log={"affinity_every": 0}))
    run = tmp_path / "ab"
    assert run_experiment(str(config), run_dir=str(run), only_head="a,b", quiet=True).exit_code == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert list(saved["model"]["heads"]) == ["a", "b"] and saved["train"]["only_heads"] == ["a", "b"]
    assert saved["data"]["tasks"] == list(HEADS)  # the task list decides the generated data


def test_report_groups_without_affinities_exits_2(tmp_path, capsys):
    config = _write(tmp_path, _with(log={"affinity_every": 0}))
    assert run_experiment(str(config), run_dir=str(tmp_path / "run"), quiet=True).exit_code == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run"), "--groups", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no affinity/<i>/<j> scalars" in err
    assert main(["report", str(tmp_path / "run"), "--groups-config", "x.yaml"]) == 2
