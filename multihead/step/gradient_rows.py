"""The heads' gradients of one trunk source as rows: stacks, weighted sums and Gramians,
without concatenating the trunk's variables (pure functions of the aggregated trunk update,
`multihead.step.trunk_update`)."""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf


def all_but(k: int, without: tf.Tensor) -> tf.Tensor:
    """The `k - 1` positions `0..k-1` other than `without`, in order (a static shape)."""
    positions = tf.range(k - 1, dtype=tf.int32)
    return positions + tf.cast(positions >= without, tf.int32)


def split_rows(stacked: Sequence[tf.Tensor], per_head: Sequence[Sequence[tf.Tensor | None]],
               sources: Sequence[Any], k: int) -> list[list[tf.Tensor | None]]:
    """The rows of the `k x n` stacks as per-head gradients shaped as the sources; None
    for a source no head's gradient depends on (as `per_head` says)."""
    out: list[list[tf.Tensor | None]] = [[] for _ in range(k)]
    for j, (block, source) in enumerate(zip(stacked, sources)):
        rows: list[tf.Tensor | None] = [None] * k
        if any(g[j] is not None for g in per_head):
            shape = source.shape if source.shape.is_fully_defined() else tf.shape(source)
            rows = [tf.reshape(r, shape) for r in tf.unstack(block, num=k)]
        for i in range(k):
            out[i].append(rows[i])
    return out


def stack_rows(grads: Sequence[tf.Tensor | None], like: Any) -> tf.Tensor:
    """K gradients of one variable (None = no dependence) as a `K x n` matrix."""
    rows = [tf.reshape(g if g is not None else tf.zeros_like(like), [-1]) for g in grads]
    return tf.stack(rows)


def weighted_sum(grads: Sequence[tf.Tensor | None], weights: Sequence[float | tf.Tensor],
                 like: Any) -> tf.Tensor:
    """`sum_k weights[k] grads[k]` (None = no dependence), without a `K x n` stack.

    `weights` are Python floats when known at trace time (a weight of 1 costs no
    multiply) or scalar tensors.
    """
    terms = [g if isinstance(w, float) and w == 1.0 else w * g
             for g, w in zip(grads, weights) if g is not None]
    return tf.add_n(terms) if terms else tf.zeros_like(like)


def pairwise_gramian(per_head: Sequence[Sequence[tf.Tensor | None]],
                     dtype: tf.DType = tf.float32) -> tf.Tensor:
    """`G G^T` from the K(K+1)/2 inner products of the heads' gradients (no stacking)."""
    k = len(per_head)

    def cast(x: tf.Tensor) -> tf.Tensor:
        return x if x.dtype == dtype else tf.cast(x, dtype)

    def dot(a: int, b: int) -> tf.Tensor:
        terms = [tf.reduce_sum(cast(x) * cast(y)) for x, y in zip(per_head[a], per_head[b])
                 if x is not None and y is not None]
        return tf.add_n(terms) if terms else tf.constant(0.0, dtype)

    upper = {(a, b): dot(a, b) for a in range(k) for b in range(a, k)}
    return tf.stack([tf.stack([upper[min(a, b), max(a, b)] for b in range(k)]) for a in range(k)])


def gramian(stacked: Sequence[tf.Tensor], dtype: tf.DType = tf.float32) -> tf.Tensor:
    """`G G^T` summed over the per-variable `K x n` blocks of G (no concatenation)."""
    blocks = [s if s.dtype == dtype else tf.cast(s, dtype) for s in stacked]
    return tf.add_n([tf.matmul(s, s, transpose_b=True) for s in blocks])
