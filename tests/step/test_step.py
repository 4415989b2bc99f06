"""The compiled step against a hand-written GradientTape + Keras optimizer reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model, weights

HEADS = ("a", "b")


def _optimizers():
    return {"a": keras.optimizers.Adam(1e-2), "b": keras.optimizers.SGD(5e-2, momentum=0.9)}


def _mse(y, pred):
    return tf.reduce_mean(tf.square(y - pred))


def _reference(model, schedule, every, weight, batches):
    """What a researcher would write by hand: one tape, one Keras optimizer per head,
    `apply_gradients` on var_list = trunk + head, heads due when step % every == 0."""
    opts = _optimizers()
    for h in HEADS:
        opts[h].build(model.var_list(h))
    for step, (x, y) in enumerate(batches):
        due = [h for h in HEADS if step % every[h] == 0]
        if schedule == "simultaneous":
            with tf.GradientTape(persistent=True) as tape:
                feats = model.trunk(x, training=True)
                losses = {h: weight[h] * _mse(y[h], model.heads[h](feats, training=True)) for h in HEADS}
            for h in due:
                grads = tape.gradient(losses[h], model.var_list(h))
                opts[h].apply_gradients(zip(grads, model.var_list(h)))
        else:
            for h in due:
                with tf.GradientTape() as tape:
                    loss = weight[h] * _mse(y[h], model.heads[h](model.trunk(x, training=True),
                                                                 training=True))
                grads = tape.gradient(loss, model.var_list(h))
                opts[h].apply_gradients(zip(grads, model.var_list(h)))
    return opts


def _batches(n):
    return [make_batch(HEADS, seed=s) for s in range(n)]


@pytest.mark.parametrize("schedule", ["simultaneous", "sequential"])
@pytest.mark.parametrize("every_b", [1, 3])
def test_step_equals_hand_written_reference(schedule, every_b):
    every = {"a": 1, "b": every_b}
    weight = {"a": 1.0, "b": 0.5}
    batches = _batches(20)
    ours, ref = make_model(seed=3), make_model(seed=3)
    opts = _optimizers()
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", opts[h], weight=weight[h], every=every[h])
                                for h in HEADS}, schedule=schedule)
    for batch in batches:
        trainer.step(batch)
    ref_opts = _reference(ref, schedule, every, weight, batches)
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    for h in HEADS:
        assert int(opts[h].iterations) == int(ref_opts[h].iterations) == len(
            [s for s in range(20) if s % every[h] == 0])


@pytest.mark.parametrize("schedule", ["simultaneous", "sequential"])
def test_step_of_head_a_leaves_head_b_and_its_slots_bitwise_unchanged(schedule):
    model = make_model()
    opts = {"a": keras.optimizers.Adam(1e-2), "b": keras.optimizers.Adam(1e-2)}
    trainer = mh.Trainer(model, {"a": mh.Objective("mse", opts["a"]),
                                 "b": mh.Objective("mse", opts["b"], every=2)}, schedule=schedule)
    trainer.step(make_batch(seed=0))  # step 0: both heads update, b's slots become non-zero
    b_vars, b_slots = weights(model.head_variables("b")), weights(opts["b"].variables)
    trunk = weights(model.trunk_variables)
    result = trainer.step(make_batch(seed=1))  # step 1: only a is due
    assert result.updated == ("a",)
    for before, v in zip(b_vars, model.head_variables("b")):
        np.testing.assert_array_equal(before, v.numpy())
    for before, v in zip(b_slots, opts["b"].variables):
        np.testing.assert_array_equal(before, v.numpy())
    assert any(not np.array_equal(t, v.numpy()) for t, v in zip(trunk, model.trunk_variables))


@pytest.mark.parametrize("schedule", ["simultaneous", "sequential"])
def test_head_that_does_not_train_trunk_never_changes_it(schedule):
    model = make_model()
    opt_b = keras.optimizers.Adam(1e-2)
    trainer = mh.Trainer(model, {"a": mh.Objective("mse", every=1000),
                                 "b": mh.Objective("mse", opt_b, trains_trunk=False)},
                         schedule=schedule)
    trunk = weights(model.trunk_variables)
    head_b = weights(model.head_variables("b"))
    for s in range(1, 6):  # step 0 updates a; steps 1..5 only b
        trainer.step(make_batch(seed=s))
    trunk_after_a = weights(model.trunk_variables)
    assert any(not np.array_equal(t, u) for t, u in zip(trunk, trunk_after_a))  # a moved it at step 0
    for s in range(6, 12):
        trainer.step(make_batch(seed=s))
    for t, v in zip(trunk_after_a, model.trunk_variables):
        np.testing.assert_array_equal(t, v.numpy())
    assert any(not np.array_equal(h, v.numpy()) for h, v in zip(head_b, model.head_variables("b")))
    trunk_ids = {id(v) for v in model.trunk_variables}
    slot_shapes = [tuple(v.shape) for v in opt_b.variables if len(v.shape)]
    assert sorted(slot_shapes) == sorted(2 * [tuple(v.shape) for v in model.head_variables("b")])
    assert not trunk_ids & {id(v) for v in opt_b._trainable_variables}


def test_mixed_every_does_not_retrace_per_step():
    model = make_model(heads=("a", "b", "c"))
    trainer = mh.Trainer(model, {"a": mh.Objective("mse"), "b": mh.Objective("mse", every=2),
                                 "c": mh.Objective("mse", every=7)})
    x, y = make_batch(("a", "b", "c"))
    seen = set()
    for _ in range(100):
        seen.add(trainer.step((x, y)).updated)
    assert len(seen) == 4  # (a), (a, b), (a, c), (a, b, c) all occurred
    assert trainer.trace_count == 1


def test_seed_case_layer1_shared_by_layer2_1_and_layer2_2():
    """TF1 seed: `layer1` shared, `layer2_1`/`layer2_2` heads, MSE, one optimizer per loss."""
    def build():
        keras.utils.set_random_seed(7)
        model = mh.MultiHeadModel(trunk=keras.layers.Dense(6, activation="relu", name="layer1"),
                                  heads={"layer2_1": keras.layers.Dense(1, name="layer2_1"),
                                         "layer2_2": keras.layers.Dense(1, name="layer2_2")})
        model.build((None, 4))
        return model

    x, y = make_batch(("layer2_1", "layer2_2"), input_dim=4)
    sgd = lambda: keras.optimizers.SGD(0.1)  # noqa: E731 - plain SGD: update = -lr * grad

    # Training only the first head for N steps leaves layer2_2 untouched.
    model = build()
    only_first = mh.Trainer(model, {"layer2_1": mh.Objective("mse", sgd()),
                                    "layer2_2": mh.Objective("mse", sgd(), every=10**9)})
    only_first.step((x, y))  # step 0 updates both; from now on only layer2_1
    frozen = weights(model.head_variables("layer2_2"))
    for _ in range(10):
        only_first.step((x, y))
    for f, v in zip(frozen, model.head_variables("layer2_2")):
        np.testing.assert_array_equal(f, v.numpy())

    # Training both moves layer1 by the sum of both optimizers' updates (SGD: -lr * g_k).
    model = build()
    before = weights(model.trunk_variables)
    with tf.GradientTape(persistent=True) as tape:
        out = model(x)
        losses = {h: tf.reduce_mean(tf.square(y[h] - out[h])) for h in out}
    expected = [b - 0.1 * (g1.numpy() + g2.numpy()) for b, g1, g2 in zip(
        before, tape.gradient(losses["layer2_1"], model.trunk_variables),
        tape.gradient(losses["layer2_2"], model.trunk_variables))]
    both = mh.Trainer(model, {"layer2_1": mh.Objective("mse", sgd()),
                              "layer2_2": mh.Objective("mse", sgd())})
    both.step((x, y))
    for e, v in zip(expected, model.trunk_variables):
        np.testing.assert_allclose(v.numpy(), e, rtol=0, atol=1e-6)


def test_research_loss_sees_whole_batch():
    model = make_model()

    def weighted_mse(inputs, targets, outputs):
        return tf.reduce_mean(targets["w"] * tf.square(targets["a"] - outputs))

    trainer = mh.Trainer(model, {"a": mh.Objective(weighted_mse), "b": mh.Objective("mse")})
    x, y = make_batch()
    y["w"] = np.zeros((16, 1), "float32")
    head_a = weights(model.head_variables("a"))
    result = trainer.step((x, y))
    assert result.losses["a"] == 0.0
    # zero loss -> zero gradient -> Adam leaves the head where it was
    for h, v in zip(head_a, model.head_variables("a")):
        np.testing.assert_array_equal(h, v.numpy())


def test_non_scalar_loss_is_a_clear_error():
    trainer = mh.Trainer(make_model(), {"a": mh.Objective(lambda i, t, o: tf.square(o)),
                                        "b": mh.Objective("mse")})
    with pytest.raises(ValueError, match="loss of head 'a' must be a scalar"):
        trainer.step(make_batch())


def test_steps_on_tensors_and_on_numpy_arrays_are_the_same_steps():
    """Tensors take a fast path (the traced concrete function, looked up by shapes and
    dtypes); numpy arrays take tf.function's own dispatch. Batches of changing sizes and
    heads' targets in any dict order give bitwise the same training either way."""
    def make():
        return mh.Trainer(make_model(seed=3), {"a": mh.Objective("mse", "adam"),
                                               "b": mh.Objective("mse", "sgd", every=2)})

    fast, general = make(), make()
    for seed, n in enumerate([8, 5, 8, 3, 5]):
        x, y = make_batch(n=n, seed=seed)
        y_tensors = {h: tf.constant(y[h]) for h in (["b", "a"] if seed % 2 else ["a", "b"])}
        a = fast.step((tf.constant(x), y_tensors))
        b = general.step((x, y))
        assert a == b
    for u, v in zip(weights(fast.model.trainable_variables), weights(general.model.trainable_variables)):
        np.testing.assert_array_equal(u, v)
    assert fast.trace_count <= 2  # batch sizes 8, then one relaxed trace for the rest
