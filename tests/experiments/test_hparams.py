"""Every run logs its hyperparameters and final metrics for TensorBoard's HParams dashboard;
a real TensorBoard server lists a sweep's trials with them."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
import yaml
from test_tensorboard_server import _get, _tensorboard, _wait_until

from multihead.experiments.run.experiment import run_experiment
from multihead.monitoring.report import read_scalars
from multihead.experiments.config.schema import from_dict
from multihead.experiments.run.hparams import final_metrics, run_hparams, write_experiment
from multihead.experiments.sweep.sweep import Sweep, SweepObjective, new_index

LR = "model.heads.y1.optimizer.config.learning_rate"
TINY = {
    "seed": 0,
    "data": {"kind": "mmoe", "train_size": 128, "eval_size": 32, "input_dim": 6},
    "model": {
        "trunk": {"mlp": {"units": [4]}},
        "heads": {
            "y1": {"layers": {"class_name": "Dense", "config": {"units": 1}}, "metrics": ["mae"],
                   "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}}},
            "y2": {"layers": {"class_name": "Dense", "config": {"units": 1}}, "optimizer": "sgd",
                   "weight": 0.5},
        },
    },
    "train": {"steps": 4, "batch_size": 32},
    "log": {"every": 2, "histograms_every": 0},
}


def test_run_hparams_are_the_usual_ones_plus_the_overrides():
    aggregated = from_dict({**TINY, "train": {**TINY["train"], "trunk": {"aggregator": "pcgrad",
                                                                        "optimizer": "rmsprop"}}})
    values = run_hparams(aggregated, ["train.batch_size=16", "model.trunk.mlp.units=[8, 8]"])
    assert values["seed"] == "0" and values["task"] == "supervised"  # a seed: its decimal string
    assert values["model.heads.y1.optimizer"] == "Adam" and values[LR] == 0.01
    # an optimizer given by name: Keras' default learning rate (SGD 0.01, RMSprop 0.001)
    assert values["model.heads.y2.optimizer"] == "SGD"
    assert values["model.heads.y2.optimizer.config.learning_rate"] == pytest.approx(0.01)
    assert values["model.heads.y2.weight"] == 0.5
    assert values["train.trunk"] == "aggregated" and values["train.trunk.aggregator"] == "pcgrad"
    assert values["train.trunk.optimizer"] == "RMSprop"
    assert values["train.trunk.optimizer.config.learning_rate"] == pytest.approx(0.001)
    assert values["model.trunk"] == "{mlp: {units: [4]}}" and values["train.schedule"] == "simultaneous"
    assert values["train.batch_size"] == 16  # the override, parsed as --set parses it
    assert values["model.trunk.mlp.units"] == "[8, 8]"  # not a scalar: flow YAML


def test_a_sweep_experiment_shows_the_swept_axes_only(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    write_experiment(str(tmp_path), {"seed": ["0", "1", "0"], LR: [0.1, 0.1, 0.1], "task": ["s"] * 3},
                     ["final/mean_loss"])
    (events,) = tmp_path.glob("events.out.tfevents.*")
    (experiment,) = [metadata.parse_experiment_plugin_data(v.metadata.plugin_data.content)
                     for e in EventFileLoader(str(events)).Load() for v in e.summary.value
                     if v.tag == metadata.EXPERIMENT_TAG]
    assert [(h.name, [v.string_value for v in h.domain_discrete.values]) for h in experiment.hparam_infos] \
        == [("seed", ["0", "1"])]


def test_final_metrics_are_those_of_metrics_json():
    metrics = {"eval": {"a": {"loss": 1.5, "accuracy": 0.25}, "b": {"loss": 0.5}}}
    assert final_metrics(metrics) == {"final/a/loss": 1.5, "final/a/accuracy": 0.25,
                                      "final/b/loss": 0.5, "final/mean_loss": 1.0}  # (1.5 + 0.5) / 2


def _post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_run_writes_its_session_and_final_metrics(tmp_path):
    """The short version of the server test below: the run directory's own event file."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata
    from tensorboard.util import tensor_util

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    run = tmp_path / "run"
    assert run_experiment(str(config),
                          run_dir=str(run), overrides=[f"{LR}=0.05"], quiet=True).exit_code == 0
    assert not list(run.glob("events.out.tfevents.*"))  # no run named "." in TensorBoard
    session, scalars, others = None, {}, set()
    # The session: a run of its own, with no run below it (its metrics would be theirs too).
    assert [p.name for p in (run / "hparams").iterdir() if p.is_dir()] == []
    for events in (run / "hparams").glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(events)).Load():
            for value in event.summary.value:
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    session = metadata.parse_session_start_info_plugin_data(
                        value.metadata.plugin_data.content)
                elif value.tag.startswith("final/"):
                    scalars[value.tag] = (event.step, float(tensor_util.make_ndarray(value.tensor)))
                else:
                    others.add(value.tag)
    # Nothing else: the dashboard's metrics are the final evaluation, which TensorBoard sorts
    # by name and checks the first five of (no diagnostic such as agg_cosine/... before them).
    assert others == set()
    assert session.hparams[LR].number_value == 0.05
    assert session.hparams["model.heads.y2.optimizer"].string_value == "SGD"
    assert session.hparams["seed"].string_value == "0"  # an integer, not TensorBoard's "0.0000"
    metrics = json.loads((run / "metrics.json").read_text())
    expected = final_metrics(metrics)
    assert scalars.keys() == expected.keys()
    for tag, value in expected.items():
        assert scalars[tag][0] == metrics["steps"] and math.isclose(scalars[tag][1], value, rel_tol=1e-6)


@pytest.mark.slow
def test_over_several_runs_the_dashboard_lists_every_run_s_results_first(tmp_path):
    """`tensorboard --logdir runs` over an aggregated run (whose train run writes agg_*
    diagnostics, sorted before final/...) and a per-head run with other heads: the served
    metrics are the final evaluations of both, and the hyperparameters of both."""
    aggregated = {**TINY, "train": {**TINY["train"], "trunk": {"aggregator": "pcgrad"}}}
    one_head = {**TINY, "model": {**TINY["model"], "heads": {"z": TINY["model"]["heads"]["y2"]}},
                "data": {**TINY["data"], "tasks": ["z"]}}
    for name, config in (("agg", aggregated), ("z", one_head)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        assert run_experiment(str(tmp_path / f"{name}.yaml"),
                              run_dir=str(tmp_path / "runs" / name), quiet=True).exit_code == 0
    assert any(t.startswith("agg_cosine/") for t in read_scalars(str(tmp_path / "runs/agg/train")))
    finals = {**final_metrics(json.loads((tmp_path / "runs/agg/metrics.json").read_text())),
              **final_metrics(json.loads((tmp_path / "runs/z/metrics.json").read_text()))}
    with _tensorboard(tmp_path / "runs", tmp_path) as (port, proc, log):
        experiment = _wait_until(port, proc, log, lambda: _post(port, "/data/plugin/hparams/experiment",
                                                               {"experimentName": ""}),
                                 lambda e: len(e.get("metricInfos", [])) == len(finals),
                                 "both runs' metrics")
    # TensorBoard's order (by name): the results of both runs, and nothing else
    assert [m["name"]["tag"] for m in experiment["metricInfos"]] == sorted(finals)
    # Every run's hyperparameters, the one that differs first (TensorBoard's inferred summary)
    names = [h["name"] for h in experiment["hparamInfos"]]
    assert {"train.trunk.aggregator", "model.heads.z.weight", "model.heads.y1.weight"} <= set(names)
    assert names[0] == "train.trunk"


@pytest.mark.slow
def test_tensorboard_hparams_plugin_lists_the_trials_with_hparams_and_metrics(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    sweep_dir = tmp_path / "sweep"
    trials = [{LR: 0.01}, {LR: 0.1}]
    sweep = Sweep(str(sweep_dir), new_index(trials, SweepObjective()))
    for trial in sweep.index["trials"]:  # the runs a sweep's trial processes make, in-process
        assert run_experiment(str(config), run_dir=str(sweep.run_dir(trial)), quiet=True,
                              overrides=[f"{LR}={trial['overrides'][LR]}"]).exit_code == 0
        metrics = json.loads((sweep_dir / trial["run_dir"] / "metrics.json").read_text())
        trial.update(status="done", metrics=metrics["eval"])
    sweep.finish()

    with _tensorboard(sweep_dir, tmp_path) as (port, proc, log):
        experiment = _wait_until(port, proc, log, lambda: _post(port, "/data/plugin/hparams/experiment",
                                                               {"experimentName": ""}),
                                 lambda e: e.get("metricInfos"), "the HParams experiment")
        infos = {h["name"]: h for h in experiment["hparamInfos"]}
        assert infos[LR]["domainDiscrete"] == [0.01, 0.1]
        assert set(infos) == {LR}  # the swept axis; the constant ones are hidden
        tags = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert tags == {"final/y1/loss", "final/y1/mean_absolute_error", "final/y2/loss", "final/mean_loss"}
        groups = _wait_until(
            port, proc, log,
            lambda: _post(port, "/data/plugin/hparams/session_groups", {
                "experimentName": "", "startIndex": 0, "sliceSize": 100,
                "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
                "colParams": [{"hparam": LR}] + [{"metric": {"tag": t, "group": ""}} for t in sorted(tags)]}),
            lambda g: len(g.get("sessionGroups", [])) == 2, "two session groups")["sessionGroups"]
        served = {g["sessions"][0]["name"]: g for g in groups}
        assert sorted(served) == ["trials/t000/hparams", "trials/t001/hparams"]
        # The trials' sessions are their hparams runs; the sweep root holds the experiment
        # summary only (TensorBoard's convention), no scalars for the Scalars tab.
        assert set(_get(port, "/data/plugin/scalars/tags")) == {
            f"trials/t00{i}/{run}" for i in (0, 1) for run in ("train", "eval", "hparams")}
        for trial in sweep.index["trials"]:
            group = served[f"{trial['run_dir']}/hparams"]
            assert group["hparams"][LR] == trial["overrides"][LR]
            assert group["hparams"]["model.heads.y2.weight"] == 0.5
            values = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
            expected = final_metrics({"eval": trial["metrics"]})
            assert values.keys() == expected.keys()
            for tag, value in expected.items():  # float32 summaries of the float64 numbers
                assert math.isclose(values[tag], value, rel_tol=1e-6), tag
            assert {m["trainingStep"] for m in group["metricValues"]} == {4}
