"""Small numerical helpers shared by the aggregation methods (Gramian, dtypes, rounding)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf



def gramian(grads: tf.Tensor, dtype: tf.DType | str = tf.float32) -> tf.Tensor:
    """`G G^T` of a `K x D` gradient matrix (inner products of the heads' gradients)."""
    grads = tf.cast(tf.convert_to_tensor(grads), dtype)
    return tf.matmul(grads, grads, transpose_b=True)


def _as_gram(gram: tf.Tensor) -> tf.Tensor:
    """The Gramian as a float tensor: float64 stays float64 (analysis), anything else float32."""
    gram = tf.convert_to_tensor(gram)
    return gram if gram.dtype in (tf.float32, tf.float64) else tf.cast(gram, tf.float32)


def _eps(dtype: tf.DType) -> float:
    return float(np.finfo(dtype.as_numpy_dtype).eps)


def _ridge(dtype: tf.DType, k: int) -> float:
    """Ridge added to a unit-diagonal K x K system so that rounding never makes it indefinite:
    a few times the rounding error of its entries, so it moves a well-posed solution by about
    as much as rounding does (float32 ~2.4e-7 K, float64 ~4.4e-16 K)."""
    return 2.0 * k * _eps(dtype)


def _feasibility_tol(dtype: tf.DType) -> float:
    """How far below its bound an active-set candidate may fall and still count as feasible."""
    return 100.0 * _eps(dtype)


def _diagonal_scaling(gram: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`(C, s, zero)`: `C = diag(s) gram diag(s)` with `s_i = 1 / |g_i|`, the cosine matrix.

    Solving on `C` instead of `gram` keeps every system's diagonal at 1 whatever the
    spread of the heads' gradient norms (a ridge added after dividing by the largest
    diagonal entry would swamp a head 1e4x smaller than the largest). `zero` flags rows
    whose norm is below rounding of the largest (`|g_i| <= eps |g|_max`, all rows when
    every gradient is 0); `s_i = 0` there, so their rows and columns of `C` are 0.
    """
    d = tf.linalg.diag_part(gram)
    eps = _eps(gram.dtype)
    zero = d <= eps**2 * tf.reduce_max(d)
    s = tf.where(zero, tf.zeros_like(d), tf.math.rsqrt(tf.where(zero, tf.ones_like(d), d)))
    return gram * s[:, None] * s[None, :], s, zero


def _k(gram: tf.Tensor) -> int:
    k = gram.shape[0]
    if k is None:
        raise ValueError("the Gramian needs a static number of heads (rows)")
    return int(k)


def _no_projection() -> tf.Tensor:
    return tf.constant(0, tf.int32)


def _rows_times(w: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
    """`w @ q` for `w` of shape `(..., K)`, as one 2-D matmul (a broadcasting batched matmul
    costs ~70 us on these tiny shapes)."""
    return tf.reshape(tf.matmul(tf.reshape(w, [-1, q.shape[0]]), q), tf.shape(w))


def _quadratic_forms(w: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
    """`w_r^T q w_r` for every row `w_r` of `w` (`(..., K)`), without a 3-operand einsum
    (which runs as two slow einsum kernels on these tiny shapes)."""
    return tf.reduce_sum(_rows_times(w, q) * w, axis=-1)


def _k_rows(blocks: Sequence[tf.Tensor]) -> int:
    k = blocks[0].shape[0]
    if k is None:
        raise ValueError("the gradients need a static number of heads (rows)")
    return int(k)
