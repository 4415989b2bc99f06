"""Directly built optimizer updates are bitwise Keras' `apply_gradients`, step after step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from multihead.core import adam_sgd_ops

SHAPES = [((5, 3), "float32"), ((3,), "float32"), ((4, 2), "float64")]

PLAIN = {
    "adam": lambda: keras.optimizers.Adam(1e-2),
    "adam_amsgrad": lambda: keras.optimizers.Adam(1e-2, amsgrad=True),
    "adam_betas": lambda: keras.optimizers.Adam(3e-3, beta_1=0.5, beta_2=0.9, epsilon=1e-3),
    "adam_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=2, decay_rate=0.7)),
    "sgd": lambda: keras.optimizers.SGD(5e-2),
    "sgd_momentum": lambda: keras.optimizers.SGD(5e-2, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(5e-2, momentum=0.9, nesterov=True),
}
# Configurations the direct path leaves to Keras: they must come out the same too.
OTHER = {
    "adam_clipnorm": lambda: keras.optimizers.Adam(1e-2, clipnorm=0.1),
    "adam_weight_decay": lambda: keras.optimizers.Adam(1e-2, weight_decay=0.1),
    "adamw": lambda: keras.optimizers.AdamW(1e-2),
    "sgd_clipvalue": lambda: keras.optimizers.SGD(5e-2, clipvalue=0.1),
    "adam_ema": lambda: keras.optimizers.Adam(1e-2, use_ema=True),
    "adam_accumulation": lambda: keras.optimizers.Adam(1e-2, gradient_accumulation_steps=2),
    "rmsprop": lambda: keras.optimizers.RMSprop(1e-2),
}


def _variables():
    rng = np.random.default_rng(0)
    return [keras.Variable(rng.normal(size=shape), dtype=dtype) for shape, dtype in SHAPES]


def _gradients(step):
    rng = np.random.default_rng(100 + step)
    scale = 10.0 ** rng.uniform(-3, 1)  # gradients of very different sizes from step to step
    return [tf.constant(scale * rng.normal(size=shape), dtype) for shape, dtype in SHAPES]


def _state(variables, optimizer):
    return [np.asarray(v) for v in variables] + [np.asarray(v) for v in optimizer.variables]


@pytest.mark.parametrize("compiled", [True, False], ids=["tf.function", "eager"])
@pytest.mark.parametrize("make", list(PLAIN.values()) + list(OTHER.values()),
                         ids=list(PLAIN) + list(OTHER))
def test_update_is_bitwise_keras_apply_gradients(make, compiled):
    ours, theirs = _variables(), _variables()
    ours_opt, theirs_opt = make(), make()
    ours_opt.build(ours)
    theirs_opt.build(theirs)

    def direct(grads):
        adam_sgd_ops.apply_gradients(ours_opt, grads, ours)

    def keras_apply(grads):
        theirs_opt.apply_gradients(zip(grads, theirs))

    if compiled:
        direct, keras_apply = tf.function(direct), tf.function(keras_apply)
    for step in range(8):
        if step == 4 and not isinstance(ours_opt.learning_rate, tf.Tensor):
            for opt in (ours_opt, theirs_opt):  # a learning rate changed mid-run by the user
                opt.learning_rate = 0.5 * float(opt.learning_rate)
        grads = _gradients(step)
        direct(grads)
        keras_apply(grads)
        for a, b in zip(_state(ours, ours_opt), _state(theirs, theirs_opt), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"after step {step + 1}")


@pytest.mark.parametrize("make", list(PLAIN.values()), ids=list(PLAIN))
def test_plain_optimizers_are_built_without_keras_apply(make, monkeypatch):
    # The point of the direct path: Keras' per-variable graph building is what made a
    # 64-head step take over 10 s to trace.
    variables, optimizer = _variables(), make()
    optimizer.build(variables)

    def refuse(*args, **kwargs):
        raise AssertionError("went through Keras' apply_gradients")

    monkeypatch.setattr(optimizer, "apply_gradients", refuse)
    tf.function(lambda g: adam_sgd_ops.apply_gradients(optimizer, g, variables))(_gradients(0))
    assert int(optimizer.iterations) == 1


def test_sparse_or_missing_gradients_and_constraints_go_through_keras():
    variables = [keras.Variable(np.ones((4, 2)), dtype="float32"),
                 keras.Variable(np.ones((2,)), dtype="float32")]
    variables[1].constraint = keras.constraints.NonNeg()  # as Layer.add_weight sets it
    optimizer = keras.optimizers.Adam(2.0)
    optimizer.build(variables)
    sparse = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]), tf.constant([4, 2]))
    adam_sgd_ops.apply_gradients(optimizer, [sparse, tf.ones((2,))], variables)
    rows = np.asarray(variables[0])
    assert np.all(rows[1] < 1) and np.all(rows[[0, 2, 3]] == 1)  # only the sparse row moved
    assert np.all(np.asarray(variables[1]) == 0)  # the constraint: 1 - 2 clipped to 0
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        adam_sgd_ops.apply_gradients(optimizer, [None, tf.ones((2,))], variables)
