"""IMTL-G (Liu et al., "Towards Impartial Multi-task Learning", ICLR 2021)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _diagonal_scaling, _k, _no_projection
from multihead.aggregation.base import GramianWeighting, Weighting

def imtl_weighting(gram: tf.Tensor) -> Weighting:
    """IMTL-G (Liu et al., ICLR 2021): the aggregate has equal projections on every unit g_k.

    With `u_k = g_k / |g_k|` the paper's closed form
    `alpha_{2..K} = g_1 U^T (D U^T)^{-1}`, `alpha_1 = 1 - sum alpha_{2..K}`
    (`D = [g_1 - g_k]`, `U = [u_1 - u_k]`) solves `d . u_k = d . u_1` for every k
    and `sum alpha = 1`, with `d = alpha @ G`. Here the same conditions are one
    `(K+1) x (K+1)` system in `beta = alpha * |g|`: `cos @ beta = t 1`,
    `sum beta / |g| = 1` (`cos` the cosine matrix, `t` the common projection),
    well scaled whatever the spread of the norms. A zero gradient has no direction:
    its row is dropped (`alpha_k = 0`, the answer on the other rows); with every
    gradient zero, `alpha = 1/K`. When the system is singular (parallel gradients,
    more heads than gradient dimensions) the least-squares solution is taken,
    where `solve` would fail the step.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    if k == 1:
        return Weighting(tf.ones([1], dtype), _no_projection())
    cos, s, zero = _diagonal_scaling(gram)
    keep = tf.cast(tf.logical_not(zero), dtype)
    # Zero rows: the equation beta_k = 0 in place of a projection condition.
    top = tf.concat([cos + tf.linalg.diag(1.0 - keep), -keep[:, None]], axis=1)      # (K, K+1)
    inv_norm = s / tf.reduce_max(s)                  # the sum condition divided by max 1/|g|
    bottom = tf.concat([inv_norm, tf.zeros([1], dtype)], axis=0)[None, :]            # (1, K+1)
    rhs = tf.concat([tf.zeros([k], dtype), [1.0 / tf.reduce_max(s)]], axis=0)[:, None]
    beta = tf.linalg.lstsq(tf.concat([top, bottom], axis=0), rhs, fast=False)[:k, 0]
    alpha = beta * s * keep
    uniform = tf.fill([k], tf.constant(1.0 / k, dtype))
    return Weighting(tf.where(tf.reduce_all(zero), uniform, alpha), _no_projection())


class IMTLG(GramianWeighting):
    """IMTL-G: the aggregate has equal projections on every unit gradient (`imtl_weighting`)."""

    name = "imtl"
    citation = "Liu et al., ICLR 2021 (IMTL-G)"
    rep_grad = True

    def __init__(self) -> None:
        self._options: dict[str, Any] = {}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return imtl_weighting(gram)
