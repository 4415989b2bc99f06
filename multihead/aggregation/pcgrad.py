"""PCGrad (Yu et al., "Gradient Surgery for Multi-Task Learning", NeurIPS 2020)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k
from multihead.aggregation.base import GramianWeighting, Weighting

def pcgrad_weighting(gram: tf.Tensor, order: tf.Tensor | None = None) -> Weighting:
    """PCGrad (Yu et al., NeurIPS 2020, Algorithm 1): project away conflicts, then sum.

    For each head i, starting from `g_i' = g_i`, for each other head j in turn
    (row i of `order`): if `g_i' . g_j < 0`, `g_i' -= (g_i' . g_j / |g_j|^2) g_j`
    (projection onto the normal plane of the *original* g_j). The result is
    `sum_i g_i'`. Each `g_i'` is tracked as coefficients `C[i] @ G`, so only the
    Gramian is needed: `g_i' . g_j = C[i] @ gram[:, j]`.

    Args:
        gram: `K x K` Gramian of the heads' gradients.
        order: `K x K` int32, row i a permutation of `0..K-1` giving the order
            in which head i is projected against the others (its own index is
            skipped). The paper shuffles the order at random every step; None
            uses `0, 1, ..., K-1` for every head.

    Returns:
        Weights with `d = weights @ G`, and the number of projections made.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    if order is None:
        order = tf.tile(tf.range(k)[None, :], [k, 1])
    order = tf.cast(order, tf.int32)
    coeffs = tf.eye(k, dtype=gram.dtype)
    rows = tf.range(k)
    projections = tf.constant(0, tf.int32)
    sq_norms = tf.linalg.diag_part(gram)
    for pos in range(k):
        j = order[:, pos]                                    # (K,) the head each row projects on
        rows_j = tf.gather(gram, j)                          # row i: gram[j_i] (= column j_i)
        dots = tf.reduce_sum(coeffs * rows_j, axis=1)        # g_i' . g_{j_i}
        conflict = tf.logical_and(dots < 0.0, tf.not_equal(j, rows))
        scale = tf.where(conflict, tf.math.divide_no_nan(dots, tf.gather(sq_norms, j)), 0.0)
        coeffs -= scale[:, None] * tf.one_hot(j, k, dtype=gram.dtype)
        projections += tf.reduce_sum(tf.cast(conflict, tf.int32))
    return Weighting(tf.reduce_sum(coeffs, axis=0), projections)


class PCGrad(GramianWeighting):
    """PCGrad: each head's gradient projected off the others' it conflicts with, then summed
    (see `pcgrad_weighting`); a fresh random projection order every step."""

    name = "pcgrad"
    citation = "Yu et al., NeurIPS 2020"
    random_order = True
    counts_projections = True

    def __init__(self) -> None:
        self._options: dict[str, Any] = {}

    def weigh(self, gram: tf.Tensor, order: tf.Tensor | None = None, **draws: tf.Tensor) -> Weighting:
        return pcgrad_weighting(gram, order)
