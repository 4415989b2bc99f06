"""Directly built optimizer updates are bitwise Keras' `apply_gradients`, step after step;
fused ones (`fused=True`) are TF1's optimizers, step after step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead.step import adam_sgd_ops

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


# -- fused kernels (fused=True) ----------------------------------------------------------

# The same update with TF1's optimizers, the reference of the fused path.
TF1 = {
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(1e-2, epsilon=1e-7),
    "adam_betas": lambda: tf.compat.v1.train.AdamOptimizer(3e-3, beta1=0.5, beta2=0.9, epsilon=1e-3),
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(5e-2),
    # TF1 keeps lr out of the accumulator (accum = m*accum + g; var -= lr*accum): with a
    # constant lr the same update as Keras' (accum = m*accum - lr*g; var += accum).
    "sgd_momentum": lambda: tf.compat.v1.train.MomentumOptimizer(5e-2, 0.9),
    "sgd_nesterov": lambda: tf.compat.v1.train.MomentumOptimizer(5e-2, 0.9, use_nesterov=True),
}


def _relative(a, b):
    """||a - b|| / ||b||, over the whole variable."""
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def _start_tf1_from(tf1, theirs, optimizer, ours):
    """Sets TF1's variables and slots to the fused path's (TF1's momentum slot holds
    Keras' divided by -lr); TF1's beta powers stay its own."""
    for mine, its in zip(ours, theirs):
        its.assign(np.asarray(mine))
        if isinstance(optimizer, keras.optimizers.Adam):
            m, v, _ = internals.adam_slots(optimizer, mine)
            tf1.get_slot(its, "m").assign(np.asarray(m))
            tf1.get_slot(its, "v").assign(np.asarray(v))
        elif optimizer.momentum:
            momentum = np.asarray(internals.sgd_momentum(optimizer, mine))
            tf1.get_slot(its, "momentum").assign(-momentum / float(optimizer.learning_rate))


@pytest.mark.parametrize("name", list(TF1))
def test_fused_updates_equal_tf1_optimizers_on_the_same_gradients_step_by_step(name):
    # float32 variables: TF1 keeps Adam's beta powers in float32 variables whatever the
    # variable's dtype, so for a float64 variable it is only float32-accurate.
    single = [i for i, (_, dtype) in enumerate(SHAPES) if dtype == "float32"]
    ours, optimizer = [_variables()[i] for i in single], PLAIN[name]()
    optimizer.build(ours)
    theirs, tf1 = [tf.Variable(np.asarray(v)) for v in ours], TF1[name]()
    fused = tf.function(lambda g: adam_sgd_ops.apply_gradients(optimizer, g, ours, fused=True))
    for step in range(50):
        if step:  # each step from the same state: the error of one step, not a drift
            _start_tf1_from(tf1, theirs, optimizer, ours)
        grads = [_gradients(step)[i] for i in single]
        fused(grads)
        tf1.apply_gradients(zip(grads, theirs))
        for a, b in zip(ours, theirs):
            # Adam: TF1's beta powers are running products, the fused update's are
            # beta ** step (one rounding): a last-bit difference in a few elements.
            # Measured max: Adam 9.4e-8, momentum 9.8e-8 (TF1's form), plain SGD 0.
            assert _relative(a, b) <= 1e-7, f"{name}, step {step + 1}: {_relative(a, b):.1e}"


def _fused_and_keras(name):
    """Two copies of the variables, and an optimizer `name` built on each: the first to be
    updated by the fused kernels, the second by Keras."""
    fused, keras_ = _variables(), _variables()
    fused_opt, keras_opt = PLAIN[name](), PLAIN[name]()
    fused_opt.build(fused)
    keras_opt.build(keras_)
    return fused, fused_opt, keras_, keras_opt


@pytest.mark.parametrize("name", ["adam", "adam_amsgrad", "adam_schedule"])
def test_fused_adam_is_keras_adam_up_to_the_kernels_rounding(name):
    """Same formula (epsilon after the bias-corrected step size in both), other rounding:
    the kernel's `1 - beta_2` is 1 - 0.999f = 0.00099998713 against Keras' 0.001f, so the
    second moment differs by 1.3e-5 relative from the first step on."""
    fused, fused_opt, keras_, keras_opt = _fused_and_keras(name)
    for step in range(50):
        grads = _gradients(step)
        adam_sgd_ops.apply_gradients(fused_opt, grads, fused, fused=True)
        keras_opt.apply_gradients(zip(grads, keras_))
    state = list(zip(_state(fused, fused_opt), _state(keras_, keras_opt)))
    assert not all(np.array_equal(a, b) for a, b in state)
    assert max(_relative(a, b) for a, b in state if np.any(b)) < 2e-5


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "sgd_nesterov"])
def test_fused_sgd_is_bitwise_keras_sgd(name):
    fused, fused_opt, keras_, keras_opt = _fused_and_keras(name)
    for step in range(8):
        grads = _gradients(step)
        adam_sgd_ops.apply_gradients(fused_opt, grads, fused, fused=True)
        keras_opt.apply_gradients(zip(grads, keras_))
        for a, b in zip(_state(fused, fused_opt), _state(keras_, keras_opt), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"after step {step + 1}")


@pytest.mark.parametrize("make", list(OTHER.values()), ids=list(OTHER))
def test_fused_leaves_every_other_configuration_to_keras(make):
    ours, theirs = _variables(), _variables()
    ours_opt, theirs_opt = make(), make()
    ours_opt.build(ours)
    theirs_opt.build(theirs)
    for step in range(3):
        grads = _gradients(step)
        adam_sgd_ops.apply_gradients(ours_opt, grads, ours, fused=True)
        theirs_opt.apply_gradients(zip(grads, theirs))
    for a, b in zip(_state(ours, ours_opt), _state(theirs, theirs_opt), strict=True):
        np.testing.assert_array_equal(a, b)
