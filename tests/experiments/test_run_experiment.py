"""`run_experiment`, the library call behind `multihead train`: a run and a resume without the
CLI, and `--resume` checking the run's records before it writes anything
(`multihead.experiments.run.experiment`, `multihead.experiments.run.records`)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from multihead.experiments.config.schema import ConfigError, load_config
from multihead.experiments.run.experiment import RunResult, run_experiment
from multihead.experiments.run.resume import RunInputError

CONFIG = """\
seed: 5
data: {kind: mmoe, train_size: 128, eval_size: 32, input_dim: 6}
model:
  trunk: {mlp: {units: [8], activation: relu}}
  heads:
    a: {layers: {mlp: {units: [1], output_activation: linear}}, optimizer: adam}
    b: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
train: {steps: 20, batch_size: 16, eval_every: 10, steps_per_execution: 1}
log: {every: 5, histograms_every: 0}
checkpoint: {every: 10, keep: 5}
callbacks:
  early_stopping: {per_head: true, patience: 50}
  best_checkpoint: {monitor: eval/mean_loss}
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A completed 20-step run (checkpoints 10, 20; per-head stopping and a best checkpoint)."""
    tmp = tmp_path_factory.mktemp("finished")
    config = tmp / "exp.yaml"
    config.write_text(CONFIG)
    result = run_experiment(str(config), run_dir=str(tmp / "run"), quiet=True)
    assert result.status == "completed" and result.exit_code == 0, result
    return config, tmp / "run", result


def _copy(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished[1], run, symlinks=True)
    return run


def _files(run):
    """Every file of the run, byte for byte, with its mtime: what a refused resume must keep."""
    return {str(p.relative_to(run)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                      else os.readlink(p) if p.is_symlink() else None,
                                      p.lstat().st_mtime_ns)
            for p in sorted(run.rglob("*"))}


def test_a_run_through_the_library_call(finished):
    _, run, result = finished
    assert isinstance(result, RunResult) and result.run_dir == str(run) and result.message is None
    on_disk = json.loads((run / "metrics.json").read_text())
    assert result.metrics["steps"] == on_disk["steps"] == 20
    assert [e["step"] for e in on_disk["evals"]] == [10, 20]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed" and status["checkpoint"] == "checkpoints/final"


def test_a_resume_through_the_library_call_adds_a_segment(finished, tmp_path):
    config, _, _ = finished
    run = _copy(finished, tmp_path)
    result = run_experiment(str(config), resume=str(run), overrides=["train.steps=30"], quiet=True)
    assert (result.status, result.exit_code) == ("completed", 0)
    assert result.metrics["steps"] == 30
    assert [e["step"] for e in result.metrics["evals"]] == [10, 20, 30]
    assert [(s["start_step"], s["resumed_from"], s["end_step"])
            for s in result.metrics["segments"]] == [
        (0, None, 20), (20, "checkpoints/ckpt-20", 30)]


def test_the_library_call_takes_a_config_object(finished, tmp_path):
    config = load_config(finished[0], ["train.steps=10"])
    result = run_experiment(config, run_dir=str(tmp_path / "obj"), quiet=True)
    assert result.exit_code == 0 and result.metrics["steps"] == 10
    with pytest.raises(RunInputError, match="overrides and only_head apply to a config file"):
        run_experiment(config, run_dir=str(tmp_path / "x"), overrides=["seed=1"])
    assert not (tmp_path / "x").exists()


def test_bad_input_raises_before_anything_is_written(finished, tmp_path):
    config = finished[0]
    with pytest.raises(ConfigError, match="seed"):
        run_experiment(str(config), run_dir=str(tmp_path / "x"), overrides=["seed=-1"])
    with pytest.raises(RunInputError, match="exists and is not empty"):
        run_experiment(str(config), run_dir=str(finished[1]))
    assert not (tmp_path / "x").exists()


# -- --resume checks the run's records first: a refusal writes nothing ------------------------


def _status_without_status(run):
    tree = json.loads((run / "status.json").read_text())
    del tree["status"]
    (run / "status.json").write_text(json.dumps(tree))


def _head_stopping_symlink(run):
    outside = run.parent / "elsewhere.json"
    shutil.move(run / "head_stopping.json", outside)
    (run / "head_stopping.json").symlink_to(outside)


def _head_stopping_without_a_head(run):
    tree = json.loads((run / "head_stopping.json").read_text())
    for entry in tree["evaluations"]:
        entry["values"].pop("b")
    (run / "head_stopping.json").write_text(json.dumps(tree))


def _history(run, change):
    tree = json.loads((run / "history.json").read_text())
    change(tree)
    (run / "history.json").write_text(json.dumps(tree))


def _history_unknown_head(run):
    _history(run, lambda t: t["evals"][0]["eval"].update(z={"loss": 1.0}))


def _history_negative_wall_time(run):
    _history(run, lambda t: t["segments"][0].update(wall_time_s=-5.0))


def _history_segment_ends_before_it_starts(run):
    _history(run, lambda t: t["segments"][0].update(start_step=15, end_step=3))


def _history_evals_out_of_order(run):
    _history(run, lambda t: t["evals"].reverse())


def _best_minus_infinity(run):
    tree = json.loads((run / "best" / "best.json").read_text())
    tree["value"] = float("-inf")
    (run / "best" / "best.json").write_text(json.dumps(tree))  # -Infinity, as json writes it


@pytest.mark.parametrize("damage,named", [
    (_status_without_status, "status.json: status"),
    (_head_stopping_symlink, "head_stopping.json"),
    (_head_stopping_without_a_head, "head_stopping.json: evaluations[0].values"),
    (_history_unknown_head, "history.json: evals[0].eval"),
    (_history_negative_wall_time, "history.json: segments[0].wall_time_s"),
    (_history_segment_ends_before_it_starts, "history.json: segments[0].end_step"),
    (_history_evals_out_of_order, "history.json: evals[1].step"),
    (_best_minus_infinity, "best.json: value"),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else "")
def test_resume_refuses_a_bad_record_and_keeps_the_run_byte_identical(
        finished, tmp_path, damage, named):
    config = finished[0]
    run = _copy(finished, tmp_path)
    damage(run)
    before = _files(run)
    with pytest.raises(RunInputError) as refused:
        run_experiment(str(config), resume=str(run), overrides=["train.steps=30"], quiet=True)
    message = str(refused.value)
    assert named in message and "\n" not in message, message
    assert _files(run) == before


def test_the_cli_says_a_bad_record_in_one_line_with_exit_2(finished, tmp_path, capsys):
    from multihead.cli.main import main

    config = finished[0]
    run = _copy(finished, tmp_path)
    _best_minus_infinity(run)
    before = _files(run)
    assert main(["train", str(config), "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("multihead: error: --resume: ") and \
        "best.json: value" in err, err
    assert _files(run) == before


# -- segments: a failed first segment is kept, to the last step it ran ------------------------


def test_a_disk_full_first_segment_is_kept_to_its_last_step(tmp_path, monkeypatch):
    """No new file can be created from the first checkpoint step on, and the evaluation at
    step 20 fails with ENOSPC: the run fails at step 20 with history.json rewritten in its own
    blocks, and the resumed run's metrics count the first segment's 20 steps and its time."""
    import errno
    import time

    import multihead.experiments.run.history as history
    from multihead.training.trainer import Trainer

    config = tmp_path / "exp.yaml"
    config.write_text(CONFIG.replace("every: 10, keep: 5", "every: 5, keep: 5")
                      .replace("train: {steps: 20", "train: {steps: 30"))
    write_atomic, evaluate, calls = history.write_atomic, Trainer.evaluate, {"eval": 0}

    def disk_full_once_created(path, data):  # the history file's first write finds room
        if os.path.exists(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        write_atomic(path, data)

    def failing_second_evaluation(self, *args, **kwargs):
        calls["eval"] += 1
        if calls["eval"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(history, "write_atomic", disk_full_once_created)
    monkeypatch.setattr(Trainer, "evaluate", failing_second_evaluation)
    run = tmp_path / "run"
    started = time.perf_counter()
    failed = run_experiment(str(config), run_dir=str(run), quiet=True)
    first_call = time.perf_counter() - started
    monkeypatch.undo()
    assert (failed.status, failed.exit_code) == ("failed", 1) and "disk full" in failed.message
    status = json.loads((run / "status.json").read_text())
    [kept] = json.loads((run / "history.json").read_text())["segments"]
    # The guard's own record of the last step done, independent of the history.
    assert status["step"] == 20 and status["checkpoint"] == "checkpoints/ckpt-15"
    assert (kept["start_step"], kept["end_step"]) == (0, status["step"])
    assert 0 < kept["wall_time_s"] < first_call

    started = time.perf_counter()
    resumed = run_experiment(str(config), resume=str(run), quiet=True)
    second_call = time.perf_counter() - started
    assert resumed.exit_code == 0, resumed.message
    first, second = resumed.metrics["segments"]
    assert first == kept
    assert (second["start_step"], second["resumed_from"], second["end_step"]) == (
        15, "checkpoints/ckpt-15", 30)
    assert 0 < second["wall_time_s"] < second_call
    # 20 steps in the first segment, 30 - 15 in the second (the steps 16..20 were run twice)
    assert resumed.metrics["steps_per_s"] == pytest.approx(
        (20 + 15) / (kept["wall_time_s"] + second["wall_time_s"]))
