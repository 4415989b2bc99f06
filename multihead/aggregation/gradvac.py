"""GradVac (Wang et al., "Gradient Vaccine: Investigating and Improving Multi-task Optimization
in Massively Multilingual Models", ICLR 2021)."""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection, _quadratic_forms
from multihead.aggregation.base import StateSpec, StatefulGramianWeighting, Weighting, check_number

def _pairwise_cosines(coeffs_i: tf.Tensor, gram: tf.Tensor, j: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """For rows `c_i @ G` and `g_{j_i}`: the inner products, `|c_i @ G|` and `|g_{j_i}|`."""
    rows_j = tf.gather(gram, j)
    dots = tf.reduce_sum(coeffs_i * rows_j, axis=1)
    norm_i = tf.sqrt(tf.maximum(_quadratic_forms(coeffs_i, gram), 0.0))
    norm_j = tf.sqrt(tf.maximum(tf.gather(tf.linalg.diag_part(gram), j), 0.0))
    return dots, norm_i, norm_j


def gradvac_weighting(gram: tf.Tensor, state: dict[str, tf.Tensor], beta: float = 0.5,
                      order: tf.Tensor | None = None) -> Weighting:
    """GradVac (Wang et al., "Gradient Vaccine: Investigating and Improving Multi-task
    Optimization in Massively Multilingual Models", ICLR 2021): adaptive similarity goals.

    As PCGrad, each head's gradient `g_i'` is altered against every other head j in turn
    (row i of `order`); where the cosine `rho_ij` of `g_i'` and `g_j` is below the goal
    `rho_T[i, j]`, `g_i' += w g_j` with
    `w = |g_i'| (rho_T sqrt(1 - rho^2) - rho sqrt(1 - rho_T^2)) / (|g_j| sqrt(1 - rho_T^2))`
    (their eq. 4), which sets the cosine to the goal. For every visited pair the goal,
    an EMA of the observed cosines, then moves: `rho_T <- (1 - beta) rho_T + beta rho_ij`
    (eq. 5), with `rho_ij` the cosine before the alteration. The aggregate is
    `sum_i g_i'`. As LibMTL's current `GradVac` (the paper's authors published no code;
    LibMTL moved the goal only below it until its commit d2d84fa) with `group_type=0`
    (whole trunk): the norms in the cosine and in `w` get `+ 1e-8`, and `beta`
    defaults to 0.5. State: `rho_T` (`K x K`, initially 0).

    Args:
        gram: `K x K` Gramian.
        state: `{"rho_T": K x K}`.
        beta: the EMA rate of the goals (LibMTL's `GradVac_beta`).
        order: `K x K` int32 projection order, as `pcgrad_weighting` (random each step).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    rho_t = tf.cast(state["rho_T"], dtype)
    if order is None:
        order = tf.tile(tf.range(k)[None, :], [k, 1])
    order = tf.cast(order, tf.int32)
    coeffs = tf.eye(k, dtype=dtype)
    rows = tf.range(k)
    for pos in range(k):
        j = order[:, pos]
        other = tf.not_equal(j, rows)
        dots, norm_i, norm_j = _pairwise_cosines(coeffs, gram, j)
        rho = dots / (norm_i * norm_j + 1e-8)
        index = tf.stack([rows, j], axis=1)
        goal = tf.gather_nd(rho_t, index)
        root_goal = tf.sqrt(tf.maximum(1.0 - goal**2, 0.0))
        root_rho = tf.sqrt(tf.maximum(1.0 - rho**2, 0.0))
        below = other & (rho < goal)
        w = norm_i * (goal * root_rho - rho * root_goal) / (norm_j * root_goal + 1e-8)
        w = tf.where(below, w, 0.0)
        coeffs += w[:, None] * tf.one_hot(j, k, dtype=dtype)
        # The goal moves for every visited pair, whether or not the gradient was altered
        # (LibMTL since d2d84fa, "fix a bug in GradVac"); a head's own pair is never visited.
        rho_t = tf.tensor_scatter_nd_update(
            rho_t, index, tf.where(other, (1.0 - beta) * goal + beta * rho, goal))
    return Weighting(tf.reduce_sum(coeffs, axis=0), _no_projection(),
                     {"rho_T": tf.cast(rho_t, state["rho_T"].dtype)})


class GradVac(StatefulGramianWeighting):
    """GradVac: adaptive cosine goals between pairs of heads (`gradvac_weighting`).

    Args:
        beta: the EMA rate of the goals, in [0, 1] (LibMTL's `GradVac_beta`, 0.5).
    """

    name = "gradvac"
    citation = "Wang et al., ICLR 2021"
    random_order = True

    def __init__(self, beta: float = 0.5) -> None:
        check_number("gradvac", "beta", beta, 0.0, 1.0)
        self._options = {"beta": beta}

    def state_spec(self) -> dict[str, StateSpec]:
        return {"rho_T": StateSpec(lambda k: np.zeros((k, k)), 2)}

    def weigh(self, gram: tf.Tensor, state: dict[str, tf.Tensor] | None = None,
              order: tf.Tensor | None = None, **draws: tf.Tensor) -> Weighting:
        return gradvac_weighting(gram, state, order=order, **self._options)
