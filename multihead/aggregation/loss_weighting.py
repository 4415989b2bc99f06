"""Loss-weighting schemes for the aggregated trunk update: per-head loss weights with state.

Each scheme multiplies head k's task loss (its `Objective.weight` times its
loss) by a weight `lambda_k` before gradients are taken; the trunk then gets
`sum_k lambda_k g_k` and each head's own optimizer gets its weighted gradient,
as in the papers, where the whole network descends `sum_k lambda_k L_k`.

The math is pure functions (`uncertainty_weights`, `dwa_weights`,
`gradnorm_update`); the classes own the state as variables, so checkpoints
capture it and a restored run continues exactly:

* `UncertaintyWeighting`: Kendall, Gal & Cipolla, "Multi-Task Learning Using
  Uncertainty to Weigh Losses for Scene Geometry and Semantics", CVPR 2018.
* `GradNormWeighting`: Chen et al., "GradNorm: Gradient Normalization for
  Adaptive Loss Balancing in Deep Multitask Networks", ICML 2018.
* `DWAWeighting`: Liu, Johns & Davison, "End-to-End Multi-Task Learning with
  Attention" (Dynamic Weight Average), CVPR 2019.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

#: Names accepted by `make_loss_weighting`.
LOSS_WEIGHTINGS = ("uncertainty", "gradnorm", "dwa")


# -- pure math -------------------------------------------------------------------------


def uncertainty_weights(log_vars: tf.Tensor) -> tf.Tensor:
    """Kendall et al. (2018), eq. 7 with `s = log sigma^2`: weight `1 / (2 sigma^2) = exp(-s) / 2`."""
    return 0.5 * tf.exp(-log_vars)


def uncertainty_objective(log_vars: tf.Tensor, losses: tf.Tensor) -> tf.Tensor:
    """`sum_k exp(-s_k) L_k / 2 + s_k / 2`, the objective the log-variances descend."""
    return tf.reduce_sum(uncertainty_weights(log_vars) * losses + 0.5 * log_vars)


def dwa_weights(last: tf.Tensor, before_last: tf.Tensor, temperature: float) -> tf.Tensor:
    """Liu et al. (2019), eq. 7: `lambda_k = K exp(r_k / T) / sum_i exp(r_i / T)`, `r_k = L_k(t-1) / L_k(t-2)`."""
    ratios = tf.math.divide_no_nan(last, before_last)
    k = tf.cast(tf.shape(last)[0], last.dtype)
    return k * tf.nn.softmax(ratios / temperature)


def gradnorm_update(weights: tf.Tensor, grad_norms: tf.Tensor, losses: tf.Tensor,
                    initial_losses: tf.Tensor, alpha: float, learning_rate: float) -> tf.Tensor:
    """One GradNorm step on the loss weights (Chen et al. 2018, eq. 1-2 and section 3.2).

    With `G_k = w_k |grad L_k|` (unweighted gradient norms `grad_norms`),
    `r_k = (L_k / L_k(0)) / mean_i (L_i / L_i(0))` and the target
    `T_k = mean_i(G_i) * r_k^alpha` held constant, the GradNorm loss is
    `sum_k |G_k - T_k|`; its gradient in `w_k` is `sign(G_k - T_k) |grad L_k|`.
    After a gradient step of size `learning_rate` the weights are clipped at 0
    and renormalised to sum to K.

    Returns:
        The new weights.
    """
    k = tf.cast(tf.shape(weights)[0], weights.dtype)
    g = weights * grad_norms
    inverse_rate = tf.math.divide_no_nan(losses, initial_losses)
    rel = tf.math.divide_no_nan(inverse_rate, tf.reduce_mean(inverse_rate))
    target = tf.reduce_mean(g) * rel**alpha
    new = tf.maximum(weights - learning_rate * tf.sign(g - target) * grad_norms, 0.0)
    return k * tf.math.divide_no_nan(new, tf.reduce_sum(new))


# -- stateful schemes ------------------------------------------------------------------


class LossWeighting(tf.Module):
    """Base class: per-head loss weights computed from variables owned by the scheme.

    Subclasses set `needs_grad_norms` when `update` uses gradient norms.
    """

    needs_grad_norms = False

    def __init__(self, num_heads: int, name: str | None = None) -> None:
        super().__init__(name=name)
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")
        self.num_heads = num_heads

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        """`(K,)` weights for the task losses `losses` (called inside the gradient tape)."""
        raise NotImplementedError

    def objective(self, losses: tf.Tensor) -> tf.Tensor | None:
        """Scalar the scheme's trainable variables descend (None: they have none)."""
        del losses
        return None

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> None:
        """State change after the step (loss history, weight update)."""
        del losses, grad_norms


class UncertaintyWeighting(LossWeighting):
    """Homoscedastic uncertainty weighting (Kendall et al., CVPR 2018).

    Learns one log-variance `s_k` per head (trainable, updated by the trunk
    optimizer with the trunk) and weights task loss k by `exp(-s_k) / 2`; the
    `s_k / 2` term keeps the variances from growing without bound.

    Args:
        num_heads: K.
        initial_log_var: starting `s_k`.
    """

    def __init__(self, num_heads: int, initial_log_var: float = 0.0) -> None:
        super().__init__(num_heads, name="uncertainty")
        self.log_vars = tf.Variable(tf.fill([num_heads], float(initial_log_var)), name="log_vars")

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        del losses
        return uncertainty_weights(self.log_vars)

    def objective(self, losses: tf.Tensor) -> tf.Tensor:
        return uncertainty_objective(self.log_vars, tf.stop_gradient(losses))


class DWAWeighting(LossWeighting):
    """Dynamic Weight Average (Liu et al., CVPR 2019).

    The paper averages losses over an epoch; here over `period` steps. The
    first two periods use weight 1.

    Args:
        num_heads: K.
        temperature: T (the paper uses 2).
        period: steps averaged into one "epoch" loss.
    """

    def __init__(self, num_heads: int, temperature: float = 2.0, period: int = 1) -> None:
        super().__init__(num_heads, name="dwa")
        self.temperature = float(temperature)
        self.period = int(period)
        self.loss_sum = tf.Variable(tf.zeros([num_heads]), trainable=False, name="loss_sum")
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="count")
        self.last = tf.Variable(tf.zeros([num_heads]), trainable=False, name="last")
        self.before_last = tf.Variable(tf.zeros([num_heads]), trainable=False, name="before_last")
        self.periods = tf.Variable(0, dtype=tf.int64, trainable=False, name="periods")

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        del losses
        ready = self.periods >= 2
        return tf.where(ready, dwa_weights(self.last, self.before_last, self.temperature),
                        tf.ones([self.num_heads]))

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> None:
        del grad_norms
        total = self.loss_sum + tf.stop_gradient(losses)
        count = self.count + 1
        done = count >= self.period
        mean = total / tf.cast(count, total.dtype)
        self.before_last.assign(tf.where(done, self.last, self.before_last))
        self.last.assign(tf.where(done, mean, self.last))
        self.periods.assign_add(tf.cast(done, tf.int64))
        self.loss_sum.assign(tf.where(done, tf.zeros_like(total), total))
        self.count.assign(tf.where(done, tf.zeros_like(count), count))


class GradNormWeighting(LossWeighting):
    """GradNorm (Chen et al., ICML 2018): weights that equalise the heads' training rates.

    The gradient norms are those of each head's trunk gradient (all trunk
    variables, as LibMTL does; with `rep_grad`, at the trunk output). The paper
    uses the last shared layer; the weights take a plain gradient step of size
    `learning_rate` each training step, then are renormalised to sum to K.

    Args:
        num_heads: K.
        alpha: the asymmetry hyperparameter (the paper uses 0.12 to 3; 1.5 is common).
        learning_rate: step size of the weights.
    """

    needs_grad_norms = True

    def __init__(self, num_heads: int, alpha: float = 1.5, learning_rate: float = 0.025) -> None:
        super().__init__(num_heads, name="gradnorm")
        self.alpha = float(alpha)
        self.learning_rate = float(learning_rate)
        self.loss_weights = tf.Variable(tf.ones([num_heads]), trainable=False, name="loss_weights")
        self.initial_losses = tf.Variable(tf.zeros([num_heads]), trainable=False,
                                          name="initial_losses")
        self.initialized = tf.Variable(False, trainable=False, name="initialized")

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        del losses
        return tf.identity(self.loss_weights)

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> None:
        assert grad_norms is not None
        losses = tf.stop_gradient(losses)
        initial = tf.where(self.initialized, self.initial_losses, losses)
        self.initial_losses.assign(initial)
        self.initialized.assign(True)
        self.loss_weights.assign(gradnorm_update(
            self.loss_weights, grad_norms, losses, initial, self.alpha, self.learning_rate))


def _positive(name: str, key: str, value: Any, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"loss weighting {name!r}: {key} must be a positive {'integer' if integer else 'number'}, "
            f"got {value!r}"
        )


_OPTIONS = {
    "uncertainty": {"initial_log_var": 0.0},
    "gradnorm": {"alpha": 1.5, "learning_rate": 0.025},
    "dwa": {"temperature": 2.0, "period": 1},
}


def check_loss_weighting_options(name: str, **options: Any) -> dict[str, Any]:
    """Validates a scheme's name and options; returns the options with defaults filled in."""
    if name not in _OPTIONS:
        raise ValueError(f"unknown loss weighting {name!r}; choose one of {list(LOSS_WEIGHTINGS)}")
    known = _OPTIONS[name]
    for key in options:
        if key not in known:
            raise ValueError(f"loss weighting {name!r} has no option {key!r}; its options are {sorted(known)}")
    merged = {**known, **options}
    if name == "uncertainty":
        value = merged["initial_log_var"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"loss weighting 'uncertainty': initial_log_var must be a number, got {value!r}")
    elif name == "gradnorm":
        _positive(name, "alpha", merged["alpha"])
        _positive(name, "learning_rate", merged["learning_rate"])
    else:
        _positive(name, "temperature", merged["temperature"])
        _positive(name, "period", merged["period"], integer=True)
    return merged


def make_loss_weighting(name: str, num_heads: int, **options: Any) -> LossWeighting:
    """A fresh loss-weighting scheme `name` for `num_heads` heads.

    Args:
        name: one of `LOSS_WEIGHTINGS`.
        num_heads: the number of heads it weights.
        **options: `initial_log_var` (uncertainty); `alpha`, `learning_rate`
            (gradnorm); `temperature`, `period` (dwa).
    """
    merged = check_loss_weighting_options(name, **options)
    cls = {"uncertainty": UncertaintyWeighting, "gradnorm": GradNormWeighting,
           "dwa": DWAWeighting}[name]
    return cls(num_heads, **merged)
