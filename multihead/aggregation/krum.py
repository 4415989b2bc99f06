"""Krum and Multi-Krum (Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant
Gradient Descent", NeurIPS 2017)."""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection
from multihead.aggregation.base import GramianWeighting, Weighting, check_number

def krum_weighting(gram: tf.Tensor, n_byzantine: int = 0, n_selected: int = 1) -> Weighting:
    """Krum / Multi-Krum (Blanchard et al., "Machine Learning with Adversaries: Byzantine
    Tolerant Gradient Descent", NeurIPS 2017): the mean of the most central gradients.

    Each gradient's score is the sum of its squared distances
    `|g_i - g_j|^2 = gram_ii + gram_jj - 2 gram_ij` to its `K - n_byzantine - 2`
    nearest other gradients, as the paper defines it (its score `s(i)`); the
    `n_selected` gradients with the lowest scores are averaged (ties: lowest index).
    torchjd's Krum sums plain distances `|g_i - g_j|` instead, which can select other
    gradients (`tests/aggregation/test_krum.py` shows a case). With fewer heads than
    `n_byzantine + 3` (a step with a head dropped), each score is the distance to
    the nearest other gradient.

    Args:
        gram: `K x K` Gramian.
        n_byzantine: f, the number of gradients that may be arbitrary.
        n_selected: m, how many of the best-scored gradients are averaged (1: Krum).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    if k == 1:
        return Weighting(tf.ones([1], dtype), _no_projection())
    sq = tf.linalg.diag_part(gram)
    dist = tf.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0)
    # Self excluded by position rather than as "the smallest": duplicates are also at 0.
    dist = tf.where(tf.eye(k, dtype=tf.bool), tf.constant(np.inf, dtype), dist)
    n_closest = min(max(k - n_byzantine - 2, 1), k - 1)
    nearest = -tf.math.top_k(-dist, k=n_closest).values
    scores = tf.reduce_sum(nearest, axis=1)
    m = min(n_selected, k)
    chosen = tf.math.top_k(-scores, k=m).indices
    weights = tf.reduce_sum(tf.one_hot(chosen, k, dtype=dtype), axis=0) / m
    return Weighting(weights, _no_projection())


class Krum(GramianWeighting):
    """Krum / Multi-Krum: the mean of the most central gradients (`krum_weighting`).

    Args:
        n_byzantine: f, the number of heads whose gradient may be arbitrary (required).
        n_selected: m, how many of the best-scored gradients are averaged (1: Krum).
    """

    name = "krum"
    citation = "Blanchard et al., NeurIPS 2017"

    def __init__(self, n_byzantine: int | None = None, n_selected: int = 1) -> None:
        if n_byzantine is None:
            raise ValueError("aggregator 'krum' needs n_byzantine=f, the number of heads whose "
                             "gradient may be arbitrary (an integer >= 0)")
        check_number("krum", "n_byzantine", n_byzantine, 0, integer=True)
        check_number("krum", "n_selected", n_selected, 1, integer=True)
        self._options = {"n_byzantine": n_byzantine, "n_selected": n_selected}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return krum_weighting(gram, **self._options)
