"""Aligned-MTL (Senushkin et al., "Independent Component Alignment for Multi-Task Learning",
CVPR 2023)."""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _eps, _k, _no_projection
from multihead.aggregation.base import GramianWeighting, Weighting, check_one_of

def aligned_mtl_weighting(gram: tf.Tensor, scale_mode: str = "min") -> Weighting:
    """Aligned-MTL (Senushkin et al., "Independent Component Alignment for Multi-Task
    Learning", CVPR 2023): align the gradients to an orthogonal, equally scaled system.

    With `gram = V diag(lambda) V^T` restricted to its rank (eigenvalues above
    `max(lambda) K eps`, as the authors' code), `B = sqrt(sigma) V diag(lambda^-1/2) V^T`
    makes the aligned gradients `B^T G` orthogonal with equal norms `sqrt(sigma)`;
    the update is their sum, `w = B @ 1` (the authors' and LibMTL's task weights 1).
    `sigma` is the smallest kept eigenvalue (`scale_mode="min"`, default), their
    lower median (`"median"`) or their mean (`"rmse"`), as the authors'
    `ProcrustesSolver`. With every gradient zero, `w = 0`.

    Args:
        gram: `K x K` Gramian.
        scale_mode: `"min"`, `"median"` or `"rmse"`.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    lam, v = tf.linalg.eigh(gram)                              # ascending
    tol = tf.reduce_max(lam) * k * _eps(dtype)
    kept = lam > tol
    rank = tf.reduce_sum(tf.cast(kept, tf.int32))
    inv_sqrt = tf.where(kept, tf.math.rsqrt(tf.where(kept, lam, tf.ones_like(lam))),
                        tf.zeros_like(lam))
    if scale_mode == "min":
        sigma = tf.reduce_min(tf.where(kept, lam, tf.constant(np.inf, dtype)))
    elif scale_mode == "median":        # torch.median: the lower median of the kept ones
        sigma = tf.gather(lam, tf.maximum(k - rank + (rank - 1) // 2, 0))
    else:
        sigma = tf.math.divide_no_nan(tf.reduce_sum(tf.where(kept, lam, tf.zeros_like(lam))),
                                      tf.cast(rank, dtype))
    sigma = tf.where(rank > 0, sigma, tf.zeros_like(sigma))
    b = tf.sqrt(sigma) * tf.matmul(v * inv_sqrt[None, :], v, transpose_b=True)
    return Weighting(tf.reduce_sum(b, axis=1), _no_projection())


class AlignedMTL(GramianWeighting):
    """Aligned-MTL: the gradients aligned to an orthogonal, equally scaled system
    (`aligned_mtl_weighting`).

    Args:
        scale_mode: `"min"`, `"median"` or `"rmse"`.
    """

    name = "aligned_mtl"
    citation = "Senushkin et al., CVPR 2023"
    rep_grad = True

    def __init__(self, scale_mode: str = "min") -> None:
        check_one_of("aligned_mtl", "scale_mode", scale_mode, ("min", "median", "rmse"))
        self._options = {"scale_mode": scale_mode}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return aligned_mtl_weighting(gram, **self._options)
