"""`HeadEarlyStopping`: each head frozen at its own plateau while the others train on.

Expectations come from the evaluations `fit` recorded (`history.eval`) and from an
independent run of the other heads alone (`Trainer.step(heads=...)`) from the stop step's
checkpoint, never from the callback under test.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import multihead as mh
from multihead.training.callbacks import LambdaCallback
from test_callbacks import _plateau  # the stopping rule, by hand (tests/training is on the path)

HEADS = ("a", "b")
EVAL_EVERY = 10
BATCH = 32


def _data(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 5)).astype("float32")
    y = {"a": (x @ np.array([1.0, -2.0, 0.5, 0.0, 1.0]))[:, None] + 0.3 * rng.standard_normal((rows, 1)),
         "b": np.sin(2 * x[:, :1]) + 0.3 * rng.standard_normal((rows, 1))}
    return x, {h: v.astype("float32") for h, v in y.items()}


TRAIN, EVAL = _data(320, seed=1), _data(200, seed=2)


def _trainer() -> mh.Trainer:
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(keras.layers.Dense(8, activation="tanh"),
                              {h: keras.layers.Dense(1) for h in HEADS})
    model.build((None, 5))
    # b's large rate makes its eval loss stall early; a keeps improving.
    rates = {"a": 0.01, "b": 0.2}
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(rates[h])) for h in HEADS})


def _fit(trainer, callbacks, steps=300, verbose=False):
    return trainer.fit(TRAIN, steps, batch_size=BATCH, eval_data=EVAL, eval_every=EVAL_EVERY,
                       verbose=verbose, callbacks=callbacks)


def _values(variables):
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_a_stopped_head_stays_bitwise_and_the_trunk_moves_as_without_it(tmp_path):
    trainer = _trainer()
    model, head_b = trainer.model, trainer.optimizers["b"]
    stop = mh.HeadEarlyStopping(heads=["b"], patience=2, min_delta=1e-3)
    saved = {}

    def keep(step):  # the full training state and b's variables and slots at each evaluation
        path = mh.save_checkpoint(str(tmp_path / f"at-{step}"), model, trainer=trainer)
        saved[step] = (path, _values(model.head_variables("b")), _values(head_b.variables))

    history = _fit(trainer, [stop, LambdaCallback(on_call_end=keep, every=EVAL_EVERY)])
    stop_i, best_i = _plateau([m["b"]["loss"] for _, m in history.eval], 2, 1e-3)
    steps = [s for s, _ in history.eval]
    assert stop_i is not None and steps[stop_i] < trainer.global_step == 300
    at = steps[stop_i]
    assert stop.watches["b"].stopped_step == at and trainer.frozen == ("b",)
    assert stop.watches["b"].best_step == steps[best_i]
    assert not trainer.stop_training  # a trains on
    # From its stop on, b's variables, iteration count and slots never changed.
    _assert_bitwise(_values(model.head_variables("b")), saved[at][1])
    _assert_bitwise(_values(head_b.variables), saved[at][2])
    # The other head alone from the stop step's checkpoint, on the same batches.
    alone = _trainer()
    alone.build_optimizers()
    mh.restore_checkpoint(saved[at][0], alone.model, trainer=alone)
    batches = iter(mh.as_dataset(TRAIN, batch_size=BATCH, seed=0).repeat().skip(at))
    for _ in range(trainer.global_step - at):
        alone.step(next(batches), heads=["a"])
    _assert_bitwise(_values(alone.model.trunk_variables), _values(model.trunk_variables))
    _assert_bitwise(_values(alone.model.head_variables("a")), _values(model.head_variables("a")))
    _assert_bitwise(_values(alone.optimizers["a"].variables), _values(trainer.optimizers["a"].variables))


def test_fit_stops_when_every_head_is_frozen_and_prints_a_line_per_head(capsys):
    trainer = _trainer()
    stop = mh.HeadEarlyStopping(patience=2, min_delta=10.0)  # nothing improves by 10
    history = _fit(trainer, [stop], verbose=True)
    steps = [s for s, _ in history.eval]
    # The first evaluation is each head's best; the 3rd (2 without improvement) freezes both.
    assert steps == [10, 20, 30] and trainer.global_step == 30
    assert trainer.frozen == HEADS
    lines = [line for line in capsys.readouterr().err.splitlines() if "HeadEarlyStopping" in line]
    expected = [f"HeadEarlyStopping: eval/{h}/loss did not improve by more than 10 for 2 "
                f"evaluation(s) (best {history.eval[0][1][h]['loss']:.6g} at step 10); froze head "
                f"{h!r} at step 30; weights not restored" for h in HEADS]
    assert lines == expected + ["HeadEarlyStopping: every head is frozen; stopped at step 30"]
    assert trainer.stop_reason == lines[-1]


def test_a_head_unfrozen_by_a_callback_trains_and_is_watched_again():
    trainer = _trainer()
    stop = mh.HeadEarlyStopping(heads=["b"], patience=1, min_delta=10.0)  # frozen at the 2nd eval
    seen = {}

    def thaw(step, metrics):
        seen[step] = _values(trainer.model.head_variables("b"))
        if step == 20:
            trainer.unfreeze("b")

    _fit(trainer, [stop, LambdaCallback(on_eval_end=thaw)], steps=40, verbose=False)
    # Frozen at 20, thawed there, trained 21..30, frozen again at 30 (no improvement by 10).
    assert stop.watches["b"].stopped_step == 30 and trainer.frozen == ("b",)
    assert any((x != y).any() for x, y in zip(seen[20], seen[30]))
    _assert_bitwise(seen[30], seen[40])
    assert trainer.global_step == 40  # a trains on


def test_a_resumed_fit_replays_the_record_and_continues_exactly(tmp_path):
    def run(split):
        trainer = _trainer()
        stop = mh.HeadEarlyStopping(patience=2, min_delta=1e-3, record=tmp_path / f"{split}.json")
        if split is None:
            _fit(trainer, [stop], steps=300)
            return trainer, stop
        _fit(trainer, [stop], steps=split)
        path = mh.save_checkpoint(str(tmp_path / "ckpt"), trainer.model, trainer=trainer)
        resumed = _trainer()
        resumed.build_optimizers()
        mh.restore_checkpoint(path, resumed.model, trainer=resumed)
        again = mh.HeadEarlyStopping(patience=2, min_delta=1e-3, record=tmp_path / f"{split}.json")
        _fit(resumed, [again], steps=300 - split)
        return resumed, again

    full, full_stop = run(None)
    b_stop = full_stop.watches["b"].stopped_step
    assert b_stop is not None and b_stop < full.global_step
    resumed, stop = run(b_stop + EVAL_EVERY)  # b was frozen before the interruption
    assert resumed.global_step == full.global_step and resumed.frozen == full.frozen
    assert _states(stop) == _states(full_stop)
    _assert_bitwise(_values(resumed.model.weights), _values(full.model.weights))


def _states(stop):
    return {h: (w.best_step, w.best_value, w.wait, w.stopped_step, w.reason)
            for h, w in stop.watches.items()}


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="heads must be a non-empty list"):
        mh.HeadEarlyStopping(heads="a")
    with pytest.raises(ValueError, match="patience"):
        mh.HeadEarlyStopping(patience=0)
    trainer = _trainer()
    with pytest.raises(ValueError, match="'c'"):
        _fit(trainer, [mh.HeadEarlyStopping(heads=["c"])], steps=10)
