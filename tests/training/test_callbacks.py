"""Built-in callbacks and Keras callbacks in `Trainer.fit`, on real training of a tiny model.

Every expectation is computed by hand from what `fit` recorded (`history.eval`) or
from what a `LambdaCallback` saw, never from the callback under test.
"""

from __future__ import annotations

import csv
import glob
import os

import keras
import numpy as np
import pytest

import multihead as mh
from multihead.training.callbacks import (
    EarlyStopping,
    LambdaCallback,
    MonitoredQuantity,
    ReduceLROnPlateau,
    TerminateOnNonFinite,
)
from multihead.io.best_checkpoint import BestCheckpoint

HEADS = ("a", "b")
EVAL_EVERY = 10


def _model(seed: int = 0) -> mh.MultiHeadModel:
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(keras.layers.Dense(8, activation="tanh"),
                              {h: keras.layers.Dense(1) for h in HEADS})
    model.build((None, 5))
    return model


def _data(rows: int, seed: int, nan_head: str | None = None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 5)).astype("float32")
    y = {"a": (x @ np.array([1.0, -2.0, 0.5, 0.0, 1.0]))[:, None] + 0.3 * rng.standard_normal((rows, 1)),
         "b": np.sin(2 * x[:, :1]) + 0.3 * rng.standard_normal((rows, 1))}
    y = {h: v.astype("float32") for h, v in y.items()}
    if nan_head is not None:
        y[nan_head][:] = np.nan
    return x, y


TRAIN, EVAL = _data(320, seed=1), _data(200, seed=2)


def _trainer(seed: int = 0, lr: float = 0.05) -> mh.Trainer:
    # A metric object: its name is "mae" whatever Keras calls the metric named "mae".
    return mh.Trainer(_model(seed), {h: mh.Objective("mse", keras.optimizers.Adam(lr),
                                                     metrics=[keras.metrics.MeanAbsoluteError(name="mae")])
                                     for h in HEADS})


def _fit(trainer: mh.Trainer, callbacks, steps: int = 300, spe="auto", train=TRAIN, eval_data=EVAL):
    return trainer.fit(train, steps, batch_size=32, eval_data=eval_data, eval_every=EVAL_EVERY,
                       verbose=False, steps_per_execution=spe, callbacks=callbacks)


def _weights(model: mh.MultiHeadModel) -> list[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in model.weights]


def _snapshots():
    """A LambdaCallback that keeps the model's weights at every evaluation."""
    saved: dict[int, list[np.ndarray]] = {}
    callback = LambdaCallback()
    callback.on_eval_end = lambda step, metrics: saved.__setitem__(step, _weights(callback.trainer.model))
    return callback, saved


def _assert_bitwise(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def _plateau(values, patience: int, min_delta: float, mode: str = "min"):
    """(index of the evaluation that stops, index of the best evaluation) by the rule:
    an evaluation improves when it beats the best by more than min_delta; `patience`
    non-improving evaluations in a row stop."""
    best, best_i, wait = None, None, 0
    for i, v in enumerate(values):
        better = best is None or (v < best - min_delta if mode == "min" else v > best + min_delta)
        if better:
            best, best_i, wait = v, i, 0
            continue
        wait += 1
        if wait >= patience:
            return i, best_i
    return None, best_i


# -- EarlyStopping --------------------------------------------------------------------------

MONITORS = [
    ("eval/a/loss", "auto", lambda m: m["a"]["loss"]),
    ("eval/mean_loss", "auto", lambda m: (m["a"]["loss"] + m["b"]["loss"]) / 2),
    ("eval/b/mae", "auto", lambda m: m["b"]["mae"]),
    (lambda m: -m["a"]["loss"] - m["b"]["loss"], "max", lambda m: -m["a"]["loss"] - m["b"]["loss"]),
]


@pytest.mark.parametrize("monitor,mode,read", MONITORS, ids=["head", "mean", "metric", "callable"])
def test_early_stopping_stops_where_the_eval_history_says_and_restores_the_best_weights(
        monitor, mode, read):
    trainer = _trainer()
    stop = EarlyStopping(monitor, patience=2, min_delta=1e-3, mode=mode)
    record, saved = _snapshots()
    history = _fit(trainer, [record, stop], steps=400)

    values = [read(metrics) for _, metrics in history.eval]
    steps = [step for step, _ in history.eval]
    stop_i, best_i = _plateau(values, 2, 1e-3, "max" if mode == "max" else "min")
    assert stop_i is not None, "the run should plateau within 400 steps (40 evaluations)"
    assert stop.stopped_step == steps[stop_i] == steps[-1] == trainer.global_step
    assert stop.best_step == steps[best_i] and stop.best_value == values[best_i]
    assert trainer.stop_reason == stop.stop_reason and "EarlyStopping" in stop.stop_reason
    assert stop.best_step < stop.stopped_step
    _assert_bitwise(_weights(trainer.model), saved[stop.best_step])


def test_early_stopping_without_restore_keeps_the_last_weights():
    trainer = _trainer()
    stop = EarlyStopping("eval/a/loss", patience=2, min_delta=1e-3, restore_best=False)
    record, saved = _snapshots()
    _fit(trainer, [record, stop], steps=400)
    assert stop.stopped_step is not None
    _assert_bitwise(_weights(trainer.model), saved[stop.stopped_step])


@pytest.mark.parametrize("restore", [True, False])
def test_fit_verbose_prints_the_early_stop_in_one_line(restore, capsys):
    trainer = _trainer()
    stop = EarlyStopping("eval/a/loss", patience=2, min_delta=1e-3, restore_best=restore)
    history = trainer.fit(TRAIN, 400, batch_size=32, eval_data=EVAL, eval_every=EVAL_EVERY,
                          verbose=True, callbacks=[stop])
    values = [metrics["a"]["loss"] for _, metrics in history.eval]
    steps = [step for step, _ in history.eval]
    stop_i, best_i = _plateau(values, 2, 1e-3)
    assert stop_i is not None
    restored = f"restored the weights of step {steps[best_i]}" if restore else "weights not restored"
    expected = (f"EarlyStopping: eval/a/loss did not improve by more than 0.001 for 2 evaluation(s) "
                f"(best {values[best_i]:.6g} at step {steps[best_i]}); stopped at step "
                f"{steps[stop_i]}; {restored}")
    assert capsys.readouterr().err.splitlines()[-1] == expected


def test_stop_reason_is_reset_by_the_next_fit():
    trainer = _trainer()
    _fit(trainer, [EarlyStopping("eval/a/loss", patience=1, min_delta=10.0)], steps=50)
    assert trainer.stop_reason.startswith("EarlyStopping")
    _fit(trainer, [], steps=20)
    assert trainer.stop_reason is None


# -- BestCheckpoint -------------------------------------------------------------------------


def test_best_checkpoint_keeps_the_checkpoint_of_the_best_eval(tmp_path):
    trainer = _trainer()
    best = BestCheckpoint(tmp_path / "best", monitor="eval/mean_loss")
    record, saved = _snapshots()
    history = _fit(trainer, [record, best], steps=200)

    values = [(m["a"]["loss"] + m["b"]["loss"]) / 2 for _, m in history.eval]
    best_step = history.eval[int(np.argmin(values))][0]  # the first minimum: ties do not improve
    assert best.best_step == best_step and best.best_value == min(values)
    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "best" / "best-*.index"))) \
        == [f"best-{best_step}.index"]
    record_file = BestCheckpoint.read(tmp_path / "best")
    assert record_file["step"] == best_step and record_file["path"] == best.path

    fresh = _trainer(seed=7)
    fresh.build_optimizers()
    mh.restore_checkpoint(best.path, fresh.model, trainer=fresh)
    _assert_bitwise(_weights(fresh.model), saved[best_step])
    assert fresh.global_step == best_step


def test_best_checkpoint_resumes_from_its_record(tmp_path):
    trainer = _trainer()
    first = BestCheckpoint(tmp_path, monitor="eval/a/loss")
    _fit(trainer, [first], steps=100)
    again = BestCheckpoint(tmp_path, monitor="eval/a/loss")
    assert (again.best_step, again.best_value, again.path) == (first.best_step, first.best_value, first.path)
    other = BestCheckpoint(tmp_path, monitor="eval/b/loss")  # another monitor starts afresh
    assert other.best_value is None
    _fit(trainer, [other], steps=10)
    assert glob.glob(str(tmp_path / "best-*.index")) == [other.path + ".index"]


# -- ReduceLROnPlateau ----------------------------------------------------------------------


def test_reduce_lr_on_plateau_changes_only_its_heads_rate():
    trainer = _trainer(lr=0.05)
    plateau = ReduceLROnPlateau("a", factor=0.5, patience=1, min_delta=1e-3, cooldown=1, min_lr=0.01)
    rates = []
    seen = LambdaCallback(on_eval_end=lambda step, m: rates.append(
        {h: float(trainer.optimizers[h].learning_rate.numpy()) for h in HEADS}))
    history = _fit(trainer, [plateau, seen], steps=300)

    # By hand (Keras' rule): cooldown evaluations after a reduction count no waiting;
    # `patience` non-improving evaluations in a row multiply the rate by the factor.
    lr, best, wait, cooldown, expected = np.float32(0.05), None, 0, 0, []
    for step, metrics in history.eval:
        value = metrics["a"]["loss"]
        if cooldown > 0:
            cooldown, wait = cooldown - 1, 0
        if best is None or value < best - 1e-3:
            best, wait = value, 0
        elif cooldown == 0:
            wait += 1
            if wait >= 1 and lr > 0.01:
                new = np.float32(max(float(lr) * 0.5, 0.01))
                expected.append((step, float(lr), float(new)))
                lr, cooldown, wait = new, 1, 0
    assert len(expected) >= 2, "the run should plateau more than once"
    assert plateau.reductions == expected
    assert [r["a"] for r in rates][-1] == float(lr)
    assert {r["b"] for r in rates} == {np.float32(0.05).item()}


def test_reduce_lr_refuses_a_schedule_and_an_unknown_head():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.5)
    trainer = mh.Trainer(_model(), {"a": mh.Objective("mse", keras.optimizers.Adam(schedule)),
                                    "b": mh.Objective("mse")})
    with pytest.raises(ValueError, match="head 'a' has a learning-rate schedule"):
        _fit(trainer, [ReduceLROnPlateau("a")], steps=10)
    with pytest.raises(ValueError, match=r"head 'c' is not a head of the trainer; heads are \['a', 'b'\]"):
        _fit(_trainer(), [ReduceLROnPlateau("c", monitor="eval/a/loss")], steps=10)


# -- what callbacks observe does not depend on steps_per_execution --------------------------


def _observe(spe, tmp_path):
    trainer = _trainer()
    seen = {"steps": [], "evals": []}
    record = LambdaCallback(
        on_step_end=lambda step, r: seen["steps"].append((step, r.step, r.losses, r.updated, r.skipped)),
        on_eval_end=lambda step, m: seen["evals"].append((step, m)))
    stop = EarlyStopping("eval/mean_loss", patience=3, min_delta=1e-3)
    plateau = ReduceLROnPlateau("b", factor=0.5, patience=1, min_delta=1e-3)
    best = BestCheckpoint(tmp_path / str(spe), monitor="eval/a/mae")
    history = _fit(trainer, [record, stop, plateau, best], steps=400, spe=spe)
    seen["decisions"] = (stop.stopped_step, stop.best_step, stop.best_value, plateau.reductions,
                         best.best_step, best.best_value, trainer.stop_reason)
    seen["history"] = (history.train, history.eval)
    seen["weights"] = _weights(trainer.model)
    return seen


@pytest.mark.parametrize("spe", [pytest.param(7, marks=pytest.mark.slow), "auto"])
def test_steps_per_execution_changes_nothing_callbacks_observe(tmp_path, spe):
    """`"auto"` (the default) in the default suite; a fixed count with -m slow."""
    one = _observe(1, tmp_path)
    for spe in (spe,):
        other = _observe(spe, tmp_path)
        assert one["decisions"][0] is not None  # early stopping did stop: the case covers a stop
        for key in ("steps", "evals", "decisions", "history"):
            assert other[key] == one[key], (spe, key)
        _assert_bitwise(other["weights"], one["weights"])


# -- TerminateOnNonFinite -------------------------------------------------------------------


def test_terminate_on_nonfinite_stops_at_the_first_nan_training_loss():
    trainer = _trainer()
    stop = TerminateOnNonFinite()
    history = _fit(trainer, [stop], steps=50, spe=1, train=_data(320, 1, nan_head="b"))
    assert stop.stopped_step == 1 == trainer.global_step  # one step per call: stops right there
    assert history.train["b"] == []  # its update was skipped (Objective(on_nonfinite="skip"))
    assert trainer.stop_reason == "TerminateOnNonFinite: the training loss of head 'b' was nan at step 1"


def test_terminate_on_nonfinite_stops_at_a_nan_evaluation():
    trainer = _trainer()
    stop = TerminateOnNonFinite()
    _fit(trainer, [stop], steps=50, spe=4, eval_data=_data(64, 3, nan_head="a"))
    assert stop.stopped_step == EVAL_EVERY == trainer.global_step
    assert "eval/a/loss was nan" in trainer.stop_reason


# -- LambdaCallback and the protocol --------------------------------------------------------


def test_lambda_callback_hooks_and_every():
    calls = []
    callback = LambdaCallback(on_train_begin=lambda: calls.append("begin"),
                              on_call_end=lambda step: calls.append(step),
                              on_train_end=lambda: calls.append("end"), every=6)
    _fit(_trainer(), [callback], steps=20, spe=1000)
    # Calls end at multiples of 6 (LambdaCallback.every) and 10 (eval_every), and at 20.
    assert calls == ["begin", 6, 10, 12, 18, 20, "end"]


# -- Keras callbacks ------------------------------------------------------------------------


def test_keras_early_stopping_stops_and_restores_the_best_weights():
    trainer = _trainer()
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=1e-3,
                                         restore_best_weights=True)
    record, saved = _snapshots()
    history = _fit(trainer, [record, stop], steps=400)
    values = [m["a"]["loss"] + m["b"]["loss"] for _, m in history.eval]  # val_loss: the sum
    # Keras' comparison: current + min_delta < best.
    best, best_i, wait, stop_i = None, None, 0, None
    for i, v in enumerate(values):
        wait += 1
        if best is None or v + 1e-3 < best:
            best, best_i, wait = v, i, 0
        elif wait >= 2:
            stop_i = i
            break
    assert stop_i is not None and stop.stopped_epoch == stop_i == len(history.eval) - 1
    assert trainer.stop_reason == f"EarlyStopping (Keras) set stop_training at step {history.eval[-1][0]}"
    _assert_bitwise(_weights(trainer.model), saved[history.eval[best_i][0]])


def test_keras_csv_logger_rows_equal_the_history(tmp_path):
    trainer = _trainer()
    path = tmp_path / "log.csv"
    history = _fit(trainer, [keras.callbacks.CSVLogger(str(path))], steps=50)
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(history.eval) == 5
    for epoch, (row, (step, metrics)) in enumerate(zip(rows, history.eval)):
        assert int(row["epoch"]) == epoch and int(float(row["step"])) == step
        for head in HEADS:
            assert float(row[f"val_{head}_loss"]) == pytest.approx(metrics[head]["loss"], rel=1e-12)
            assert float(row[f"val_{head}_mae"]) == pytest.approx(metrics[head]["mae"], rel=1e-12)
            last = dict(history.train[head])[step - 1]  # the training loss of the eval's step
            assert float(row[f"{head}_loss"]) == pytest.approx(last, rel=1e-12)
        assert float(row["val_loss"]) == pytest.approx(sum(metrics[h]["loss"] for h in HEADS), rel=1e-12)


def test_keras_terminate_on_nan_stops():
    trainer = _trainer()
    history = _fit(trainer, [keras.callbacks.TerminateOnNaN()], steps=50, spe=1,
                   train=_data(320, 1, nan_head="a"))
    assert trainer.global_step == 1 and history.train["a"] == []  # skipped: NaN loss
    assert trainer.stop_reason == "TerminateOnNaN (Keras) set stop_training at step 1"


def test_keras_lambda_callback_is_called_per_step_and_per_evaluation():
    batches, epochs, ends = [], [], []
    callback = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batches.append((batch, logs["loss"])),
        on_epoch_end=lambda epoch, logs: epochs.append((epoch, logs["val_loss"])),
        on_train_end=lambda logs: ends.append(logs))
    history = _fit(_trainer(), [callback], steps=30, spe="auto")
    assert [b for b, _ in batches] == list(range(30))
    assert [loss for _, loss in batches] == [history.train["a"][i][1] + history.train["b"][i][1]
                                            for i in range(30)]
    assert [e for e, _ in epochs] == [0, 1, 2]
    assert len(ends) == 1 and ends[0]["step"] == 30


def test_keras_callback_asking_for_more_than_the_proxy_has_says_so():
    callback = keras.callbacks.LambdaCallback(on_train_begin=lambda logs: callback.model.optimizer)
    with pytest.raises(AttributeError, match="only stop_training, weights.*multihead.ReduceLROnPlateau"):
        _fit(_trainer(), [callback], steps=5)


# -- argument checks ------------------------------------------------------------------------

BAD_ARGUMENTS = [
    (lambda: EarlyStopping("val_loss"), r"EarlyStopping: monitor must be 'eval/<head>/<metric>'"),
    (lambda: EarlyStopping("eval/a/loss", patience=0), r"^EarlyStopping.patience: must be >= 1, got 0$"),
    (lambda: EarlyStopping(min_delta=-1), r"^EarlyStopping.min_delta: must be >= 0, got -1$"),
    (lambda: EarlyStopping(mode="lowest"), r"^EarlyStopping.mode: must be one of \['auto', 'min', 'max'\], got 'lowest'$"),
    (lambda: EarlyStopping("eval/a/widgets"), r"mode='auto' cannot tell whether 'eval/a/widgets'"),
    (lambda: EarlyStopping(lambda m: 0.0), r"pass mode='min' or mode='max'"),
    (lambda: EarlyStopping(restore_best="yes"), r"^EarlyStopping.restore_best: must be one of \[True, False\], got 'yes'$"),
    (lambda: ReduceLROnPlateau("a", factor=1.0), r"^ReduceLROnPlateau.factor: must be in \(0, 1\), got 1.0$"),
    (lambda: ReduceLROnPlateau("a", min_lr=float("nan")), r"^ReduceLROnPlateau.min_lr: must be a finite number, got nan$"),
    (lambda: ReduceLROnPlateau("a", cooldown=-1), r"^ReduceLROnPlateau.cooldown: must be >= 0, got -1$"),
    (lambda: ReduceLROnPlateau(3), r"ReduceLROnPlateau: head must be a head name, got 3"),
    (lambda: LambdaCallback(on_step_end=1), r"LambdaCallback: on_step_end must be callable, got 1"),
    (lambda: LambdaCallback(every=0), r"^LambdaCallback.every: must be >= 1, got 0$"),
    (lambda: BestCheckpoint("d", monitor="eval/a"), r"BestCheckpoint: monitor must be"),
    (lambda: BestCheckpoint(None), r"BestCheckpoint: directory must be a path, got None"),
]


@pytest.mark.parametrize("make,message", BAD_ARGUMENTS)
def test_bad_arguments_fail_at_construction_naming_the_argument(make, message):
    with pytest.raises((ValueError, TypeError), match=message) as info:
        make()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("make", [lambda: EarlyStopping("eval/c/loss"),
                                  lambda: ReduceLROnPlateau("a", monitor="eval/a/acc", mode="max")])
def test_an_unknown_monitor_key_fails_at_the_first_evaluation_listing_the_keys(make):
    trainer = _trainer()
    with pytest.raises(ValueError, match=r"is not in the evaluation; available: \['eval/a/loss', "
                                         r"'eval/a/mae', 'eval/b/loss', 'eval/b/mae', 'eval/mean_loss'\]"):
        _fit(trainer, [make()], steps=30)
    assert trainer.global_step == EVAL_EVERY


def test_something_that_is_no_callback_is_refused():
    with pytest.raises(TypeError, match=r"callbacks\[0\] must be a multihead.Callback or a keras"):
        _fit(_trainer(), [object()], steps=5)


def test_monitored_quantity_direction_from_the_name():
    assert MonitoredQuantity("eval/a/mae", "auto", "X").mode == "min"
    assert MonitoredQuantity("eval/a/binary_accuracy", "auto", "X").mode == "max"
    assert MonitoredQuantity("eval/a/auc", "max", "X").improves(0.9, best=0.8, min_delta=0.05)
    assert not MonitoredQuantity("eval/a/loss", "min", "X").improves(float("nan"), None, 0.0)
