"""Exact resume: a run stopped after a checkpoint and resumed equals the uninterrupted run bitwise."""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_model
from tensorflow.core.util import event_pb2

import multihead as mh
from multihead.experiments.results.compare import load_result
from multihead.experiments.run.experiment import run_experiment
from multihead.io.manager import CheckpointManager

HEADS = ("a", "b")
DATA = mh.mmoe_synthetic(tasks=list(HEADS), train_size=200, eval_size=40, input_dim=5, seed=1)


def _trainer(seed, dropout, log_dir=None):
    model = make_model(seed=seed, dropout=dropout)
    keras.utils.set_random_seed(0)  # the run's seed, as `multihead train` sets it before fit
    return mh.Trainer(model, {"a": mh.Objective("mse", keras.optimizers.Adam(1e-2)),
                              "b": mh.Objective("mse", keras.optimizers.Adam(1e-2), every=3)},
                      log_dir=log_dir, log_every=1, histograms_every=0)


def _state(trainer):
    """Every value that must match: weights, seed states, optimizer slots, step, data position."""
    variables = list(trainer.model.variables)
    variables += [v for h in HEADS for v in trainer.optimizers[h].variables]
    variables += [trainer.step_variable, trainer.data_position.epoch, trainer.data_position.batch]
    return [np.array(v.numpy()) for v in variables]


def _fit(trainer, steps, manager=None):
    return trainer.fit(DATA.train, steps, batch_size=16, verbose=False, checkpoints=manager)


def _stopped_and_resumed(tmp_path, dropout, parts=None):
    """Trains 27 steps with checkpoints every 10 (so 7 steps are lost), then resumes to 40
    in fresh objects, restoring `parts` (None: the manager restores everything)."""
    first = _trainer(seed=0, dropout=dropout)
    _fit(first, 27, CheckpointManager(tmp_path, first.model, first, every=10))
    resumed = _trainer(seed=5, dropout=dropout)  # other initial weights: the restore must fix them
    manager = CheckpointManager(tmp_path, resumed.model, resumed, every=10)
    if parts is None:
        assert manager.restore_latest() == 20
    else:
        mh.restore_checkpoint(manager.latest_checkpoint, resumed.model, parts=parts, trainer=resumed)
    history = _fit(resumed, 40 - resumed.global_step, manager)
    return resumed, history


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_resume_in_fresh_objects_is_bitwise_the_uninterrupted_run(tmp_path, dropout):
    uninterrupted = _trainer(seed=0, dropout=dropout)
    full_history = _fit(uninterrupted, 40)
    resumed, history = _stopped_and_resumed(tmp_path, dropout)
    for a, b in zip(_state(uninterrupted), _state(resumed)):
        np.testing.assert_array_equal(a, b)
    for head in HEADS:  # the losses of steps 20..39 are the same numbers
        assert history.train[head] == [(s, v) for s, v in full_history.train[head] if s >= 20]


@pytest.mark.parametrize("missing", ["rng", "data"])
def test_resume_without_the_rng_or_data_part_is_not_exact(tmp_path, missing):
    """The control for the test above: each of these parts is needed (with Dropout)."""
    uninterrupted = _trainer(seed=0, dropout=0.3)
    _fit(uninterrupted, 40)
    parts = [p for p in mh.available_parts(uninterrupted.model, uninterrupted) if p != missing]
    resumed, _ = _stopped_and_resumed(tmp_path, 0.3, parts=parts)
    assert resumed.global_step == 40
    assert any(not np.array_equal(a, b.numpy())
               for a, b in zip(uninterrupted.model.trainable_variables,
                               resumed.model.trainable_variables))


def _events(log_dir):
    """(run, tag, step) -> list of serialized values, over every event file of the run.

    The TensorBoard layout (`custom_scalars__config__`) is left out: every writer
    writes it when it opens, and TensorBoard shows the latest one.
    """
    found = {}
    for path in glob.glob(os.path.join(log_dir, "*", "events.out.tfevents.*")):
        run = os.path.basename(os.path.dirname(path))
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.tag == "custom_scalars__config__":
                    continue
                found.setdefault((run, value.tag, event.step), []).append(
                    value.tensor.SerializeToString())
    return found


def test_resumed_tensorboard_logs_have_each_step_once(tmp_path):
    uninterrupted = _trainer(seed=0, dropout=0.3, log_dir=tmp_path / "full")
    _fit(uninterrupted, 30)
    uninterrupted.close()

    logs = tmp_path / "stopped"
    first = _trainer(seed=0, dropout=0.3, log_dir=logs)
    _fit(first, 17, CheckpointManager(tmp_path / "ckpt", first.model, first, every=10))
    first.close()  # steps 10..16 reach the disk, as they may before a crash; its writer is gone
    assert any(step == 16 for (_, _, step) in _events(logs))
    resumed = _trainer(seed=0, dropout=0.3, log_dir=logs)
    assert CheckpointManager(tmp_path / "ckpt", resumed.model, resumed).restore_latest() == 10
    _fit(resumed, 20)
    resumed.close()

    full, stopped = _events(tmp_path / "full"), _events(logs)
    duplicated = [key for key, values in stopped.items() if len(values) > 1]
    assert not duplicated
    assert stopped == full  # same tags at the same steps with bitwise the same values
    assert {step for (run, tag, step) in stopped if tag == "loss/a"} == set(range(1, 31))


# -- a real crash: SIGKILL of `multihead train`, then `multihead train --resume` -----------

CONFIG = """\
seed: 3
data: {kind: mmoe, train_size: 256, eval_size: 64, input_dim: 8}
model:
  trunk: {mlp: {units: [16, 16], activation: relu, dropout: 0.2}}
  heads:
    a: {layers: {mlp: {units: [8, 1], output_activation: linear}},
        optimizer: {class_name: Adam, config: {learning_rate: 1e-3}}}
    b: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd, every: 2}
train: {steps: 1000000, batch_size: 32, eval_every: 25}
log: {every: 5, histograms_every: 0}
checkpoint: {every: 25, keep: 2}
"""

# The same run with one dataset per head (of different sizes, so their epochs end at
# different steps): every stream's position must be restored.
PER_HEAD_CONFIG = CONFIG.replace(
    "data: {kind: mmoe, train_size: 256, eval_size: 64, input_dim: 8}",
    "data:\n  per_head:\n"
    "    a: {kind: mmoe, train_size: 256, eval_size: 64, input_dim: 8, seed: 1}\n"
    "    b: {kind: mmoe, train_size: 96, eval_size: 32, input_dim: 8, seed: 2}")
assert PER_HEAD_CONFIG != CONFIG


def _env():
    env = dict(os.environ, TF_DETERMINISTIC_OPS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    return env


def _cli(*args, timeout=180):
    result = subprocess.run([sys.executable, "-m", "multihead", *args], env=_env(),
                            capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def _tensors(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if not key.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter", "run/"))}


def _killed_after_a_checkpoint(config, stopped, launcher=("-m", "multihead")):
    """Starts `multihead train config` in `stopped`, SIGKILLs it once it has written a
    checkpoint; returns the step of its newest checkpoint. `launcher`: the Python arguments
    that run the CLI (a script that registers user classes first, for instance)."""
    state_file = stopped / "checkpoints" / "checkpoint"
    proc = subprocess.Popen([sys.executable, *launcher, "train", str(config),
                             "--run-dir", str(stopped), "--quiet"], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not state_file.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return CheckpointManager.step_of(tf.train.latest_checkpoint(str(stopped / "checkpoints")))


def _assert_resumed_equals_uninterrupted(stopped, full, total):
    """The checkpoints at `total` hold bitwise the same tensors (the dropout seed state
    included), and the TensorBoard events are the same tags at the same steps with bitwise
    the same values, no training step logged twice."""
    resumed_state = _tensors(str(stopped / "checkpoints" / f"ckpt-{total}"))
    full_state = _tensors(str(full / "checkpoints" / f"ckpt-{total}"))
    assert set(resumed_state) == set(full_state)
    assert any(key.startswith("rng/trunk/") for key in full_state)  # the dropout seed state
    for key, value in full_state.items():
        np.testing.assert_array_equal(resumed_state[key], value, err_msg=key)

    resumed_events, full_events = _events(str(stopped)), _events(str(full))
    counts = Counter({key: len(values) for key, values in resumed_events.items() if key[0] == "train"})
    assert max(counts.values()) == 1  # no training step logged twice
    # Same tags, steps and bitwise values, with the same multiplicity (the run writes
    # its final train-set evaluation to the eval run at the last step, in both runs).
    config_key = ("train", "config", 0)  # the config text: train.steps differs, by design
    assert len(resumed_events.pop(config_key)) == len(full_events.pop(config_key)) == 1
    assert resumed_events == full_events
    # logged at the number of updates done: the first, every 5th and the last
    assert {s for (run, tag, s) in full_events if (run, tag) == ("train", "loss/a")} == {
        1, *range(5, total + 1, 5)}


def test_sigkill_after_a_checkpoint_then_resume_equals_the_uninterrupted_run_per_head_data(tmp_path):
    """With one dataset per head (of different sizes, so their epochs end at different steps);
    one dataset for all heads: the SIGKILL-and-two-resumes test below."""
    config = tmp_path / "exp.yaml"
    config.write_text(PER_HEAD_CONFIG)
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    killed_at = _killed_after_a_checkpoint(config, stopped)
    total = (killed_at // 25 + 3) * 25  # at least 2 more checkpoints and evaluations

    _cli("train", str(config), "--resume", str(stopped), "--set", f"train.steps={total}", "--quiet")
    _cli("train", str(config), "--run-dir", str(full), "--set", f"train.steps={total}", "--quiet")
    _assert_resumed_equals_uninterrupted(stopped, full, total)


def test_resume_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    from multihead.cli.main import main

    config = tmp_path / "exp.yaml"
    config.write_text(CONFIG.replace("steps: 1000000", "steps: 30"))
    run = tmp_path / "run"
    assert run_experiment(str(config), run_dir=str(run), quiet=True).exit_code == 0
    capsys.readouterr()

    def files():
        return sorted((p, p.stat().st_mtime_ns) for p in run.rglob("*"))

    before = files()
    for args, message in [
        (["--resume", str(tmp_path / "nope")], "no config.yaml there"),
        (["--resume", str(run), "--set", "seed=4"], "differs from"),
        (["--resume", str(run), "--set", "model.trunk.mlp.units=[32, 16]"], "at model.trunk.mlp.units"),
        (["--resume", str(run), "--set", "train.steps=20"], "latest checkpoint is at step 30"),
        (["--resume", str(run), "--run-dir", str(tmp_path / "x")], "name different directories"),
    ]:
        assert main(["train", str(config), "--quiet", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert files() == before
    assert not (tmp_path / "x").exists()


# -- a stateful trunk aggregator survives the crash bitwise --------------------------------------

AGG_CONFIG = """\
seed: 5
data: {kind: mmoe, train_size: 256, eval_size: 64, input_dim: 8}
model:
  trunk: {mlp: {units: [16], activation: relu, dropout: 0.2}}
  heads:
    a: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
    b: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
train:
  steps: 1000000
  batch_size: 32
  eval_every: 25
  trunk: {optimizer: adam, aggregator: AGGREGATOR}
log: {every: 5, histograms_every: 0}
checkpoint: {every: 25, keep: 2}
"""


@pytest.mark.slow
@pytest.mark.parametrize("aggregator,state_key", [
    ("gradvac", "trunk_update/aggregator_state/rho_T"),
    ("nash_mtl", "trunk_update/aggregator_state/alpha"),
    ("famo", "trunk_update/weighting/logits"),
    ("moco", "trunk_update/aggregator_state/y/"),
    ("db_mtl", "trunk_update/aggregator_state/grad_buffer/"),
    ("excess_mtl", "trunk_update/aggregator_state/grad_sum/"),
    ("sdmgrad", "trunk_update/aggregator_state/w"),
    ("uncertainty", "trunk_update/weighting/log_vars"),
    ("gradnorm", "trunk_update/weighting/initial_losses"),
    ("dwa", "trunk_update/weighting/last"),
    ("stch", "trunk_update/weighting/loss_sum"),
    ("imtl_l", "trunk_update/weighting/loss_scale"),
])
def test_stateful_aggregator_sigkill_then_resume_equals_the_uninterrupted_run(
        tmp_path, aggregator, state_key):
    config = tmp_path / "exp.yaml"
    config.write_text(AGG_CONFIG.replace("AGGREGATOR", aggregator))
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    killed_at = _killed_after_a_checkpoint(config, stopped)
    total = (killed_at // 25 + 2) * 25

    _cli("train", str(config), "--resume", str(stopped), "--set", f"train.steps={total}", "--quiet")
    _cli("train", str(config), "--run-dir", str(full), "--set", f"train.steps={total}", "--quiet")

    resumed_state = _tensors(str(stopped / "checkpoints" / f"ckpt-{total}"))
    full_state = _tensors(str(full / "checkpoints" / f"ckpt-{total}"))
    assert set(resumed_state) == set(full_state)
    state = [key for key in full_state if key.startswith(state_key)]
    assert state, sorted(full_state)
    assert np.any(full_state[state[0]] != 0)   # the state moved: it is really carried
    for key, value in full_state.items():
        np.testing.assert_array_equal(resumed_state[key], value, err_msg=key)


def _agg_trainer(aggregator, seed):
    model = make_model(seed=seed)
    keras.utils.set_random_seed(0)
    return mh.Trainer(model, {"a": mh.Objective("mse", keras.optimizers.Adam(1e-2)),
                              "b": mh.Objective("mse", keras.optimizers.Adam(1e-2))},
                      trunk={"optimizer": "adam", "aggregator": aggregator, "seed": 3})


@pytest.mark.parametrize("aggregator", [
    "gradvac", "famo",   # aggregator state + generator; a loss weighting's state
    pytest.param("nash_mtl", marks=pytest.mark.slow), pytest.param("rlw", marks=pytest.mark.slow),
    pytest.param("graddrop", marks=pytest.mark.slow),
    "moco",   # K x D buffers, one variable per trunk variable
    pytest.param("db_mtl", marks=pytest.mark.slow), pytest.param("excess_mtl", marks=pytest.mark.slow),
])
def test_stateful_and_random_aggregators_resume_bitwise(tmp_path, aggregator):
    """In-process stop at 17 (checkpoint at 10), restore into fresh objects, train on to 25:
    every variable, the aggregator's state and the generator included, equals the
    uninterrupted run's (the SIGKILL version through `multihead train` is slow)."""
    full = _agg_trainer(aggregator, seed=0)
    _fit(full, 25)
    first = _agg_trainer(aggregator, seed=0)
    _fit(first, 17, CheckpointManager(tmp_path, first.model, first, every=10))
    resumed = _agg_trainer(aggregator, seed=5)
    assert CheckpointManager(tmp_path, resumed.model, resumed, every=10).restore_latest() == 10
    _fit(resumed, 15)
    for a, b in zip(full.trunk_update.variables, resumed.trunk_update.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
    for a, b in zip(full.model.variables, resumed.model.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)


def _progress_steps(stderr):
    """(done, total) of every progress line in `stderr`."""
    return [tuple(int(n) for n in re.match(r"step\s+(\d+)/(\d+)", line).groups())
            for line in stderr.splitlines() if re.match(r"step\s+\d+/\d+", line)]


def test_sigkill_then_two_resumes_keep_one_history_equal_to_the_uninterrupted_run(tmp_path):
    """After SIGKILL + two resumes: the checkpoint and TensorBoard events bitwise those of one
    uninterrupted run of the same seed; in metrics.json every evaluation from the first step,
    the same best values and `compare` output, and each segment listed with its start step
    and checkpoint."""
    config = tmp_path / "exp.yaml"
    config.write_text(CONFIG)
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    killed_at = _killed_after_a_checkpoint(config, stopped)
    mid, total = killed_at + 50, killed_at + 75

    first = _cli("train", str(config), "--resume", str(stopped), "--set", f"train.steps={mid}")
    _cli("train", str(config), "--resume", str(stopped), "--set", f"train.steps={total}", "--quiet")
    _cli("train", str(config), "--run-dir", str(full), "--set", f"train.steps={total}", "--quiet")
    _assert_resumed_equals_uninterrupted(stopped, full, total)

    assert f"resuming from checkpoints/ckpt-{killed_at} (step {killed_at})" in first.stderr
    lines = _progress_steps(first.stderr)
    assert lines[0] == (killed_at + 1, mid)  # "auto" runs one step in its first call
    assert lines[-1] == (mid, mid)
    assert all(killed_at < done <= mid and of == mid for done, of in lines)

    resumed = json.loads((stopped / "metrics.json").read_text())
    uninterrupted = json.loads((full / "metrics.json").read_text())
    assert [e["step"] for e in uninterrupted["evals"]] == list(range(25, total + 1, 25))
    for key in ("evals", "eval", "train", "baseline", "steps"):
        assert resumed[key] == uninterrupted[key], key
    assert load_result(str(stopped)).best == load_result(str(full)).best
    compared = [_cli("compare", str(run)).stdout.replace(str(run), "RUN").split()  # no widths
                for run in (stopped, full)]
    assert compared[0] == compared[1]

    segments = resumed["segments"]
    assert [(s["start_step"], s["resumed_from"]) for s in segments] == [
        (0, None), (killed_at, f"checkpoints/ckpt-{killed_at}"), (mid, f"checkpoints/ckpt-{mid}")]
    assert [s["end_step"] for s in segments[1:]] == [mid, total]
    assert segments[0]["end_step"] >= killed_at and segments[0]["wall_time_s"] > 0
    assert resumed["wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in segments))
    ran = sum(s["end_step"] - s["start_step"] for s in segments)
    assert resumed["steps_per_s"] == pytest.approx(ran / resumed["wall_time_s"])
    assert [s["start_step"] for s in uninterrupted["segments"]] == [0]


def test_a_sigkilled_segment_ends_at_or_past_the_checkpoint_its_resume_starts_from(tmp_path):
    """Evaluations too rare to be reached before the kill: the killed segment's record still
    ends at or past its newest checkpoint (the history is rewritten at checkpoint steps and
    every few seconds), with no more wall time than the process lived, and the resumed run's
    steps per second count both segments' steps over both segments' time."""
    config = tmp_path / "exp.yaml"
    config.write_text(CONFIG.replace("eval_every: 25", "eval_every: 100000"))
    stopped = tmp_path / "stopped"
    started = time.monotonic()
    killed_at = _killed_after_a_checkpoint(config, stopped)
    lived = time.monotonic() - started
    [killed] = json.loads((stopped / "history.json").read_text())["segments"]
    assert killed["start_step"] == 0 and killed["end_step"] >= killed_at
    assert 0 < killed["wall_time_s"] < lived

    total = killed_at + 25
    started = time.monotonic()
    _cli("train", str(config), "--resume", str(stopped), "--set", f"train.steps={total}", "--quiet")
    took = time.monotonic() - started
    metrics = json.loads((stopped / "metrics.json").read_text())
    first, second = metrics["segments"]
    assert first == killed
    assert (second["start_step"], second["end_step"]) == (killed_at, total)
    assert 0 < second["wall_time_s"] < took
    ran = killed["end_step"] + (total - killed_at)  # steps run, counted from the two records
    assert metrics["steps_per_s"] == pytest.approx(ran / (killed["wall_time_s"] + second["wall_time_s"]))


# Head a's loss weight makes its float16 gradient overflow at the first steps: its loss
# scale halves a few times from 2^15 before the checkpoint, so a resume that lost the scales
# would start again from 2^15 and diverge from the uninterrupted run.
FLOAT16_CONFIG = CONFIG.replace(
    "train: {steps: 1000000, batch_size: 32, eval_every: 25}",
    "train: {steps: 1000000, batch_size: 32, eval_every: 25, mixed_precision: float16}").replace(
    "    a: {layers:", "    a: {weight: 1000.0, layers:")
assert FLOAT16_CONFIG.count("float16") == 1 and "weight: 1000.0" in FLOAT16_CONFIG


@pytest.mark.slow
def test_float16_loss_scales_survive_sigkill_and_resume(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(FLOAT16_CONFIG)
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    killed_at = _killed_after_a_checkpoint(config, stopped)
    saved = _tensors(str(stopped / "checkpoints" / f"ckpt-{killed_at}"))
    scales = {k: v for k, v in saved.items() if k.startswith("loss_scales/")}
    assert {k.split("/")[2] for k in scales if "/scales/" in k} == {"a", "b"}
    assert any(v < 2.0 ** 15 for k, v in scales.items() if "/scales/" in k)  # a halved
    total = killed_at + 25

    _cli("train", str(config), "--resume", str(stopped), "--set", f"train.steps={total}", "--quiet")
    _cli("train", str(config), "--run-dir", str(full), "--set", f"train.steps={total}", "--quiet")
    resumed_state = _tensors(str(stopped / "checkpoints" / f"ckpt-{total}"))
    full_state = _tensors(str(full / "checkpoints" / f"ckpt-{total}"))
    assert set(resumed_state) == set(full_state)
    for key, value in full_state.items():  # weights, slots, and each head's scale and count
        np.testing.assert_array_equal(resumed_state[key], value, err_msg=key)
