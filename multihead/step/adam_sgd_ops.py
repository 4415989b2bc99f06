"""Keras' plain Adam and SGD updates written as raw TensorFlow ops.

`apply_gradients(optimizer, grads, variables)` does what
`optimizer.apply_gradients(zip(grads, variables))` does, with bitwise the same
result (tests/step/test_adam_sgd_ops.py checks every variant step by step), but builds
the graph much faster: Keras 3 builds each variable's update through its
backend-neutral op wrappers, most of the trace time of a step with many heads
(docs/performance.md gives the figures). Here each update is the same TF ops in
the same order, built once per variable, and the shared scalars (learning rate,
bias corrections) once per optimizer.

Only the plain case is built directly: exactly `keras.optimizers.Adam` (with or
without AMSGrad) or `keras.optimizers.SGD` (with or without (Nesterov)
momentum), no gradient clipping, weight decay, EMA, gradient accumulation, loss
scaling, variable constraints, sparse (`IndexedSlices`) or missing gradients,
and no `tf.distribute` strategy. Anything else, including subclasses, goes
through Keras' own `apply_gradients`, as does an optimizer whose Keras internals
(slot lists, variable index) are not where this module reads them. The
arithmetic mirrors Keras' `update_step` as of Keras 3.15; tests/step/test_adam_sgd_ops.py
checks it against the installed Keras, so a Keras release that changes it fails
the tests instead of drifting silently.

With `fused=True` (the step's option, `multihead.step.options`), the same plain cases run TF1's
fused kernels instead, one op per variable on the optimizer's own slots:
`ResourceApplyAdam` (`ResourceApplyAdamWithAmsgrad`), `ResourceApplyKerasMomentum`,
`ResourceApplyGradientDescent`. Their formulas are Keras' (Adam's epsilon sits where
Keras puts it, after the bias-corrected step size), but the kernel rounds
differently: it computes `1 - beta` in the variable's dtype (`1 - 0.999f =
0.00099998713`, Keras 0.001f) and evaluates the update in one Eigen expression. So
fused Adam is TF1's `AdamOptimizer` (to float rounding of the beta powers, which
TF1 keeps as running products and this computes as powers of the step) and not
bitwise Keras' Adam; docs/performance.md gives the measured distance. The fused
SGD kernels compute Keras' SGD arithmetic.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from multihead import _keras_internals as internals


def apply_gradients(optimizer: keras.optimizers.Optimizer,
                    grads: Sequence[tf.Tensor | tf.IndexedSlices | None],
                    variables: Sequence[keras.Variable], fused: bool = False) -> None:
    """Applies `grads` to `variables` with `optimizer`, as its `apply_gradients` would.

    Args:
        optimizer: a Keras optimizer already built on (a superset of) `variables`.
        grads: one gradient per variable.
        variables: the variables to update.
        fused: a plain Adam or SGD updates through TF1's fused kernels (TF1's
            numerics, see the module docstring); anything else still goes through
            Keras' `apply_gradients`.
    """
    direct = (_FUSED if fused else _DIRECT).get(type(optimizer))
    if direct is None or not _plain(optimizer, grads, variables):
        optimizer.apply_gradients(zip(grads, variables))
        return
    with tf.name_scope(optimizer.name):
        direct(optimizer, list(grads), list(variables))
        optimizer.iterations.assign_add(1)


def _plain(optimizer: keras.optimizers.Optimizer, grads: Sequence[Any],
           variables: Sequence[keras.Variable]) -> bool:
    """Whether Keras' update would be just the optimizer's `update_step` on each variable."""
    if not (optimizer.built and optimizer.clipnorm is None and optimizer.clipvalue is None
            and optimizer.global_clipnorm is None and optimizer.weight_decay is None
            and not optimizer.use_ema and not optimizer.gradient_accumulation_steps
            and optimizer.loss_scale_factor is None):
        return False
    if not all(isinstance(getattr(optimizer, name, 0.0), (int, float))
               for name in ("beta_1", "beta_2", "epsilon", "momentum")):
        return False  # tensor hyperparameters: leave Keras' type promotion to Keras
    if not internals.has_slot_internals(optimizer):
        return False
    if tf.distribute.has_strategy() or isinstance(_tf_variable(optimizer.iterations),
                                                  tf.distribute.DistributedValues):
        return False  # Keras updates through the strategy's `extended.update`
    return all(
        isinstance(g, tf.Tensor) and getattr(v, "constraint", None) is None
        and not getattr(v, "overwrite_with_gradient", False)
        and not isinstance(_tf_variable(v), tf.distribute.DistributedValues)
        for g, v in zip(grads, variables)
    )


def _tf_variable(variable: Any) -> tf.Variable:
    return variable.value if isinstance(variable, keras.Variable) else variable


def _adam(optimizer: keras.optimizers.Adam, grads: list[tf.Tensor],
          variables: list[keras.Variable]) -> None:
    # Keras' Adam.update_step, with the per-step scalars computed once per dtype.
    learning_rate = optimizer.learning_rate
    scalars: dict[tf.DType, tf.Tensor] = {}
    for grad, variable in zip(grads, variables):
        var = _tf_variable(variable)
        dtype = var.dtype
        if dtype not in scalars:
            lr = tf.cast(learning_rate, dtype)
            local_step = tf.cast(optimizer.iterations + 1, dtype)
            beta_1_power = tf.pow(tf.cast(optimizer.beta_1, dtype), local_step)
            beta_2_power = tf.pow(tf.cast(optimizer.beta_2, dtype), local_step)
            scalars[dtype] = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        alpha = scalars[dtype]
        m, v, v_hat = (_tf_variable(s) if s is not None else None
                       for s in internals.adam_slots(optimizer, variable))
        grad = tf.cast(grad, dtype)
        # Keras casts some Python floats through float32 (tf.cast) and converts others
        # straight to the variable's dtype (its ops' type promotion): so does this.
        m.assign_add((grad - m) * tf.constant(1 - optimizer.beta_1, dtype))
        v.assign_add((tf.square(grad) - v) * tf.constant(1 - optimizer.beta_2, dtype))
        if v_hat is not None:
            v_hat.assign(tf.maximum(v_hat, v))
            v = v_hat
        var.assign_sub((m * alpha) / (tf.sqrt(v) + tf.constant(optimizer.epsilon, dtype)))


def _sgd(optimizer: keras.optimizers.SGD, grads: list[tf.Tensor],
         variables: list[keras.Variable]) -> None:
    # Keras' SGD.update_step.
    learning_rate = optimizer.learning_rate
    for grad, variable in zip(grads, variables):
        var = _tf_variable(variable)
        dtype = var.dtype
        lr = tf.cast(learning_rate, dtype)
        grad = tf.cast(grad, dtype)
        if optimizer.momentum == 0:
            var.assign_sub(grad * lr)
            continue
        m = _tf_variable(internals.sgd_momentum(optimizer, variable))
        momentum = tf.cast(optimizer.momentum, dtype)
        m.assign(m * momentum - grad * lr)
        if optimizer.nesterov:
            var.assign_add(m * momentum - grad * lr)
        else:
            var.assign_add(m)


_DIRECT: dict[type, Callable[[Any, list[tf.Tensor], list[keras.Variable]], None]] = {
    keras.optimizers.Adam: _adam,
    keras.optimizers.SGD: _sgd,
}


def _fused_adam(optimizer: keras.optimizers.Adam, grads: list[tf.Tensor],
                variables: list[keras.Variable]) -> None:
    # TF1's ApplyAdam kernel on Keras' slots. As TF1 (and Keras for the betas), the
    # hyperparameters reach a float64 variable through float32 (tf.cast of a Python float).
    scalars: dict[tf.DType, dict[str, tf.Tensor]] = {}
    for grad, variable in zip(grads, variables):
        var = _tf_variable(variable)
        dtype = var.dtype
        if dtype not in scalars:
            beta_1, beta_2 = (tf.cast(b, dtype) for b in (optimizer.beta_1, optimizer.beta_2))
            local_step = tf.cast(optimizer.iterations + 1, dtype)
            scalars[dtype] = dict(
                beta1_power=tf.pow(beta_1, local_step), beta2_power=tf.pow(beta_2, local_step),
                lr=tf.cast(optimizer.learning_rate, dtype), beta1=beta_1, beta2=beta_2,
                epsilon=tf.cast(optimizer.epsilon, dtype))
        m, v, v_hat = internals.adam_slots(optimizer, variable)
        handles = dict(var=var.handle, m=_tf_variable(m).handle, v=_tf_variable(v).handle)
        if v_hat is None:
            tf.raw_ops.ResourceApplyAdam(**handles, **scalars[dtype], grad=tf.cast(grad, dtype))
        else:
            tf.raw_ops.ResourceApplyAdamWithAmsgrad(**handles, vhat=_tf_variable(v_hat).handle,
                                                    **scalars[dtype], grad=tf.cast(grad, dtype))


def _fused_sgd(optimizer: keras.optimizers.SGD, grads: list[tf.Tensor],
               variables: list[keras.Variable]) -> None:
    # Keras' SGD arithmetic, one kernel per variable.
    learning_rates: dict[tf.DType, tf.Tensor] = {}
    for grad, variable in zip(grads, variables):
        var = _tf_variable(variable)
        dtype = var.dtype
        if dtype not in learning_rates:
            learning_rates[dtype] = tf.cast(optimizer.learning_rate, dtype)
        lr, grad = learning_rates[dtype], tf.cast(grad, dtype)
        if optimizer.momentum == 0:
            tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
            continue
        accum = _tf_variable(internals.sgd_momentum(optimizer, variable))
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=var.handle, accum=accum.handle, lr=lr, grad=grad,
            momentum=tf.cast(optimizer.momentum, dtype), use_nesterov=optimizer.nesterov)


_FUSED: dict[type, Callable[[Any, list[tf.Tensor], list[keras.Variable]], None]] = {
    keras.optimizers.Adam: _fused_adam,
    keras.optimizers.SGD: _fused_sgd,
}
