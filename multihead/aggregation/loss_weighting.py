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
* `GLSWeighting`: Chennupati et al., "MultiNet++: Multi-Stream Feature Aggregation
  and Geometric Loss Strategy for Multi-Task Learning", CVPR Workshops 2019.
* `STCHWeighting`: Lin et al., "Smooth Tchebycheff Scalarization for
  Multi-Objective Optimization", ICML 2024.
* `IMTLLWeighting`: Liu et al., "Towards Impartial Multi-task Learning" (IMTL-L),
  ICLR 2021.
* `FAMOWeighting`: Liu et al., "FAMO: Fast Adaptive Multitask Optimization",
  NeurIPS 2023.
* `RLWWeighting`: Lin et al., "Reasonable Effectiveness of Random Weighting: A
  Litmus Test for Multi-Task Learning", TMLR 2022.

The weights are the gradient of each method's scalarised loss with respect to the
task losses, with the losses held constant (`stop_gradient`): the trunk and the
heads then get exactly the gradient of that scalarised loss.
"""

from __future__ import annotations

import math
import types
from typing import Any, Mapping, Sequence

import tensorflow as tf

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


def gls_weights(losses: tf.Tensor) -> tf.Tensor:
    """Geometric loss strategy: the gradient of `(prod_k L_k)^(1/K)` in `L_k`,
    `(prod L)^(1/K) / (K L_k)` (losses must be positive)."""
    k = tf.cast(tf.shape(losses)[0], losses.dtype)
    geometric = tf.exp(tf.reduce_mean(tf.math.log(losses)))
    return geometric / (k * losses)


def stch_weights(losses: tf.Tensor, nadir: tf.Tensor, mu: float) -> tf.Tensor:
    """Smooth Tchebycheff (LibMTL's form): the gradient of
    `K mu log sum_k exp(log(L_k / n_k + 1e-20) / mu)` in `L_k`:
    `K softmax_k(log(L / n + 1e-20) / mu) / (L_k + 1e-20 n_k)`."""
    k = tf.cast(tf.shape(losses)[0], losses.dtype)
    logs = tf.math.log(losses / nadir + 1e-20)
    return k * tf.nn.softmax(logs / mu) / (losses + 1e-20 * nadir)


def famo_weights(logits: tf.Tensor, losses: tf.Tensor, min_losses: tf.Tensor) -> tf.Tensor:
    """FAMO (Liu et al. 2023): the gradient in `L_k` of `sum_k z_k log D_k / c`, with
    `z = softmax(logits)`, `D = L - min_losses + 1e-8` and `c = sum_k z_k / D_k` held
    constant: `z_k / (c D_k)`."""
    z = tf.nn.softmax(logits)
    d = losses - min_losses + 1e-8
    c = tf.reduce_sum(z / d)
    return z / (c * d)


def famo_logit_gradient(logits: tf.Tensor, previous: tf.Tensor, current: tf.Tensor,
                        min_losses: tf.Tensor) -> tf.Tensor:
    """FAMO's update direction of the logits: `J_softmax^T delta`, `delta_k` the decrease
    of `log(L_k - min_k + 1e-8)` from the previous step to this one."""
    delta = (tf.math.log(previous - min_losses + 1e-8)
             - tf.math.log(current - min_losses + 1e-8))
    z = tf.nn.softmax(logits)
    return z * (delta - tf.reduce_sum(z * delta))


def adam_update(param: tf.Tensor, grad: tf.Tensor, m: tf.Tensor, v: tf.Tensor, t: tf.Tensor,
                learning_rate: float, weight_decay: float, beta_1: float = 0.9,
                beta_2: float = 0.999, epsilon: float = 1e-8
                ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """One step of `torch.optim.Adam` (L2 `weight_decay` added to the gradient; `t` the
    1-based step): returns the new parameter and moments."""
    grad = grad + weight_decay * param
    m = beta_1 * m + (1.0 - beta_1) * grad
    v = beta_2 * v + (1.0 - beta_2) * grad**2
    t = tf.cast(t, param.dtype)
    m_hat = m / (1.0 - beta_1**t)
    v_hat = v / (1.0 - beta_2**t)
    return param - learning_rate * m_hat / (tf.sqrt(v_hat) + epsilon), m, v


#: New values of state variables, `(variable, value)` pairs in the order they are written: what
#: a loss weighting's `update` (and the step's other parts) compute and the step's applier writes.
StateWrites = Sequence[tuple[Any, Any]]


# -- stateful schemes ------------------------------------------------------------------


class LossWeighting(tf.Module):
    """Base of the loss weightings: per-head loss weights from state the scheme owns.

    A weighting scales each aggregated head's task loss by `weights(losses)[k]` before
    gradients are taken, then the trunk update's aggregator combines the weighted heads'
    trunk gradients (the `sum` by default; any aggregator composes). Options are
    constructor arguments; variables are created in `create_state(num_heads)`, called
    once by `build` when the number of heads is known (by the trunk update), and are
    checkpointed as `trunk_update/weighting/<attribute>`. Trainable variables are
    descended by the trunk optimizer along `objective(losses)`; the others change in
    `update` after the step. Built-ins set the class attribute `name` (their config
    name); to name a user class in a config, register it with
    `keras.saving.register_keras_serializable` and give `get_config`.

    Set `needs_grad_norms = True` when `update` reads the heads' unweighted trunk
    gradient norms.
    """

    needs_grad_norms = False
    #: A built-in's options (set per instance); read-only empty for a user's weighting.
    _options: Mapping[str, Any] = types.MappingProxyType({})

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name=name)
        self.num_heads: int | None = None

    @property
    def label(self) -> str:
        """The name used in messages: a built-in's config name (its class attribute `name`,
        which shadows `tf.Module.name`), else the class name."""
        name = getattr(type(self), "name", None)
        return name if isinstance(name, str) else type(self).__name__

    def build(self, num_heads: int) -> None:
        """Creates the state for `num_heads` heads, once."""
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")
        if self.num_heads is not None:
            raise ValueError(
                f"loss weighting {self.label!r} is already built for {self.num_heads} heads (it "
                "holds one run's state); give each Trainer its own instance")
        self.num_heads = num_heads
        self.create_state(num_heads)

    def _build_now(self, num_heads: int | None) -> None:
        if num_heads is not None:
            self.build(num_heads)

    def create_state(self, num_heads: int) -> None:
        """Creates the scheme's variables (none by default)."""
        del num_heads

    def get_config(self) -> dict[str, Any]:
        """The constructor's keyword options (Keras serialization)."""
        return dict(self._options)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossWeighting:
        """A new, unbuilt instance from `get_config()`'s output."""
        return cls(**config)

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        """`(K,)` weights for the task losses `losses` (called inside the gradient tape)."""
        raise NotImplementedError(f"{type(self).__name__} must implement weights(losses)")

    def objective(self, losses: tf.Tensor) -> tf.Tensor | None:
        """Scalar the scheme's trainable variables descend (None: they have none)."""
        del losses
        return None

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> StateWrites:
        """The state after the step (loss history, weight update) as `(variable, new value)`
        pairs, which the step writes where the trunk update happens; none by default. (An
        `update` that assigns its variables itself and returns None works too.)"""
        del losses, grad_norms
        return []


class UncertaintyWeighting(LossWeighting):
    """Homoscedastic uncertainty weighting (Kendall et al., CVPR 2018).

    Learns one log-variance `s_k` per head (trainable, updated by the trunk
    optimizer with the trunk) and weights task loss k by `exp(-s_k) / 2`; the
    `s_k / 2` term keeps the variances from growing without bound.

    Args:
        initial_log_var: starting `s_k` (LibMTL's -0.5, its `loss_scale` initial value).
        num_heads: K, to build now (else the trunk update builds it).
    """

    name = "uncertainty"

    def __init__(self, initial_log_var: float = -0.5, num_heads: int | None = None) -> None:
        super().__init__(name="uncertainty")
        if (isinstance(initial_log_var, bool) or not isinstance(initial_log_var, (int, float))
                or not math.isfinite(initial_log_var)):
            raise ValueError(f"loss weighting 'uncertainty': initial_log_var must be a number, "
                             f"got {initial_log_var!r}")
        self.initial_log_var = float(initial_log_var)
        self._options = {"initial_log_var": initial_log_var}
        self._build_now(num_heads)

    def create_state(self, num_heads: int) -> None:
        self.log_vars = tf.Variable(tf.fill([num_heads], self.initial_log_var), name="log_vars")

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
        temperature: T (the paper uses 2), > 0.
        period: steps averaged into one "epoch" loss, an integer >= 1.
        num_heads: K, to build now (else the trunk update builds it).
    """

    name = "dwa"

    def __init__(self, temperature: float = 2.0, period: int = 1,
                 num_heads: int | None = None) -> None:
        super().__init__(name="dwa")
        _positive("dwa", "temperature", temperature)
        _positive("dwa", "period", period, integer=True)
        self.temperature = float(temperature)
        self.period = int(period)
        self._options = {"temperature": temperature, "period": period}
        self._build_now(num_heads)

    def create_state(self, num_heads: int) -> None:
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

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> StateWrites:
        del grad_norms
        total = self.loss_sum + tf.stop_gradient(losses)
        count = self.count + 1
        done = count >= self.period
        mean = total / tf.cast(count, total.dtype)
        return [(self.before_last, tf.where(done, self.last, self.before_last)),
                (self.last, tf.where(done, mean, self.last)),
                (self.periods, self.periods + tf.cast(done, tf.int64)),
                (self.loss_sum, tf.where(done, tf.zeros_like(total), total)),
                (self.count, tf.where(done, tf.zeros_like(count), count))]


class GradNormWeighting(LossWeighting):
    """GradNorm (Chen et al., ICML 2018): weights that equalise the heads' training rates.

    The gradient norms are those of each head's trunk gradient (all trunk
    variables, as LibMTL does; with `rep_grad`, at the trunk output). The paper
    uses the last shared layer; the weights take a plain gradient step of size
    `learning_rate` each training step, then are renormalised to sum to K.

    Args:
        alpha: the asymmetry hyperparameter (the paper uses 0.12 to 3; 1.5 is common), > 0.
        learning_rate: step size of the weights, > 0.
        num_heads: K, to build now (else the trunk update builds it).
    """

    name = "gradnorm"
    needs_grad_norms = True

    def __init__(self, alpha: float = 1.5, learning_rate: float = 0.025,
                 num_heads: int | None = None) -> None:
        super().__init__(name="gradnorm")
        _positive("gradnorm", "alpha", alpha)
        _positive("gradnorm", "learning_rate", learning_rate)
        self.alpha = float(alpha)
        self.learning_rate = float(learning_rate)
        self._options = {"alpha": alpha, "learning_rate": learning_rate}
        self._build_now(num_heads)

    def create_state(self, num_heads: int) -> None:
        self.loss_weights = tf.Variable(tf.ones([num_heads]), trainable=False, name="loss_weights")
        self.initial_losses = tf.Variable(tf.zeros([num_heads]), trainable=False,
                                          name="initial_losses")
        self.initialized = tf.Variable(False, trainable=False, name="initialized")

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        del losses
        return tf.identity(self.loss_weights)

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> StateWrites:
        assert grad_norms is not None
        losses = tf.stop_gradient(losses)
        initial = tf.where(self.initialized, self.initial_losses, losses)
        return [(self.initial_losses, initial), (self.initialized, True),
                (self.loss_weights, gradnorm_update(self.loss_weights, grad_norms, losses,
                                                    initial, self.alpha, self.learning_rate))]


class GLSWeighting(LossWeighting):
    """Geometric loss strategy (Chennupati et al., CVPR-W 2019; LibMTL's `GLS`): descends
    the geometric mean of the task losses, `(prod_k L_k)^(1/K)`. Stateless; the losses
    must be positive."""

    name = "gls"

    def __init__(self, num_heads: int | None = None) -> None:
        super().__init__(name="gls")
        self._build_now(num_heads)

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        return gls_weights(tf.stop_gradient(losses))


class STCHWeighting(LossWeighting):
    """Smooth Tchebycheff scalarisation (Lin et al., ICML 2024), as LibMTL's `STCH`.

    For the first `warmup_steps` steps the objective is `sum_k log L_k` and the losses
    are averaged into the nadir point `n`; after, `K mu log sum_k exp(log(L_k / n_k) / mu)`.
    LibMTL counts the warmup in epochs (`STCH_warmup_epoch`) and averages the nadir over
    the last warmup epoch; here steps, averaged over the whole warmup. The losses must
    be positive.

    Args:
        mu: the smoothing parameter (LibMTL's `STCH_mu`, default 1.0), > 0.
        warmup_steps: steps of the `sum log L` warmup that estimates the nadir point, >= 1.
        num_heads: K, to build now (else the trunk update builds it).
    """

    name = "stch"

    def __init__(self, mu: float = 1.0, warmup_steps: int = 100,
                 num_heads: int | None = None) -> None:
        super().__init__(name="stch")
        _positive("stch", "mu", mu)
        # 0 would leave the nadir point undefined (no losses averaged).
        _positive("stch", "warmup_steps", warmup_steps, integer=True)
        self.mu = float(mu)
        self.warmup_steps = int(warmup_steps)
        self._options = {"mu": mu, "warmup_steps": warmup_steps}
        self._build_now(num_heads)

    def create_state(self, num_heads: int) -> None:
        self.loss_sum = tf.Variable(tf.zeros([num_heads]), trainable=False, name="loss_sum")
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="count")

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        losses = tf.stop_gradient(losses)
        warm = self.count < self.warmup_steps
        nadir = self.loss_sum / tf.cast(tf.maximum(self.count, 1), losses.dtype)
        return tf.where(warm, 1.0 / (losses + 1e-20),
                        stch_weights(losses, tf.where(warm, tf.ones_like(nadir), nadir), self.mu))

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> StateWrites:
        del grad_norms
        warm = self.count < self.warmup_steps
        return [(self.loss_sum, tf.where(warm, self.loss_sum + tf.stop_gradient(losses),
                                         self.loss_sum)),
                (self.count, tf.where(warm, self.count + 1, self.count))]


class IMTLLWeighting(LossWeighting):
    """IMTL-L (Liu et al., ICLR 2021, the loss balance of IMTL; LibMTL's `IMTL` loss part).

    Learns one scale `s_k` per head (trainable, updated by the trunk optimizer with the
    trunk) and descends `sum_k exp(s_k) L_k - s_k`: task loss k is weighted `exp(s_k)`,
    and the `-s_k` term drives `exp(s_k) L_k` toward 1 (equal scaled losses).

    Args:
        num_heads: K, to build now (else the trunk update builds it).
    """

    name = "imtl_l"

    def __init__(self, num_heads: int | None = None) -> None:
        super().__init__(name="imtl_l")
        self._build_now(num_heads)

    def create_state(self, num_heads: int) -> None:
        self.loss_scale = tf.Variable(tf.zeros([num_heads]), name="loss_scale")

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        del losses
        return tf.exp(tf.identity(self.loss_scale))

    def objective(self, losses: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.exp(self.loss_scale) * tf.stop_gradient(losses) - self.loss_scale)


class FAMOWeighting(LossWeighting):
    """FAMO (Liu et al., NeurIPS 2023): task weights that equalise the losses' rates of decrease.

    The weights are `z_k / (c D_k)` (`famo_weights`); after the step the logits take one
    Adam step (torch's, with L2 `gamma`) along `J^T delta`, `delta` the decrease of the
    log losses. The authors compute the decrease with an extra forward pass on the same
    batch after the update; here, as without that pass, from this step's losses to the
    next step's (on the next batch), so the logits move one step later. `min_losses`
    is 0, the authors' default.

    Args:
        w_lr: Adam's learning rate on the logits (the authors' and LibMTL's 0.025), > 0.
        gamma: Adam's weight decay on the logits, >= 0 (LibMTL's `FAMO_w_gamma`, 1e-3).
        num_heads: K, to build now (else the trunk update builds it).
    """

    name = "famo"

    def __init__(self, w_lr: float = 0.025, gamma: float = 1e-3,
                 num_heads: int | None = None) -> None:
        super().__init__(name="famo")
        _positive("famo", "w_lr", w_lr)
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not (
                math.isfinite(gamma) and gamma >= 0):
            raise ValueError(f"loss weighting 'famo': gamma must be a number >= 0, got {gamma!r}")
        self.w_lr = float(w_lr)
        self.gamma = float(gamma)
        self._options = {"w_lr": w_lr, "gamma": gamma}
        self._build_now(num_heads)

    def create_state(self, num_heads: int) -> None:
        zeros = tf.zeros([num_heads])
        self.logits = tf.Variable(zeros, trainable=False, name="logits")
        self.m = tf.Variable(zeros, trainable=False, name="m")
        self.v = tf.Variable(zeros, trainable=False, name="v")
        self.adam_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="adam_steps")
        self.previous = tf.Variable(zeros, trainable=False, name="previous")
        self.has_previous = tf.Variable(False, trainable=False, name="has_previous")

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        return famo_weights(tf.identity(self.logits), tf.stop_gradient(losses),
                            tf.zeros([self.num_heads]))

    def update(self, losses: tf.Tensor, grad_norms: tf.Tensor | None) -> StateWrites:
        del grad_norms
        losses = tf.stop_gradient(losses)
        grad = famo_logit_gradient(self.logits, self.previous, losses, tf.zeros_like(losses))
        t = self.adam_steps + 1
        logits, m, v = adam_update(self.logits, grad, self.m, self.v, t, self.w_lr, self.gamma)
        ready = self.has_previous
        return [(self.logits, tf.where(ready, logits, self.logits)),
                (self.m, tf.where(ready, m, self.m)), (self.v, tf.where(ready, v, self.v)),
                (self.adam_steps, tf.where(ready, t, self.adam_steps)),
                (self.previous, losses), (self.has_previous, True)]


class RLWWeighting(LossWeighting):
    """Random loss weighting (Lin et al., TMLR 2022; LibMTL's `RLW`): every step the
    weights are `softmax(z)`, `z ~ N(0, I)`, from a generator owned by the scheme (so a
    checkpoint holds its state and a resumed run draws the same weights).

    Args:
        seed: the generator's seed (by name in a policy: the trunk policy's `seed`).
        num_heads: K, to build now (else the trunk update builds it).
    """

    name = "rlw"

    def __init__(self, seed: int = 0, num_heads: int | None = None) -> None:
        super().__init__(name="rlw")
        self.seed = seed
        self._options = {"seed": seed}
        self._build_now(num_heads)

    def create_state(self, num_heads: int) -> None:
        self.rng = tf.random.Generator.from_seed(self.seed)

    def weights(self, losses: tf.Tensor) -> tf.Tensor:
        del losses
        return tf.nn.softmax(self.rng.normal([self.num_heads]))


def _positive(name: str, key: str, value: Any, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"loss weighting {name!r}: {key} must be a positive {'integer' if integer else 'number'}, "
            f"got {value!r}"
        )
