"""Partial checkpoints: restore into fresh models, stable keys, mismatch errors."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_batch, make_model, weights

import multihead as mh

HEADS = ("a", "b")


def _trainer(model, log_dir=None):
    return mh.Trainer(model, {"a": mh.Objective("mse", keras.optimizers.Adam(1e-2)),
                              "b": mh.Objective("mse", keras.optimizers.SGD(0.05, momentum=0.9),
                                                every=2)}, log_dir=log_dir)


def _train(trainer, n, start=0):
    for s in range(start, start + n):
        trainer.step(make_batch(HEADS, seed=s))


def test_trunk_only_restore_into_a_model_with_other_heads(tmp_path):
    source = make_model(seed=1)
    _train(_trainer(source), 3)
    path = mh.save_checkpoint(tmp_path / "trunk", source, parts=["trunk"])
    assert mh.checkpoint_parts(path) == ["trunk"]

    other = make_model(heads=("x", "y", "z"), seed=2)
    heads_before = weights(other.heads["x"].weights)
    assert mh.restore_checkpoint(path, other, parts=["trunk"]) == ["trunk"]
    for a, b in zip(source.trunk.weights, other.trunk.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for before, v in zip(heads_before, other.heads["x"].weights):
        np.testing.assert_array_equal(before, v.numpy())
    x, _ = make_batch(HEADS)
    np.testing.assert_array_equal(source.features(x).numpy(), other.features(x).numpy())


def test_full_restore_into_a_fresh_model_and_trainer_continues_identically(tmp_path):
    model = make_model(seed=1, dropout=0.25)
    trainer = _trainer(model)
    _train(trainer, 5)
    path = mh.save_checkpoint(tmp_path / "all", model, trainer=trainer)

    fresh_model = make_model(seed=9, dropout=0.25)
    fresh = _trainer(fresh_model)
    restored = mh.restore_checkpoint(path, fresh_model, trainer=fresh)
    assert restored == mh.available_parts(model, trainer)
    assert {"rng", "step", "data", "optimizers/a", "optimizers/b"} <= set(restored)
    assert fresh.global_step == 5
    for h in HEADS:  # every slot, at the same position of the same optimizer
        for a, b in zip(trainer.optimizers[h].variables, fresh.optimizers[h].variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # The next steps (dropout masks drawn from the restored seed state, b due on even
    # steps) are bitwise those of the original.
    _train(trainer, 3, start=5)
    _train(fresh, 3, start=5)
    for a, b in zip(model.weights, fresh_model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_checkpoint_keys_do_not_depend_on_keras_auto_names(tmp_path):
    first = mh.save_checkpoint(tmp_path / "first", make_model(seed=1))
    for _ in range(7):  # advances Keras' auto-naming counters (dense_12, sequential_5, ...)
        keras.Sequential([keras.layers.Dense(2)]).build((None, 3))
    second_model = make_model(seed=1)
    second = mh.save_checkpoint(tmp_path / "second", second_model)
    assert [v.path for v in second_model.trunk.weights] != [
        v.path for v in make_model(seed=1).trunk.weights]  # Keras names did move on
    keys = [k for k, _ in tf.train.list_variables(first)]
    assert keys == [k for k, _ in tf.train.list_variables(second)]
    assert not any("dense" in k or "sequential" in k for k in keys)


def test_restore_into_other_shapes_or_heads_is_one_error_listing_every_part(tmp_path):
    source = make_model(seed=1)
    path = mh.save_checkpoint(tmp_path / "ckpt", source)
    keras.utils.set_random_seed(3)
    other = mh.MultiHeadModel(
        trunk=source.trunk.__class__.from_config(source.trunk.get_config()),
        heads={"a": keras.Sequential([keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]),
               "b": keras.Sequential([keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(3)]),
               "c": keras.layers.Dense(1)})
    other.build((None, 5))
    before = weights(other.weights)
    with pytest.raises(mh.CheckpointMismatchError) as err:
        mh.restore_checkpoint(path, other)
    assert set(err.value.mismatches) == {"heads/b", "heads/c"}
    message = str(err.value)
    assert "(4, 1)" in message and "(4, 3)" in message  # checkpoint vs model shape of heads/b
    assert "heads/c: not in the checkpoint (it has trunk, heads/a, heads/b, rng)" in message
    for b, v in zip(before, other.weights):  # nothing assigned, not even the matching trunk
        np.testing.assert_array_equal(b, v.numpy())
    mh.restore_checkpoint(path, other, parts=["trunk", "heads/a"])  # the matching parts do restore
    np.testing.assert_array_equal(other.trunk.weights[0].numpy(), source.trunk.weights[0].numpy())


def test_bad_part_names_are_clear_errors(tmp_path):
    model = make_model()
    with pytest.raises(ValueError, match=r"unknown checkpoint part 'heads/zz'; parts are \['trunk'"):
        mh.save_checkpoint(tmp_path / "x", model, parts=["heads/zz"])
    with pytest.raises(ValueError, match="need trainer="):
        mh.save_checkpoint(tmp_path / "x", model, parts=["optimizers/a"])
    with pytest.raises(TypeError, match=r"write parts=\['trunk'\]"):
        mh.save_checkpoint(tmp_path / "x", model, parts="trunk")
    with pytest.raises(mh.CheckpointReadError, match="cannot read checkpoint"):
        mh.restore_checkpoint(tmp_path / "missing", model)


def test_group_parts_and_targets_part(tmp_path):
    model = make_model(seed=1)
    target = mh.TargetNetwork(model, heads=["a"], every=3)
    counter = tf.Module()
    counter.calls = tf.Variable(7, dtype=tf.int64)
    _train(_trainer(model), 2)
    for _ in range(4):
        target.update()  # the 3rd call syncs: the copy now equals the trained model
    path = mh.save_checkpoint(tmp_path / "t", model, parts=["heads", "targets"],
                              targets={"value": target, "counter": counter})
    assert mh.checkpoint_parts(path) == ["heads/a", "heads/b", "targets/counter", "targets/value"]

    fresh_model = make_model(seed=5)
    fresh_target = mh.TargetNetwork(fresh_model, heads=["a"], every=3)
    fresh_counter = tf.Module()
    fresh_counter.calls = tf.Variable(0, dtype=tf.int64)
    mh.restore_checkpoint(path, fresh_model, parts=["targets"],
                          targets={"value": fresh_target, "counter": fresh_counter})
    assert int(fresh_target.counter.numpy()) == 4 and int(fresh_counter.calls.numpy()) == 7
    for a, b in zip(target.target_weights, fresh_target.target_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("aggregator", ["pcgrad", "dwa"])
def test_aggregated_trunk_update_state_is_a_part_and_resumes_exactly(tmp_path, aggregator):
    """PCGrad's projection-order generator and DWA's loss history live in `trunk_update`."""
    def trainer(seed):
        model = make_model(seed=seed)
        return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in HEADS},
                          trunk=mh.TrunkPolicy(aggregator=aggregator, options={}, seed=4))

    original = trainer(1)
    _train(original, 4)
    assert "trunk_update" in mh.available_parts(original.model, original)
    path = mh.save_checkpoint(tmp_path / "agg", original.model, trainer=original)
    fresh = trainer(6)
    mh.restore_checkpoint(path, fresh.model, trainer=fresh)
    for a, b in zip(original.trunk_update.variables, fresh.trunk_update.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    _train(original, 4, start=4)
    _train(fresh, 4, start=4)
    for a, b in zip(original.model.weights, fresh.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_data_position_fast_forwards_a_fresh_dataset_to_the_same_batches():
    from multihead.datasets.multitask import DataPosition

    data = make_batch(HEADS, n=50, seed=3)  # batches of 8: 7 per epoch (the last has 2)
    original = DataPosition()
    stream = original.cycle(mh.as_dataset(data, 8, seed=1))
    for _ in range(17):
        next(stream)
    assert (int(original.epoch.numpy()), int(original.batch.numpy())) == (2, 3)  # 17 = 7 + 7 + 3
    expected = [next(stream)[0].numpy() for _ in range(12)]  # crosses two epoch boundaries

    restored = DataPosition()
    restored.epoch.assign(2)
    restored.batch.assign(3)
    restored.mark_restored()
    resumed = restored.cycle(mh.as_dataset(data, 8, seed=1))
    for want in expected:
        np.testing.assert_array_equal(next(resumed)[0].numpy(), want)

    fresh = DataPosition()  # without a restore, each cycle starts at the first batch again
    fresh.epoch.assign(2)
    np.testing.assert_array_equal(next(fresh.cycle(mh.as_dataset(data, 8, seed=1)))[0].numpy(),
                                  next(iter(mh.as_dataset(data, 8, seed=1)))[0].numpy())

    restored.batch.assign(9)
    restored.mark_restored()
    with pytest.raises(ValueError, match="has only 7 batches.*without the 'data' part"):
        next(restored.cycle(mh.as_dataset(data, 8, seed=1)))
