"""`TrainingState`: the trainer's surface that checkpoints read, and nothing more."""

import numpy as np
import pytest

import multihead as mh
from conftest import make_batch, make_model


def _trainer(**kwargs):
    return mh.Trainer(make_model(), {"a": mh.Objective("mse", optimizer="adam"),
                                     "b": mh.Objective("mse", optimizer="sgd")}, **kwargs)


@pytest.mark.parametrize("trunk,parts", [
    ("per_head", ["optimizers/a", "optimizers/b", "step", "data", "frozen"]),
    ({"aggregator": "sum"}, ["optimizers/a", "optimizers/b", "trunk_update", "step", "data",
                              "frozen"]),
])
def test_the_state_lists_the_trainer_parts_a_checkpoint_holds(trunk, parts):
    trainer = _trainer(trunk=trunk)
    state = trainer.checkpoint_state()
    objects = state.parts()
    assert list(objects) == parts
    assert mh.available_parts(trainer.model, trainer) == (
        ["trunk", "heads/a", "heads/b", "rng"] + parts)
    assert objects["optimizers/a"] is trainer.optimizers["a"]
    assert objects["step"] is trainer.step_variable and objects["data"] is trainer.data_position
    assert state.is_chief and state.log_dir is None


def test_the_state_reads_the_step_and_log_dir_of_its_trainer(tmp_path):
    trainer = _trainer(log_dir=str(tmp_path))
    for _ in range(3):
        trainer.step(make_batch())
    state = trainer.checkpoint_state()
    assert state.global_step == 3 == trainer.global_step
    assert state.log_dir == str(tmp_path)
    trainer.close()


class _OnlyTheSurface:
    """A stand-in that offers io/ only what the Trainer's checkpoint surface promises:
    `model`, `build_optimizers` and `checkpoint_state`."""

    def __init__(self, trainer):
        self.model = trainer.model
        self.build_optimizers = trainer.build_optimizers
        self.checkpoint_state = trainer.checkpoint_state


def test_checkpoints_need_nothing_but_the_surface(tmp_path):
    """Saving, restoring and the manager's resume go through `checkpoint_state` only:
    the restored optimizer slots, step and data position equal the saved ones."""
    source = _trainer()
    data = make_batch(n=64)
    source.fit(data, steps=5, batch_size=16, verbose=False)
    path = mh.save_checkpoint(str(tmp_path / "c"), source.model, trainer=_OnlyTheSurface(source))
    target = _trainer()
    restored = mh.restore_checkpoint(path, target.model, trainer=_OnlyTheSurface(target))
    assert "data" in restored and target.global_step == 5
    for h in ("a", "b"):
        for mine, theirs in zip(target.optimizers[h].variables, source.optimizers[h].variables):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    # The restored data position continues the stream: the next steps see the same batches.
    source.fit(data, steps=3, batch_size=16, verbose=False)
    target.fit(data, steps=3, batch_size=16, verbose=False)
    for mine, theirs in zip(target.model.weights, source.model.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())

    manager = mh.CheckpointManager(str(tmp_path / "m"), source.model, _OnlyTheSurface(source))
    saved = manager.save()
    assert manager.step_of(saved) == 8
    again = mh.CheckpointManager(str(tmp_path / "m"), target.model, _OnlyTheSurface(_fresh(target)))
    assert again.restore_latest() == 8


def _fresh(trainer):
    return mh.Trainer(trainer.model, {"a": mh.Objective("mse", optimizer="adam"),
                                      "b": mh.Objective("mse", optimizer="sgd")})
