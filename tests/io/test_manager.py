"""CheckpointManager: cadence, keep-N, fallback from damaged checkpoints, the fit callback."""

import os

import keras
import numpy as np
import pytest
from conftest import make_batch, make_model, weights

import multihead as mh
from multihead.training.callbacks import Callback
from multihead.io.manager import CheckpointCallback, CheckpointManager

HEADS = ("a", "b")


def _trainer(model):
    return mh.Trainer(model, {"a": mh.Objective("mse", keras.optimizers.Adam(1e-2)),
                              "b": mh.Objective("mse", keras.optimizers.SGD(0.05, momentum=0.9),
                                                every=2)})


def _manager_run(directory, steps, every=5):
    model = make_model(seed=1)
    trainer = _trainer(model)
    manager = CheckpointManager(directory, model, trainer, every=every, keep=3)
    data = make_batch(HEADS, n=40, seed=7)
    trainer.fit(data, steps, batch_size=8, verbose=False, checkpoints=manager)
    return model, trainer, manager, data


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, damage):
    model, trainer, manager, data = _manager_run(tmp_path, 10)
    at_ten = weights(model.weights)
    trainer.fit(data, 5, batch_size=8, verbose=False, checkpoints=manager)
    assert [CheckpointManager.step_of(p) for p in manager.checkpoints] == [5, 10, 15]
    (data_file,) = [f for f in os.listdir(tmp_path) if f.startswith("ckpt-15.data")]
    path = tmp_path / data_file
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    else:
        middle = len(raw) // 2
        path.write_bytes(raw[:middle] + bytes(b ^ 0xFF for b in raw[middle:middle + 16])
                         + raw[middle + 16:])

    fresh_model = make_model(seed=4)
    fresh = _trainer(fresh_model)
    with pytest.warns(RuntimeWarning, match=r"ckpt-15.*falling back to .*ckpt-10"):
        step = CheckpointManager(tmp_path, fresh_model, fresh, every=5).restore_latest()
    assert step == 10 and fresh.global_step == 10
    for a, v in zip(at_ten, fresh_model.weights):
        np.testing.assert_array_equal(a, v.numpy())


class _Crash(Exception):
    """Stands for the process dying."""


def test_crash_during_save_never_leaves_the_manager_on_a_partial_checkpoint(tmp_path, monkeypatch):
    """A checkpoint whose files are complete counts though the state file never named it
    (the directory is scanned); a half-written one does not."""
    model, trainer, manager, data = _manager_run(tmp_path, 10)

    # Crash after ckpt-15's files are written but before the state file names it ...
    def crash_before_recording(*args, **kwargs):
        raise _Crash()

    monkeypatch.setattr(manager._manager, "_record_state", crash_before_recording)
    with pytest.raises(_Crash):
        trainer.fit(data, 5, batch_size=8, verbose=False, checkpoints=manager)
    assert any(f.startswith("ckpt-15") for f in os.listdir(tmp_path))
    at_fifteen = weights(model.weights)
    # ... and a half-written ckpt-20 (a data file cut short, no index) from a crash mid-write.
    (data10,) = [f for f in os.listdir(tmp_path) if f.startswith("ckpt-10.data")]
    (tmp_path / data10.replace("ckpt-10", "ckpt-20")).write_bytes(
        (tmp_path / data10).read_bytes()[:100])

    fresh_model = make_model(seed=4)
    fresh = _trainer(fresh_model)
    reopened = CheckpointManager(tmp_path, fresh_model, fresh, every=5)
    assert reopened.latest_checkpoint.endswith("ckpt-15")
    assert reopened.restore_latest() == 15
    for a, v in zip(at_fifteen, fresh_model.weights):
        np.testing.assert_array_equal(a, v.numpy())


def test_manager_keeps_the_last_n_and_validates_arguments(tmp_path):
    _, _, manager, _ = _manager_run(tmp_path, 20, every=4)
    assert [CheckpointManager.step_of(p) for p in manager.checkpoints] == [12, 16, 20]
    with pytest.raises(ValueError, match="^CheckpointManager.every: must be >= 0, got -1; 0 disables periodic saves$"):
        CheckpointManager(tmp_path, make_model(), every=-1)
    fresh = make_model()
    assert CheckpointManager(tmp_path / "empty", fresh).restore_latest() is None


def test_cadence_saves_once_per_period_even_when_steps_jump(tmp_path):
    model = make_model()
    trainer = _trainer(model)
    manager = CheckpointManager(tmp_path, model, trainer, every=5, keep=10)
    saved = []
    for step in [1, 2, 4, 5, 6, 9, 12, 13, 16, 20, 20]:  # e.g. 1-4 steps per execution
        trainer.step_variable.assign(step)
        if manager.maybe_save(step):
            saved.append(step)
    assert saved == [5, 12, 16, 20]  # first step at or past 5, 10, 15 and 20; 20 only once


def test_callback_saves_on_the_managers_cadence(tmp_path):
    model = make_model()
    trainer = _trainer(model)
    manager = CheckpointManager(tmp_path, model, trainer, every=5)
    callback = manager.callback()
    assert isinstance(callback, Callback) and isinstance(callback, CheckpointCallback)
    assert callback.every == 5  # fit ends its compiled calls at multiples of 5
    assert CheckpointManager(tmp_path / "never", model, trainer).callback().every is None
    for step in (3, 4, 5, 7):
        trainer.step_variable.assign(step)
        callback.on_call_end(step)
    assert [CheckpointManager.step_of(p) for p in manager.checkpoints] == [5]


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_fit_saves_through_the_callback_at_every_multiple(tmp_path, steps_per_execution):
    model = make_model(seed=1)
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in HEADS})
    manager = CheckpointManager(tmp_path, model, trainer, every=4, keep=10)
    trainer.fit(make_batch(HEADS, n=40, seed=7), 13, batch_size=8, verbose=False, checkpoints=manager,
                steps_per_execution=steps_per_execution)
    assert [CheckpointManager.step_of(p) for p in manager.checkpoints] == [4, 8, 12]


def test_host_state_and_a_counter_number_and_restore_checkpoints(tmp_path):
    """`host=` parts are saved and restored with the rest; `counter=` numbers the checkpoints
    and drives the cadence (an RL run counts environment steps, not updates)."""
    from multihead.rl.host_state import HostState, from_json, to_json

    model = make_model(seed=1)
    trainer = _trainer(model)
    box = {"env_steps": 0, "note": "a"}
    host = {"loop": HostState(lambda: {"box": to_json(box)},
                              lambda saved: box.update(from_json(saved["box"])))}
    manager = CheckpointManager(tmp_path, model, trainer, every=10, host=host,
                                counter=lambda: box["env_steps"])
    for steps in (4, 8, 12, 16, 23):  # an RL loop advances by several env steps at once
        box["env_steps"], box["note"] = steps, f"at {steps}"
        manager.maybe_save(steps)
    assert [CheckpointManager.step_of(p) for p in manager.checkpoints] == [12, 23]
    box.update(env_steps=0, note="lost")
    assert manager.restore_latest() == 23 and box == {"env_steps": 23, "note": "at 23"}
