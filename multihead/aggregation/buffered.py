"""Methods with a running K x D copy of the gradients: MoCo (Fernando et al., ICLR 2023),
DB-MTL (Lin et al., 2023) and ExcessMTL (He et al., ICML 2024).

They keep, besides a small state, a buffer the size of the heads' gradients (K x D), and work
on the gradients themselves, split in column blocks: one block per trunk variable in the step
(so the K x D matrix is never concatenated), one block for `aggregate`'s explicit matrix. What
needs all of D (norms, Gramians) is summed over blocks. The buffers have the heads on their
first axis, so a step of a subset of the heads reads and writes those heads' rows only."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _k_rows
from multihead.aggregation.base import (
    Buffered,
    BufferedAggregator,
    StateSpec,
    _buffered,
    check_number,
)

def _row_squares(blocks: Sequence[tf.Tensor]) -> tf.Tensor:
    """`(K,)` squared norms of the rows of the matrix whose column blocks are `blocks`."""
    return tf.add_n([tf.reduce_sum(tf.square(b), axis=1) for b in blocks])


def _combine_rows(blocks: Sequence[tf.Tensor], weights: tf.Tensor) -> list[tf.Tensor]:
    """`weights @ block` for every column block."""
    return [tf.linalg.matvec(b, weights, transpose_a=True) for b in blocks]


def _decayed(rate: float, sigma: float, t: tf.Tensor) -> tf.Tensor:
    """`rate / t^sigma` (LibMTL's step-size decay; `t` the 1-based step)."""
    return rate / t**sigma


def moco_update(grads: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
                losses: tf.Tensor, state: Mapping[str, tf.Tensor], beta: float = 0.5,
                beta_sigma: float = 0.5, gamma: float = 0.1, gamma_sigma: float = 0.5,
                rho: float = 0.0) -> Buffered:
    """MoCo (Fernando et al., "Mitigating Gradient Bias in Multi-objective Learning: A
    Provably Convergent Approach", ICLR 2023), as LibMTL's `MoCo` (from the authors' code).

    A tracking variable `y` (`K x D`, the buffer, initially 0) follows the heads'
    gradients, each normalised and scaled by its loss, `g_k / (|g_k| + 1e-8) L_k`:
    `y <- y - beta_t (y - G)`; the weights `lambd` (initially `1/K`) take one step of
    the min-norm problem on `y`, kept on the simplex by a softmax (LibMTL's form; the
    paper projects onto the simplex):
    `lambd <- softmax(lambd - gamma_t (y y^T + rho I) lambd)`; the direction is
    `lambd @ y`. Step sizes decay with the 1-based step `t`: `beta_t = beta / t^beta_sigma`,
    `gamma_t = gamma / t^gamma_sigma`. A zero gradient gives a zero row of `G`.

    Args:
        grads: the `K x D` gradients as column blocks `K x n_i`.
        buffers: `{"y": [K x n_i blocks]}`.
        losses: `(K,)` each head's loss (the loss whose gradient is `g_k`).
        state: `{"lambd": (K,), "step": ()}`.
        beta, beta_sigma: `y`'s step size and its decay (LibMTL's `MoCo_beta`, 0.5,
            and `MoCo_beta_sigma`, 0.5).
        gamma, gamma_sigma: `lambd`'s step size and its decay (`MoCo_gamma`, 0.1, and
            `MoCo_gamma_sigma`, 0.5).
        rho: the l2 regularisation of `lambd`'s update (`MoCo_rho`, 0).
    """
    dtype = grads[0].dtype
    k = _k_rows(grads)
    t = tf.cast(state["step"], tf.int64) + 1
    tt = tf.cast(t, dtype)
    scale = tf.cast(losses, dtype) / (tf.sqrt(_row_squares(grads)) + 1e-8)
    beta_t = _decayed(beta, beta_sigma, tt)
    y = [tf.cast(b, dtype) - beta_t * (tf.cast(b, dtype) - scale[:, None] * g)
         for b, g in zip(buffers["y"], grads)]
    yy = tf.add_n([tf.matmul(b, b, transpose_b=True) for b in y])
    lambd = tf.cast(state["lambd"], dtype)
    lambd = tf.nn.softmax(lambd - _decayed(gamma, gamma_sigma, tt) * tf.linalg.matvec(
        yy + rho * tf.eye(k, dtype=dtype), lambd))
    return _buffered(_combine_rows(y, lambd), lambd, {"y": y}, {"lambd": lambd, "step": t})


def db_mtl_update(grads: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
                  losses: tf.Tensor | None, state: Mapping[str, tf.Tensor], beta: float = 0.9,
                  beta_sigma: float = 0.0) -> Buffered:
    """DB-MTL (Lin et al., "Dual-Balancing for Multi-Task Learning", arXiv:2308.12029,
    2023), as LibMTL's `DB_MTL` (the authors' library).

    Loss-scale balancing: each head descends `log(L_k + 1e-8)`, whose gradient is
    `g_k / (L_k + 1e-8)`. Gradient-magnitude balancing: an EMA of those gradients
    (`K x D`, the buffer, initially 0), `buf <- G + beta_t (buf - G)` with
    `beta_t = beta / t^beta_sigma` (`t` the 1-based step), is combined with weights
    `alpha_k = max_j |buf_j| / (|buf_k| + 1e-8)`: every head's row scaled to the
    largest row's norm. An all-zero buffer gives a zero direction.

    Args:
        grads: the `K x D` gradients as column blocks `K x n_i`: of the losses
            (`losses` given) or already of the log losses (`losses=None`, as the train
            step, which takes the gradients of `log(L_k + 1e-8)` directly).
        buffers: `{"grad_buffer": [K x n_i blocks]}`.
        losses: `(K,)` each head's loss, or None (see `grads`).
        state: `{"step": ()}`.
        beta: the EMA's weight of the past (LibMTL's `DB_beta`, 0.9).
        beta_sigma: its decay with the step (`DB_beta_sigma`, 0: a constant EMA).
    """
    dtype = grads[0].dtype
    t = tf.cast(state["step"], tf.int64) + 1
    if losses is not None:
        inverse = 1.0 / (tf.cast(losses, dtype) + 1e-8)
        grads = [inverse[:, None] * g for g in grads]
    beta_t = _decayed(beta, beta_sigma, tf.cast(t, dtype))
    buf = [g + beta_t * (tf.cast(b, dtype) - g) for b, g in zip(buffers["grad_buffer"], grads)]
    norms = tf.sqrt(_row_squares(buf))
    alpha = tf.reduce_max(norms) / (norms + 1e-8)
    return _buffered(_combine_rows(buf, alpha), alpha, {"grad_buffer": buf}, {"step": t})


def excess_mtl_update(grads: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
                      losses: tf.Tensor | None, state: Mapping[str, tf.Tensor],
                      robust_step_size: float = 1e-2) -> Buffered:
    """ExcessMTL (He et al., "Robust Multi-Task Learning with Excess Risks", ICML 2024),
    as LibMTL's `ExcessMTL` (modified from the authors' code).

    Each head's excess risk is estimated from its gradient with a diagonal (AdaGrad)
    approximation: the buffer `S` (`K x D`, initially 0) sums the squared gradients,
    `S += G * G`, and `w_k = sum_j g_kj^2 / sqrt(S_kj + 1e-7)`. The first step that a
    head's `w_k` is positive records it as `initial_w_k` (LibMTL: the first step); after
    that, `w_k / initial_w_k` raises the head's loss weight multiplicatively:
    `loss_weight_k *= exp(robust_step_size w_k / initial_w_k)`, renormalised to sum to K
    (computed as `K softmax(log loss_weight + robust_step_size w / initial_w)`, which
    cannot overflow). The direction is `loss_weight @ G`.

    LibMTL backpropagates the weighted loss `sum_k loss_weight_k L_k` through the whole
    network, so its task-specific layers get `loss_weight_k` times their gradient. Here
    each head has its own optimizer on its own loss: the weights act on the trunk update
    only, as every gradient aggregator's (head k's variables affect loss k only, so the
    factor would only rescale that head's step size from step to step).

    Args:
        grads: the `K x D` gradients as column blocks `K x n_i`.
        buffers: `{"grad_sum": [K x n_i blocks]}`.
        losses: unused (the signature of the buffered aggregators).
        state: `{"loss_weight": (K,), "initial_w": (K,)}` (initially 1 and 0).
        robust_step_size: the step size of the weights (LibMTL's `robust_step_size`, 1e-2).
    """
    del losses
    dtype = grads[0].dtype
    k = _k_rows(grads)
    grad_sum = [tf.cast(s, dtype) + tf.square(g) for s, g in zip(buffers["grad_sum"], grads)]
    w = tf.add_n([tf.reduce_sum(tf.square(g) / tf.sqrt(s + 1e-7), axis=1)
                  for g, s in zip(grads, grad_sum)])
    initial = tf.cast(state["initial_w"], dtype)
    ready = initial > 0
    ratio = tf.where(ready, w / tf.where(ready, initial, tf.ones_like(initial)), tf.zeros_like(w))
    logits = tf.math.log(tf.cast(state["loss_weight"], dtype)) + robust_step_size * ratio
    # Finite logits: an infinite ratio (a first gradient at the underflow limit) would make
    # softmax inf - inf.
    finite = float(np.finfo(dtype.as_numpy_dtype).max)
    loss_weight = k * tf.nn.softmax(tf.clip_by_value(logits, -finite, finite))
    return _buffered(_combine_rows(grads, loss_weight), loss_weight, {"grad_sum": grad_sum},
                     {"loss_weight": loss_weight, "initial_w": tf.where(ready, initial, w)})


class MoCo(BufferedAggregator):
    """MoCo: min-norm weights on a tracked copy `y` of the loss-scaled unit gradients
    (`moco_update`).

    Args:
        beta: `y`'s step size, in (0, 1]; beta_sigma: its decay (>= 0).
        gamma: the weights' step size; gamma_sigma: its decay; rho: l2 regularisation (>= 0).
    """

    name = "moco"
    citation = "Fernando et al., ICLR 2023"
    buffers = ("y",)
    needs_losses = True

    def __init__(self, beta: float = 0.5, beta_sigma: float = 0.5, gamma: float = 0.1,
                 gamma_sigma: float = 0.5, rho: float = 0.0) -> None:
        # beta = 0 never moves y from 0 (a zero direction for ever); beta > 1 overshoots G.
        check_number("moco", "beta", beta, 0.0, 1.0)
        if beta == 0:
            raise ValueError("aggregator 'moco': beta must be in (0, 1], got 0 (y would stay 0)")
        for key, value in (("beta_sigma", beta_sigma), ("gamma", gamma),
                           ("gamma_sigma", gamma_sigma), ("rho", rho)):
            check_number("moco", key, value, 0.0)
        self._options = {"beta": beta, "beta_sigma": beta_sigma, "gamma": gamma,
                         "gamma_sigma": gamma_sigma, "rho": rho}

    def state_spec(self) -> dict[str, StateSpec]:
        return {"lambd": StateSpec(lambda k: np.full(k, 1.0 / k), 1),
                "step": StateSpec(lambda k: np.zeros((), np.int64), 0)}

    def update(self, blocks: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
               losses: tf.Tensor | None, state: Mapping[str, tf.Tensor]) -> Buffered:
        return moco_update(blocks, buffers, losses, state, **self._options)


class DBMTL(BufferedAggregator):
    """DB-MTL: log-loss balancing, then every head's EMA gradient scaled to the largest
    (`db_mtl_update`).

    Args:
        beta: the EMA's weight of the past, in [0, 1); beta_sigma: its decay (>= 0).
    """

    name = "db_mtl"
    citation = "Lin et al., arXiv:2308.12029 (DB-MTL)"
    buffers = ("grad_buffer",)
    needs_losses = True
    log_losses = True

    def __init__(self, beta: float = 0.9, beta_sigma: float = 0.0) -> None:
        # beta = 1 with beta_sigma = 0 keeps the buffer at 0 for ever.
        check_number("db_mtl", "beta", beta, 0.0, 1.0, closed_high=False)
        check_number("db_mtl", "beta_sigma", beta_sigma, 0.0)
        self._options = {"beta": beta, "beta_sigma": beta_sigma}

    def state_spec(self) -> dict[str, StateSpec]:
        return {"step": StateSpec(lambda k: np.zeros((), np.int64), 0)}

    def update(self, blocks: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
               losses: tf.Tensor | None, state: Mapping[str, tf.Tensor]) -> Buffered:
        return db_mtl_update(blocks, buffers, losses, state, **self._options)


class ExcessMTL(BufferedAggregator):
    """ExcessMTL: loss weights raised by each head's estimated excess risk
    (`excess_mtl_update`).

    Args:
        robust_step_size: the step size of the weights (>= 0; LibMTL's 1e-2).
    """

    name = "excess_mtl"
    citation = "He et al., ICML 2024"
    buffers = ("grad_sum",)

    def __init__(self, robust_step_size: float = 1e-2) -> None:
        check_number("excess_mtl", "robust_step_size", robust_step_size, 0.0)
        self._options = {"robust_step_size": robust_step_size}

    def state_spec(self) -> dict[str, StateSpec]:
        return {"loss_weight": StateSpec(lambda k: np.ones(k), 1),
                "initial_w": StateSpec(lambda k: np.zeros(k), 1)}

    def update(self, blocks: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
               losses: tf.Tensor | None, state: Mapping[str, tf.Tensor]) -> Buffered:
        return excess_mtl_update(blocks, buffers, losses, state, **self._options)
