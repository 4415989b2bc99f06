"""The config side of `fit` callbacks, loss-weight schedules and non-finite policies.

`callbacks:` keys are validated at load (one line naming the key path); `multihead train`
runs them and writes what stopped the run to metrics.json. The run's facts are checked
against an independent reading of its TensorBoard events, not against metrics.json alone.
"""

import contextlib
import copy
import io
import json
import math
import os
import pathlib
import re

import numpy as np
import pytest
import yaml

import multihead as mh
from multihead.experiments.run import runner as tasks
from multihead.experiments.build.builders import build_callbacks, build_objectives, build_trainer
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError, apply_override, from_dict, load_config

BASE = {
    "seed": 0,
    "data": {"kind": "mmoe", "train_size": 2000, "eval_size": 500},
    "model": {"trunk": {"mlp": {"units": [16]}},
              "heads": {"y1": {"layers": [{"class_name": "Dense", "config": {"units": 1}}],
                               "metrics": ["mae"]},
                        "y2": {"layers": [{"class_name": "Dense", "config": {"units": 1}}]}}},
    "train": {"steps": 400, "batch_size": 64, "eval_every": 25},
    "log": {"every": 10, "histograms_every": 0},
}

#: `ExponentialDecay`: weight(s) = 1.0 * 0.5 ** (s / 100) at step s.
SCHEDULE = {"class_name": "ExponentialDecay",
            "config": {"initial_learning_rate": 1.0, "decay_steps": 100, "decay_rate": 0.5}}


def _raw(*overrides):
    raw = copy.deepcopy(BASE)
    for assignment in overrides:
        apply_override(raw, assignment)
    return raw


def _write(tmp_path, raw, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


# -- load-time validation --------------------------------------------------------------------


@pytest.mark.parametrize("override,message", [
    ("callbacks.erly_stopping={}", "callbacks.erly_stopping: unknown key (did you mean 'early_stopping'?)"),
    ("callbacks.early_stopping={patiense: 2}",
     "callbacks.early_stopping.patiense: unknown key (did you mean 'patience'?)"),
    ("callbacks.early_stopping={patience: 0}", "callbacks.early_stopping.patience: must be >= 1, got 0"),
    ("callbacks.early_stopping={mode: minn}",
     "callbacks.early_stopping.mode: must be one of ['auto', 'min', 'max'], got 'minn' (did you mean 'min'?)"),
    ("callbacks.early_stopping={restore_best: 1}", "callbacks.early_stopping.restore_best: expected true or false"),
    ("callbacks.early_stopping={monitor: val_loss}",
     "callbacks.early_stopping.monitor: must be eval/<head>/<metric> or eval/mean_loss, got 'val_loss'"),
    ("callbacks.early_stopping={monitor: eval/y3/loss}",
     "callbacks.early_stopping.monitor: the model has no head 'y3'"),
    ("callbacks.early_stopping={monitor: eval/y1/mea}",
     "callbacks.early_stopping.monitor: the evaluation of head 'y1' has no metric 'mea' (did you mean 'mae'?)"),
    ("callbacks.best_checkpoint={monitor: eval/y2/mae}",
     "callbacks.best_checkpoint.monitor: the evaluation of head 'y2' has no metric 'mae'"),
    ("callbacks.best_checkpoint={min_delta: -1}", "callbacks.best_checkpoint.min_delta: must be >= 0, got -1"),
    ("callbacks.reduce_lr_on_plateau={y3: {factor: 0.5}}",
     "callbacks.reduce_lr_on_plateau.y3: the model has no head 'y3'"),
    ("callbacks.reduce_lr_on_plateau=[{head: y22}]",
     "callbacks.reduce_lr_on_plateau[0].head: the model has no head 'y22' (did you mean 'y2'?)"),
    ("callbacks.reduce_lr_on_plateau=[{factor: 0.5}]",
     "callbacks.reduce_lr_on_plateau[0].head: required key is missing"),
    ("callbacks.reduce_lr_on_plateau=[{head: y1, factor: 1.5}]",
     "callbacks.reduce_lr_on_plateau[0].factor: must be in (0, 1), got 1.5"),
    ("callbacks.reduce_lr_on_plateau=[{head: y1}, {head: y1}]",
     "callbacks.reduce_lr_on_plateau[1].head: head 'y1' already has an entry at "
     "callbacks.reduce_lr_on_plateau[0]"),
    ("callbacks.reduce_lr_on_plateau={y1: {pateince: 1}}",
     "callbacks.reduce_lr_on_plateau.y1.pateince: unknown key (did you mean 'patience'?)"),
    ("callbacks.reduce_lr_on_plateau=3", "callbacks.reduce_lr_on_plateau: expected a list"),
    ("model.heads.y1.weight={class_name: ExponentialDecy, config: {}}",
     "model.heads.y1.weight.class_name: must be one of"),
    ("model.heads.y1.weight={class_name: ExponentialDecy, config: {}}", "(did you mean 'ExponentialDecay'?)"),
    ("model.heads.y1.weight={class_name: ExponentialDecay, config: {initial_learning_rate: 1.0}}",
     "model.heads.y1.weight.config: cannot build ExponentialDecay"),
    ("model.heads.y1.weight={config: {}}", "model.heads.y1.weight.class_name: required key is missing"),
    ("model.heads.y1.weight=-1", "model.heads.y1.weight: must be >= 0, got -1"),
    ("model.heads.y1.weight=heavy", "model.heads.y1.weight: expected a number, got 'heavy' (str)"),
    ("model.heads.y1.on_nonfinite=skp", "model.heads.y1.on_nonfinite: must be one of ['skip', 'raise', "
                                        "'apply'], got 'skp' (did you mean 'skip'?)"),
    ("train.max_nonfinite_steps=0", "train.max_nonfinite_steps: must be >= 1, got 0"),
])
def test_bad_values_are_one_line_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        from_dict(_raw(override), "x.yaml")
    text = str(err.value)
    assert text.startswith("x.yaml: ") and message in text and "\n" not in text


def test_callbacks_that_act_at_evaluations_need_eval_every():
    raw = _raw("train.eval_every=null", "callbacks.early_stopping={}")
    with pytest.raises(ConfigError, match="callbacks.early_stopping: acts at evaluations, but "
                                          "train.eval_every is not set"):
        from_dict(raw)
    raw = _raw("train.eval_every=null", "callbacks.best_checkpoint={}")
    assert from_dict(raw).callbacks.best_checkpoint.monitor == "eval/mean_loss"  # the final eval


def test_callbacks_are_for_the_supervised_task():
    raw = _raw("task=dqn", "callbacks.early_stopping={}")
    with pytest.raises(ConfigError, match="callbacks.early_stopping: only used with task supervised"):
        from_dict(raw)


def test_monitors_resolve_to_the_names_the_evaluation_reports():
    config = from_dict(_raw("callbacks.early_stopping={monitor: eval/y1/mae}",
                            "callbacks.best_checkpoint={monitor: eval/y1/loss}",
                            "callbacks.reduce_lr_on_plateau={y2: null, y1: {monitor: eval/y1/mae}}"))
    cbs = config.callbacks
    assert cbs.early_stopping.monitor == "eval/y1/mean_absolute_error"
    assert cbs.best_checkpoint.monitor == "eval/y1/loss"
    assert [(e.head, e.monitor) for e in cbs.reduce_lr_on_plateau] == [
        ("y2", "eval/y2/loss"), ("y1", "eval/y1/mean_absolute_error")]  # default: the head's loss


def test_mode_auto_needs_a_metric_with_a_known_direction():
    raw = _raw("model.heads.y1.metrics=[{class_name: CosineSimilarity, config: {name: cos}}]",
               "callbacks.early_stopping={monitor: eval/y1/cos}")
    with pytest.raises(ConfigError, match="callbacks.early_stopping.mode: mode='auto' cannot tell"):
        from_dict(raw)
    apply_override(raw, "callbacks.early_stopping.mode=max")
    assert from_dict(raw).callbacks.early_stopping.mode == "max"


def test_list_and_mapping_forms_of_reduce_lr_on_plateau_are_the_same():
    as_list = from_dict(_raw("callbacks.reduce_lr_on_plateau=[{head: y1, factor: 0.5, patience: 1}]"))
    as_map = from_dict(_raw("callbacks.reduce_lr_on_plateau={y1: {factor: 0.5, patience: 1}}"))
    assert as_list.callbacks == as_map.callbacks


def test_builders_pass_the_config_to_the_library_objects():
    config = from_dict(_raw(
        f"model.heads.y1.weight={json.dumps(SCHEDULE)}", "model.heads.y2.weight=0.25",
        "model.heads.y1.on_nonfinite=raise", "train.max_nonfinite_steps=4",
        "callbacks.early_stopping={monitor: eval/y2/loss, patience: 2, min_delta: 0.01}",
        "callbacks.reduce_lr_on_plateau={y1: {factor: 0.5, min_lr: 1e-5}}"))
    objectives = build_objectives(config)
    weight = objectives["y1"].weight
    # 1.0 * 0.5 ** (150 / 100) = 0.35355...
    assert float(weight(150)) == pytest.approx(0.5 ** 1.5, rel=1e-6)
    assert objectives["y2"].weight == 0.25 and objectives["y2"].on_nonfinite == "skip"
    assert objectives["y1"].on_nonfinite == "raise"
    cbs = build_callbacks(config, best_dir=None)
    assert isinstance(cbs.early_stopping, mh.EarlyStopping) and cbs.best_checkpoint is None
    assert (cbs.early_stopping.quantity.name, cbs.early_stopping.patience,
            cbs.early_stopping.min_delta) == ("eval/y2/loss", 2, 0.01)
    (plateau,) = cbs.reduce_lr_on_plateau
    assert (plateau.head, plateau.factor, plateau.min_lr) == ("y1", 0.5, 1e-5)
    runner = tasks.prepare(config)
    trainer = build_trainer(config, runner.model, runner.objectives, None)
    y = dict(runner.data.y_train)
    y["y2"] = np.full_like(y["y2"], np.nan)  # y2 skips its updates, then the run stops
    with pytest.raises(FloatingPointError, match="head 'y2'.* for 4 consecutive steps"):
        trainer.fit((runner.data.x_train, y), 20, batch_size=64, verbose=False)


def test_reduce_lr_on_plateau_refuses_a_learning_rate_schedule():
    opt = {"class_name": "Adam", "config": {"learning_rate": {
        "module": "keras.optimizers.schedules", **SCHEDULE}}}
    config = from_dict(_raw(f"model.heads.y1.optimizer={json.dumps(opt)}",
                            "callbacks.reduce_lr_on_plateau=[{head: y1}]"))
    with pytest.raises(ConfigError, match=r"callbacks.reduce_lr_on_plateau\[0\].head: the optimizer of "
                                          "head 'y1' has a learning-rate schedule"):
        tasks.prepare(config)


@pytest.mark.parametrize("command", ["train", "validate"])
@pytest.mark.parametrize("override,message", [
    ("callbacks.early_stopping={monitor: eval/y1/mea}", "callbacks.early_stopping.monitor"),
    ("callbacks.reduce_lr_on_plateau={y3: {}}", "callbacks.reduce_lr_on_plateau.y3"),
    ("model.heads.y1.weight={class_name: ExponentialDecy, config: {}}", "model.heads.y1.weight.class_name"),
])
def test_bad_callback_config_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, command,
                                                                     override, message):
    config = _write(tmp_path, BASE)
    run_dir = tmp_path / "run"
    args = [command, config, "--set", override] + (["--run-dir", str(run_dir)] if command == "train"
                                                    else ["--build"])
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multihead: error: ") and len(err.splitlines()) == 1
    assert message in err and config in err
    assert not run_dir.exists()


# -- runs -------------------------------------------------------------------------------------


def _eval_history(run_dir, tag):
    """`[(step, value)]` of an eval tag, read from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import tensorflow as tf

    events = EventAccumulator(os.path.join(run_dir, "eval"), size_guidance={"tensors": 0})
    events.Reload()
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]


def _train_scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import tensorflow as tf

    events = EventAccumulator(os.path.join(run_dir, "train"), size_guidance={"tensors": 0})
    events.Reload()
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One short run with early stopping on y2, the best checkpoint of y1 and a weight schedule
    on y1 (y2's high learning rate makes its eval loss stall early)."""
    tmp = tmp_path_factory.mktemp("callbacks")
    raw = _raw(f"model.heads.y1.weight={json.dumps(SCHEDULE)}",
               "model.heads.y1.optimizer={class_name: Adam, config: {learning_rate: 0.01}}",
               "model.heads.y2.optimizer={class_name: Adam, config: {learning_rate: 0.05}}",
               "callbacks.early_stopping={monitor: eval/y2/loss, patience: 3, min_delta: 0.01}",
               "train.eval_every=10", "callbacks.best_checkpoint={monitor: eval/y1/loss}")
    config = _write(tmp, raw)
    run_dir = str(tmp / "run")
    with contextlib.redirect_stderr(io.StringIO()) as err:  # the progress and stop lines
        assert run_experiment(config, run_dir=run_dir).exit_code == 0
    (tmp / "stderr.txt").write_text(err.getvalue())
    with open(os.path.join(run_dir, "metrics.json")) as fh:
        metrics = json.load(fh)
    return config, run_dir, metrics


def test_early_stopping_stops_where_the_eval_history_says(run):
    _, run_dir, metrics = run
    history = _eval_history(run_dir, "loss/y2")
    assert [s for s, _ in history] == list(range(10, metrics["steps"] + 1, 10))
    # The rule by hand: an evaluation improves if it is below the best by more than 0.01;
    # the run stops at the 3rd evaluation in a row that does not.
    best, best_step, wait, expected = math.inf, None, 0, None
    for step, value in history:
        if value < best - 0.01:
            best, best_step, wait = value, step, 0
        else:
            wait += 1
            if wait == 3:
                expected = step
                break
    assert expected is not None and expected < 400, "the run was expected to stop early"
    assert metrics["steps"] == expected
    assert metrics["stopped"]["step"] == expected
    assert metrics["stopped"]["reason"].startswith("EarlyStopping: eval/y2/loss did not improve")
    stop = metrics["early_stopping"]
    assert stop["best_step"] == best_step and stop["stopped_step"] == expected
    assert stop["best_value"] == pytest.approx(best, rel=1e-6)  # TensorBoard holds float32
    assert [e["step"] for e in metrics["evals"]] == [s for s, _ in history]
    # The best weights were restored, so the run's final eval is the best step's eval.
    assert stop["restored_best"] and metrics["eval"] == dict(
        (e["step"], e["eval"]) for e in metrics["evals"])[best_step]


def test_an_early_stop_prints_one_line_and_records_it_in_status_json(run):
    _, run_dir, metrics = run
    history = _eval_history(run_dir, "loss/y2")
    stop = metrics["early_stopping"]
    best_step, best = min(((s, v) for s, v in history if s <= stop["stopped_step"]),
                          key=lambda sv: sv[1])
    with open(os.path.join(os.path.dirname(run_dir), "stderr.txt")) as fh:
        lines = [line for line in fh.read().splitlines() if line.startswith("EarlyStopping")]
    assert len(lines) == 1
    pattern = (r"EarlyStopping: eval/y2/loss did not improve by more than 0\.01 for 3 "
               r"evaluation\(s\) \(best (\S+) at step (\d+)\); stopped at step (\d+); "
               r"restored the weights of step (\d+)")
    found = re.fullmatch(pattern, lines[0])
    assert found, lines[0]
    assert float(found[1]) == pytest.approx(best, rel=1e-5)  # printed to 6 digits
    assert [int(found[i]) for i in (2, 3, 4)] == [best_step, metrics["steps"], best_step]
    with open(os.path.join(run_dir, "status.json")) as fh:
        status = json.load(fh)
    assert status["stopped"] == {"reason": lines[0], "step": metrics["steps"]} == metrics["stopped"]


def test_best_checkpoint_restores_the_best_eval_into_a_fresh_model(run):
    config, run_dir, metrics = run
    history = _eval_history(run_dir, "loss/y1")
    best_step, best_value = min(history, key=lambda sv: sv[1])
    record = metrics["best_checkpoint"]
    assert record["step"] == best_step and record["value"] == pytest.approx(best_value, rel=1e-6)
    assert record["path"] == f"best/best-{best_step}"
    assert set(os.listdir(os.path.join(run_dir, "best"))) == {
        "best.json", f"best-{best_step}.data-00000-of-00001", f"best-{best_step}.index"}
    # Not the weights the run ends with: early stopping restored those of y2's best step.
    assert best_step != metrics["early_stopping"]["best_step"]
    fresh = tasks.prepare(load_config(config))  # same architecture and data, untrained
    mh.restore_checkpoint(os.path.join(run_dir, record["path"]), fresh.model,
                          parts=["trunk", "heads/y1", "heads/y2"])
    trainer = mh.Trainer(fresh.model, fresh.objectives)
    evaluated = trainer.evaluate(fresh.data.eval, batch_size=64)
    assert evaluated["y1"]["loss"] == record["value"]
    assert evaluated["y1"]["loss"] != metrics["eval"]["y1"]["loss"]


def test_a_weight_schedule_in_a_config_trains(run):
    _, run_dir, metrics = run
    logged = _train_scalars(run_dir, "loss_weight/y1")
    assert len(logged) >= 3
    # ExponentialDecay: 0.5 ** (counter / 100), the weight of the update the step counter
    # `counter` takes; it is logged at the number of updates done, counter + 1.
    for step, value in logged:
        assert value == pytest.approx(0.5 ** ((step - 1) / 100), rel=1e-6), step
    assert all(v == 1.0 for _, v in _train_scalars(run_dir, "loss_weight/y2"))
    assert all(np.isfinite(h["loss"]) for h in metrics["train"].values())
    first, last = metrics["evals"][0]["eval"]["y1"]["loss"], \
        min(e["eval"]["y1"]["loss"] for e in metrics["evals"])
    assert last < first  # the weighted head learns


def test_a_run_without_callbacks_records_no_stop(tmp_path):
    config = _write(tmp_path, _raw("train.steps=30", "train.eval_every=null"))
    run_dir = tmp_path / "run"
    assert run_experiment(config, run_dir=str(run_dir), quiet=True).exit_code == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["stopped"] is None and metrics["steps"] == 30
    assert "early_stopping" not in metrics and not (run_dir / "best").exists()
    assert [e["step"] for e in metrics["evals"]] == [30]


# -- per-head early stopping and best checkpoints -------------------------------------------


HEAD_STOP = ("model.heads.y1.optimizer={class_name: Adam, config: {learning_rate: 0.01}}",
             "model.heads.y2.optimizer={class_name: Adam, config: {learning_rate: 0.05}}",
             "callbacks.early_stopping={per_head: true, patience: 3, min_delta: 0.01}",
             "callbacks.best_checkpoint={per_head: true}", "train.eval_every=10",
             "checkpoint.every=10")


def _run_json(run_dir, name):
    with open(os.path.join(run_dir, name)) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def head_runs(tmp_path_factory):
    """A run with per-head early stopping and best checkpoints, and the same run stopped
    after its first head froze, then --resume'd."""
    tmp = tmp_path_factory.mktemp("heads")
    config = _write(tmp, _raw(*HEAD_STOP))
    full = str(tmp / "full")
    with contextlib.redirect_stderr(io.StringIO()) as err, \
            contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["train", config, "--run-dir", full]) == 0  # its end table: a CLI fact
    (tmp / "full.stdout").write_text(out.getvalue())
    metrics = _run_json(full, "metrics.json")
    first = min(w["stopped_step"] for w in metrics["head_early_stopping"].values()
                if w["stopped_step"] is not None)
    part = str(tmp / "part")
    assert run_experiment(config, run_dir=part, overrides=[f"train.steps={first + 10}"],
                          quiet=True).exit_code == 0
    assert run_experiment(config, resume=part, quiet=True).exit_code == 0
    return config, full, part, err.getvalue()


def test_per_head_early_stopping_freezes_each_head_where_its_eval_history_says(head_runs):
    _, full, _, stderr = head_runs
    metrics = _run_json(full, "metrics.json")
    stops = {}
    for head in ("y1", "y2"):
        history = _eval_history(full, f"loss/{head}")
        best, best_step, wait, stopped = math.inf, None, 0, None
        for step, value in history:  # the rule by hand, on TensorBoard's record
            if stopped is not None:
                break
            if value < best - 0.01:
                best, best_step, wait = value, step, 0
            else:
                wait += 1
                stopped = step if wait == 3 else None
        record = metrics["head_early_stopping"][head]
        assert (record["best_step"], record["stopped_step"]) == (best_step, stopped)
        assert record["best_value"] == pytest.approx(best, rel=1e-6)
        stops[head] = stopped
        if stopped is not None:
            line = next(l for l in stderr.splitlines() if l.startswith(f"HeadEarlyStopping: eval/{head}/"))
            assert line == record["reason"] == (
                f"HeadEarlyStopping: eval/{head}/loss did not improve by more than 0.01 for 3 "
                f"evaluation(s) (best {record['best_value']:.6g} at step {best_step}); froze head "
                f"{head!r} at step {stopped}; weights not restored")
    assert any(s is not None for s in stops.values()), "a head was expected to stop"
    status = _run_json(full, "status.json")
    assert status["stopped_heads"] == {h: {"step": s, "reason": metrics["head_early_stopping"][h]["reason"]}
                                       for h, s in stops.items() if s is not None}
    if all(s is not None for s in stops.values()):
        assert metrics["steps"] == max(stops.values())


def test_per_head_stopping_survives_resume(head_runs):
    _, full, part, _ = head_runs
    a, b = _run_json(full, "metrics.json"), _run_json(part, "metrics.json")
    for key in ("steps", "eval", "head_early_stopping", "head_best_checkpoints", "stopped"):
        assert a[key] == b[key], key
    assert _run_json(full, "status.json")["stopped_heads"] == _run_json(part, "status.json")["stopped_heads"]


def test_each_heads_best_checkpoint_restores_its_best_eval_exactly(head_runs):
    config, full, _, _ = head_runs
    metrics = _run_json(full, "metrics.json")
    data = tasks.prepare(load_config(config)).data
    for head in ("y1", "y2"):
        record = metrics["head_best_checkpoints"][head]
        best_step, best = min(_eval_history(full, f"loss/{head}"), key=lambda sv: sv[1])
        assert record["step"] == best_step and record["value"] == pytest.approx(best, rel=1e-6)
        assert record["path"] == f"best/{head}/best-{best_step}"
        run = mh.load_run(full, best=head, trainer=True)
        assert run.checkpoint == os.path.join(full, record["path"])
        evaluated = run.trainer.evaluate(data.eval, batch_size=64)
        assert evaluated[head]["loss"] == record["value"]


def _best_rows(text):
    """{head: cells} of the per-head bests table in a summary's text."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("per head: the best"))
    rows = {}
    for line in lines[start + 2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != 7:
            break
        rows[cells[0]] = cells
    return rows


def test_every_summary_shows_each_heads_best_freeze_and_checkpoint(head_runs, capsys):
    """The end table, `report` and `compare` show per head the best evaluation (equal to the
    best of its eval history and to its best checkpoint's record), when it froze, and where
    its best checkpoint is; a head whose final weights are not its best is named."""
    from multihead.experiments.results.compare import compare
    from multihead.monitoring.report import format_report, load_report, report_to_dict

    _, full, _, _ = head_runs
    metrics = _run_json(full, "metrics.json")
    expected = {}
    for head in ("y1", "y2"):
        stop, best = metrics["head_early_stopping"][head], metrics["head_best_checkpoints"][head]
        history = dict(_eval_history(full, f"loss/{head}"))
        step = min(history, key=history.get)
        assert best["step"] == step and best["value"] == pytest.approx(history[step], rel=1e-6)
        expected[head] = (stop["best_value"], stop["best_step"], stop["stopped_step"],
                          metrics["eval"][head]["loss"], best["path"])
    behind = [h for h, (value, _, _, final, _) in expected.items() if final != value]
    assert behind, "the run was expected to end away from a head's best"

    texts = {"end table": (pathlib.Path(full).parent / "full.stdout").read_text(),
             "report": format_report(load_report(full)),
             "compare": compare([full]).format()}
    for where, text in texts.items():
        rows = _best_rows(text)
        assert set(rows) == {"y1", "y2"}, where
        for head, (value, step, frozen, final, path) in expected.items():
            _, monitor, shown, at, frozen_at, shown_final, checkpoint = rows[head]
            assert monitor == f"eval/{head}/loss" and checkpoint == path, where
            assert float(shown) == pytest.approx(value, rel=1e-3) and int(at) == step, where
            assert frozen_at == (str(frozen) if frozen is not None else "no"), where
            assert float(shown_final) == pytest.approx(final, rel=1e-3), where
        assert f"the final model is not the best for: {', '.join(behind)}" in text, where
    as_json = {"report": report_to_dict(load_report(full))["head_bests"],
               "compare": compare([full]).to_dict()["runs"][0]["head_bests"]}
    for where, bests in as_json.items():
        for head, (value, step, frozen, final, path) in expected.items():
            assert (bests[head]["best_value"], bests[head]["best_step"], bests[head]["frozen_step"],
                    bests[head]["final_value"], bests[head]["checkpoint"]) == \
                (value, step, frozen, final, path), where
            assert bests[head]["final_is_best"] == (head not in behind), where


def test_restore_heads_ends_with_each_heads_layers_from_its_best_and_the_final_trunk(
        head_runs, tmp_path):
    config, full, _, _ = head_runs
    restored = str(tmp_path / "restored")
    assert run_experiment(config, run_dir=restored, quiet=True, overrides=[
        "callbacks.best_checkpoint={per_head: true, restore_heads: true}"]).exit_code == 0
    metrics = _run_json(restored, "metrics.json")
    paths = {h: b["path"] for h, b in _run_json(full, "metrics.json")["head_best_checkpoints"].items()}
    assert metrics["restored_heads"] == paths
    model = mh.load_run(restored).model
    same_trunk = mh.load_run(full).model.trunk  # the same run without the restore
    for a, b in zip(model.trunk.weights, same_trunk.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for head in ("y1", "y2"):
        best = mh.load_run(full, best=head).model.heads[head]
        for a, b in zip(model.heads[head].weights, best.weights, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # metrics.json's eval is the evaluation of the model the run ends with
    run = mh.load_run(restored, trainer=True)
    data = tasks.prepare(load_config(config)).data
    assert run.trainer.evaluate(data.eval, batch_size=64) == metrics["eval"]


def test_restore_heads_needs_per_head(tmp_path, capsys):
    config = _write(tmp_path, _raw(*HEAD_STOP[:-2], "train.eval_every=10",
                                   "callbacks.best_checkpoint={restore_heads: true}"))
    assert main(["validate", config]) == 2
    assert "callbacks.best_checkpoint.restore_heads: needs per_head: true" in capsys.readouterr().err


def test_export_head_best_uses_that_heads_best_checkpoint(head_runs, tmp_path, capsys):
    _, full, _, _ = head_runs
    path = _run_json(full, "metrics.json")["head_best_checkpoints"]["y2"]["path"]
    assert main(["export", full, str(tmp_path / "out"), "--head", "y2", "--best"]) == 0
    # named relative to the run directory, as status.json names checkpoints
    assert f"from checkpoint {path} " in capsys.readouterr().out
    assert main(["export", full, str(tmp_path / "out2"), "--heads", "y1,y2", "--best"]) == 2
    assert "export one head at a time" in capsys.readouterr().err


@pytest.mark.parametrize("override,message", [
    ("callbacks.early_stopping={per_head: true, monitor: eval/y1/loss}",
     "callbacks.early_stopping.monitor: not used with per_head"),
    ("callbacks.early_stopping={per_head: true, restore_best: true}",
     "callbacks.early_stopping.restore_best: not with per_head"),
    ("callbacks.best_checkpoint={per_head: true, monitor: eval/y1/loss}",
     "callbacks.best_checkpoint.monitor: not used with per_head"),
])
def test_bad_per_head_callback_configs_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_dict(_raw(override))
