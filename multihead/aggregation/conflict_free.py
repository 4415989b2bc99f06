"""ConFIG (Liu et al., "ConFIG: Towards Conflict-free Training of Physics Informed Neural
Networks", ICLR 2025)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _diagonal_scaling, _eps, _k, _no_projection
from multihead.aggregation.base import GramianWeighting, Weighting

def config_weighting(gram: tf.Tensor) -> Weighting:
    """ConFIG (Liu et al., "ConFIG: Towards Conflict-free Training of Physics Informed
    Neural Networks", ICLR 2025): equal positive projection on every unit gradient.

    The direction is `x = pinv(U) 1`, `U` the matrix of unit gradients `u_k`
    (the least-norm x with `u_k . x = 1` for every k), rescaled to length
    `sum_k g_k . x / |x|`: `d = (sum_k g_k . x / |x|^2) x` (the authors' code and
    torchjd's ConFIG with its default weights 1). From the Gramian:
    `x = G^T beta`, `beta = diag(1/|g|) cos^+ 1`, with the pseudo-inverse of the
    cosine matrix taken over its eigenvalues above `K eps` times the largest (torch's
    `pinv(U)` cuts U's singular values at `max(K, D) eps` times the largest instead).
    A zero gradient has no unit vector: it gets weight 0 (torchjd: `nan_to_num`).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    cos, s, _ = _diagonal_scaling(gram)
    lam, v = tf.linalg.eigh(cos)
    kept = lam > tf.reduce_max(lam) * k * _eps(dtype)
    inv = tf.where(kept, 1.0 / tf.where(kept, lam, tf.ones_like(lam)), tf.zeros_like(lam))
    y = tf.linalg.matvec(v, inv * tf.reduce_sum(v, axis=0))     # cos^+ 1
    beta = s * y
    gram_beta = tf.linalg.matvec(gram, beta)
    scale = tf.math.divide_no_nan(tf.reduce_sum(gram_beta), tf.tensordot(beta, gram_beta, 1))
    return Weighting(scale * beta, _no_projection())


class ConFIG(GramianWeighting):
    """ConFIG: equal positive projection on every unit gradient (`config_weighting`)."""

    name = "config"
    citation = "Liu et al., ICLR 2025"

    def __init__(self) -> None:
        self._options: dict[str, Any] = {}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return config_weighting(gram)
