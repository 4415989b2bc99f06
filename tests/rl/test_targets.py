"""TargetNetwork: exact copies, sync schedule, Polyak arithmetic, isolation from gradients,
checkpointed counter, against hand-written references."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model, weights
from multihead.rl.target_network import clone_layer, periodic_due, polyak_average

GAMMA = 0.9


def _actor_critic_model(seed=0):
    """Seed 001: actor and V share the trunk."""
    return make_model(heads=("actor", "V"), seed=seed)


def _batch(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 5)).astype("float32")
    return x, {"next_x": rng.standard_normal((16, 5)).astype("float32"),
               "r": rng.standard_normal((16, 1)).astype("float32"),
               "actor": rng.standard_normal((16, 1)).astype("float32")}


def _td_loss(target):
    """V's TD loss, reading V_target inside the compiled step."""
    def loss(inputs, targets, v):
        y = targets["r"] + GAMMA * target(targets["next_x"])["V"]
        return tf.reduce_mean(tf.square(y - v))
    return loss


def _actor_loss(inputs, targets, out):
    return tf.reduce_mean(tf.square(targets["actor"] - out))


def _trainer(model, target):
    return mh.Trainer(model, {"actor": mh.Objective(_actor_loss, keras.optimizers.Adam(1e-2)),
                              "V": mh.Objective(_td_loss(target), keras.optimizers.Adam(1e-2))})


def test_seed_001_value_target_is_exact_copy_after_each_sync_and_frozen_between():
    k = 4
    model = _actor_critic_model()
    target = mh.TargetNetwork(model, heads=["V"], every=k)
    trainer = _trainer(model, target)
    x = make_batch(("V",), seed=9)[0]
    assert set(target(x)) == {"V"}  # the actor head is not copied
    np.testing.assert_array_equal(target(x)["V"], model(x)["V"])  # right after the initial copy
    for cycle in range(2):
        frozen = weights(target.target_weights)
        v_target_before = target(x)["V"].numpy()
        for i in range(k - 1):  # k-1 steps: not due yet
            trainer.step(_batch(10 * cycle + i))
            assert not bool(target.update())
        np.testing.assert_array_equal(target(x)["V"], v_target_before)  # V_target unchanged
        for a, b in zip(weights(target.target_weights), frozen):
            np.testing.assert_array_equal(a, b)
        assert np.max(np.abs(target(x)["V"].numpy() - model(x)["V"].numpy())) > 1e-4  # V moved
        trainer.step(_batch(10 * cycle + k))
        assert bool(target.update())  # k-th call: sync
        np.testing.assert_array_equal(target(x)["V"], model(x)["V"])
        for s, t in zip(target.source_weights, target.target_weights):
            np.testing.assert_array_equal(s.numpy(), t.numpy())
    assert target.num_syncs == 2 and int(target.counter) == 2 * k


def test_td_training_with_target_in_compiled_step_equals_hand_written_loop():
    """Ours (V_target read inside the compiled step, update() after each step) against a
    tape + Keras optimizers + a third model instance synced by assign every `k` steps."""
    k, steps = 3, 8
    ours = _actor_critic_model(seed=5)
    target = mh.TargetNetwork(ours, heads=["V"], every=k)
    trainer = _trainer(ours, target)
    for i in range(steps):
        trainer.step(_batch(i))
        target.update()

    ref, ref_target = _actor_critic_model(seed=5), _actor_critic_model(seed=5)
    opts = {"actor": keras.optimizers.Adam(1e-2), "V": keras.optimizers.Adam(1e-2)}
    for h in opts:
        opts[h].build(ref.var_list(h))
    for i in range(steps):
        x, t = _batch(i)
        with tf.GradientTape(persistent=True) as tape:
            out = ref(x, training=True)
            y = t["r"] + GAMMA * ref_target(t["next_x"])["V"]
            losses = {"actor": tf.reduce_mean(tf.square(t["actor"] - out["actor"])),
                      "V": tf.reduce_mean(tf.square(y - out["V"]))}
        for h in opts:
            opts[h].apply_gradients(zip(tape.gradient(losses[h], ref.var_list(h)), ref.var_list(h)))
        if (i + 1) % k == 0:
            for s, d in zip(ref.trunk.weights + ref.heads["V"].weights,
                            ref_target.trunk.weights + ref_target.heads["V"].weights):
                d.assign(s)
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    ref_t = ref_target.trunk.weights + ref_target.heads["V"].weights
    for a, b in zip(target.target_weights, ref_t):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


def test_gradients_never_reach_target_variables():
    model = _actor_critic_model()
    target = mh.TargetNetwork(model, heads=["V"], every=2)
    x = make_batch(("V",))[0]
    raw = [v.value for v in target.target_weights]  # the tf.Variables under the Keras ones
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(raw)  # even when watched explicitly, stop_gradient cuts the path
        loss = tf.reduce_sum(target(x)["V"] * model(x)["V"])
    assert all(g is None for g in tape.gradient(loss, raw))
    assert all(g is not None for g in tape.gradient(loss, model.var_list("V")))
    assert not any(v.trainable for v in target.target_weights)
    trainer = _trainer(model, target)
    trainer.step(_batch(0))
    target_ids = {id(v) for v in target.variables}
    for head in ("actor", "V"):
        assert not target_ids & {id(v) for v in trainer.optimizers[head]._trainable_variables}
    assert not target_ids & {id(v) for v in model.weights}


@pytest.mark.parametrize("tau", [0.005, 0.3, 1.0])
def test_polyak_update_is_exactly_tau_source_plus_one_minus_tau_old(tau):
    model = make_model()
    target = mh.TargetNetwork(model, tau=tau)
    for i, v in enumerate(model.trunk.weights + model.heads["a"].weights):
        v.assign(v + 0.1 * (i + 1))  # move the source away from the copy
    old, src = weights(target.target_weights), weights(target.source_weights)
    assert bool(target.update())
    for o, s, new in zip(old, src, weights(target.target_weights)):
        # float32, same order of operations: tau * src + (1 - tau) * old, e.g. tau=0.3,
        # src=1.1, old=1.0 -> 0.33 + 0.7 = 1.03
        expected = np.float32(tau) * s + (np.float32(1.0) - np.float32(tau)) * o
        np.testing.assert_array_equal(new, expected)
    for s, now in zip(src, weights(target.source_weights)):  # the source is unchanged
        np.testing.assert_array_equal(s, now)
    assert int(target.counter) == 1


def test_pure_update_rules():
    # 0.25 * 8 + 0.75 * 4 = 2 + 3 = 5
    assert float(polyak_average(np.float32(4.0), np.float32(8.0), 0.25)) == 5.0
    assert [bool(periodic_due(c, 3)) for c in range(1, 8)] == [False, False, True, False, False, True, False]


def test_update_inside_a_tf_function_syncs_on_schedule():
    model = make_model()
    target = mh.TargetNetwork(model, heads=["a"], every=3)
    x = make_batch()[0]

    @tf.function
    def train_and_update():
        for v in model.trunk.weights:
            v.assign_add(tf.ones_like(v) * 0.01)
        return target.update()

    flags = [bool(train_and_update()) for _ in range(6)]
    assert flags == [False, False, True, False, False, True]
    np.testing.assert_array_equal(target(x)["a"], model(x)["a"])


def test_checkpoint_restores_weights_and_counter_so_the_next_sync_is_on_time(tmp_path):
    model = make_model(seed=1)
    target = mh.TargetNetwork(model, heads=["b"], every=4)
    for _ in range(5):  # syncs at call 4; counter 5
        target.update()
    for v in model.trunk.weights:
        v.assign_add(tf.ones_like(v))  # source moves after the last sync
    saved = weights(target.target_weights)
    path = tf.train.Checkpoint(target=target).write(str(tmp_path / "t"))

    fresh_model = make_model(seed=2)
    for d, s in zip(fresh_model.weights, model.weights):
        d.assign(s)  # same source state, another instance
    restored = mh.TargetNetwork(fresh_model, heads=["b"], every=4)
    tf.train.Checkpoint(target=restored).read(path).assert_consumed()
    assert int(restored.counter) == 5
    for a, b in zip(weights(restored.target_weights), saved):
        np.testing.assert_array_equal(a, b)
    assert [bool(restored.update()) for _ in range(3)] == [False, False, True]  # call 8 syncs
    x = make_batch()[0]
    np.testing.assert_array_equal(restored(x)["b"], fresh_model(x)["b"])


def test_checkpoint_of_target_does_not_contain_the_source(tmp_path):
    model = make_model()
    target = mh.TargetNetwork(model, heads=["a"], every=1)
    path = tf.train.Checkpoint(target=target).write(str(tmp_path / "t"))
    saved = [n for n, _ in tf.train.list_variables(path) if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    # trunk: 2 Dense x (kernel, bias); head a: 2 Dense x (kernel, bias); the counter
    assert len(saved) == 4 + 4 + 1


def test_error_when_the_copy_shares_a_variable_with_the_source():
    model = make_model()
    with pytest.raises(ValueError, match=r"copy of trunk shares variable .*\(same object\)"):
        mh.TargetNetwork(model, every=10, clone=lambda layer: layer)


class _NoConfig(keras.layers.Layer):
    """A subclassed layer whose constructor Keras cannot rebuild from its config."""

    def __init__(self, units):
        super().__init__()
        self.dense = keras.layers.Dense(units, activation="tanh")

    def call(self, x):
        return self.dense(x)


def test_layers_without_config_need_clone_and_then_work():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    model = mh.MultiHeadModel(_NoConfig(8), {"a": keras.Model(inp, keras.layers.Dense(1)(
        keras.layers.Dense(3)(inp)))})  # functional head: cloned from its config
    model.build((None, 5))
    with pytest.raises(ValueError, match=r"cannot clone trunk \(_NoConfig\).*pass clone="):
        mh.TargetNetwork(model, every=1)

    def clone(layer):
        return _NoConfig(8) if isinstance(layer, _NoConfig) else clone_layer(layer)

    target = mh.TargetNetwork(model, every=1, clone=clone)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype("float32")
    np.testing.assert_array_equal(target(x)["a"], model(x)["a"])


@pytest.mark.parametrize("tau", [0.0, -0.1, 1.5, float("nan"), True])
def test_error_for_tau_outside_zero_one(tau):
    with pytest.raises(ValueError, match=r"^TargetNetwork.tau: .*got .*; typical: 0.005; 1 copies on every update$"):
        mh.TargetNetwork(make_model(), tau=tau)


def test_error_for_unknown_head_names_the_head_and_lists_the_heads():
    with pytest.raises(ValueError, match=r"head 'value'.*\['a', 'b'\]"):
        mh.TargetNetwork(make_model(), heads=["value"], every=10)


def test_polyak_every_n_updates_averages_on_every_nth_call_only():
    """TD3's targets: tau and every together = one Polyak step on calls n, 2n, ..."""
    model = make_model()
    target = mh.TargetNetwork(model, tau=0.25, every=2)
    for i, v in enumerate(model.weights):
        v.assign(v + 0.1 * (i + 1))
    old, src = weights(target.target_weights), weights(target.source_weights)
    assert not bool(target.update())  # call 1: not due, nothing moves
    for o, new in zip(old, weights(target.target_weights)):
        np.testing.assert_array_equal(new, o)
    assert bool(target.update())  # call 2: 0.25 * source + 0.75 * old, as in the test above
    for o, s, new in zip(old, src, weights(target.target_weights)):
        np.testing.assert_array_equal(new, np.float32(0.25) * s + (np.float32(1.0) - np.float32(0.25)) * o)
    with pytest.raises(ValueError, match="num_syncs"):
        target.num_syncs  # noqa: B018 - a Polyak target counts no hard copies


def test_call_computes_only_the_heads_asked_for():
    model = make_model()
    target = mh.TargetNetwork(model, every=1)
    x = make_batch()[0]
    out = target(x, heads=["b"])
    assert list(out) == ["b"]
    np.testing.assert_array_equal(out["b"], model(x)["b"])


# every + tau together is a Polyak step every n updates (TD3's delayed targets), no longer an error
@pytest.mark.parametrize("kwargs", [{}, {"every": 0}, {"every": 0, "tau": 0.1}])
def test_error_for_bad_schedule(kwargs):
    with pytest.raises(ValueError, match=r"every"):
        mh.TargetNetwork(make_model(), **kwargs)


def test_two_targets_of_two_models_are_independent():
    m1, m2 = make_model(seed=1), make_model(seed=2)
    t1, t2 = mh.TargetNetwork(m1, every=1), mh.TargetNetwork(m2, every=2)
    before = weights(t2.target_weights)
    for v in m1.weights:
        v.assign_add(tf.ones_like(v))
    t1.update()
    for a, b in zip(weights(t2.target_weights), before):
        np.testing.assert_array_equal(a, b)
    x = make_batch()[0]
    np.testing.assert_array_equal(t1(x)["a"], m1(x)["a"])
