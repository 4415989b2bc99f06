"""Coordinate-wise aggregators, on the K x n gradient blocks (not the Gramian): GradDrop and
the trimmed mean."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from multihead.aggregation.base import CoordinatewiseAggregator, check_number

def graddrop_combine(grads: tf.Tensor, noise: tf.Tensor, leak: float = 0.0) -> tf.Tensor:
    """GradDrop (Chen et al., "Just Pick a Sign: Optimizing Deep Multitask Models with
    Gradient Sign Dropout", NeurIPS 2020), on a `K x n` block of the heads' gradients.

    Per coordinate, the sign purity `P = (1 + sum_k g_k / (sum_k |g_k| + 1e-7)) / 2`
    (LibMTL's 1e-7) and one uniform draw `U` keep the positive gradients where
    `P > U` and the negative ones where `P < U` (mask `M_k`); the result is
    `sum_k (leak + (1 - leak) M_k) g_k` (the paper's leak, default 0 as LibMTL).

    Args:
        grads: `K x n`.
        noise: `(n,)` uniform draws in [0, 1).
        leak: the fraction of every gradient kept whatever its sign.
    """
    purity = 0.5 * (1.0 + tf.reduce_sum(grads, 0) / (tf.reduce_sum(tf.abs(grads), 0) + 1e-7))
    u = tf.cast(noise, grads.dtype)[None, :]
    keep = ((purity[None, :] > u) & (grads > 0)) | ((purity[None, :] < u) & (grads < 0))
    mask = leak + (1.0 - leak) * tf.cast(keep, grads.dtype)
    return tf.reduce_sum(mask * grads, axis=0)


def _column_count(mask: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Per column, how many entries of a `K x n` boolean block are true."""
    return tf.reduce_sum(tf.cast(mask, dtype), axis=0)


def trimmed_mean_combine(grads: tf.Tensor, trim_number: int) -> tf.Tensor:
    """Coordinate-wise trimmed mean (Yin et al., "Byzantine-Robust Distributed Learning:
    Towards Optimal Statistical Rates", ICML 2018; torchjd's `TrimmedMean`): per
    coordinate, the mean of the K values without the `trim_number` largest and
    `trim_number` smallest (fewer when fewer heads take part in a step: at most
    `(K - 1) // 2` from each end).

    Trimming one value at each end needs no sort: with `hi` and `lo` the largest and
    smallest value of a coordinate, the kept values are those strictly between them plus
    the copies of `hi` beyond the one dropped (`#{g == hi} - 1`) and likewise of `lo`;
    when `lo == hi` every value is `hi`. The dropped values never enter a sum, so an
    outlier of any size (even inf) costs the kept values no precision, and repeated values
    give the sorted answer exactly. A sort along the K axis costs several times these
    reductions; from two values at each end on, finding each boundary value by reductions
    costs as much as the sort, which then does it.

    Args:
        grads: `K x n`.
        trim_number: values dropped at each end.
    """
    k = grads.shape[0]
    t = min(trim_number, (k - 1) // 2)
    if t == 0:
        return tf.reduce_mean(grads, axis=0)
    if t > 1:
        ordered = tf.sort(grads, axis=0)
        return tf.reduce_mean(ordered[t:k - t], axis=0)
    dtype = grads.dtype
    hi = tf.reduce_max(grads, axis=0)
    lo = tf.reduce_min(grads, axis=0)
    zero = tf.zeros_like(hi)
    between = (grads > lo) & (grads < hi)
    inner = tf.reduce_sum(tf.where(between, grads, tf.zeros_like(grads)), 0)
    # A repeated max or min (with lo < hi) keeps copies of it: counted only when some
    # coordinate has one, as float gradients rarely do (all-equal coordinates have lo == hi).
    repeats = tf.reduce_any((_column_count(between, dtype) < k - 2) & (lo < hi))

    def with_repeats() -> tf.Tensor:
        hi_kept = _column_count(grads >= hi, dtype) - 1.0
        lo_kept = _column_count(grads <= lo, dtype) - 1.0
        # where(): no copy of an infinite hi or lo kept must add 0, not 0 * inf = nan.
        return (inner + tf.where(hi_kept > 0, hi_kept * hi, zero)
                + tf.where(lo_kept > 0, lo_kept * lo, zero))

    total = tf.cond(repeats, with_repeats, lambda: inner)
    return tf.where(lo < hi, total / (k - 2), hi)


class GradDrop(CoordinatewiseAggregator):
    """GradDrop: per coordinate, keep the sign that wins a random draw (`graddrop_combine`).

    Args:
        leak: the fraction of every gradient kept whatever its sign, in [0, 1].
    """

    name = "graddrop"
    citation = "Chen et al., NeurIPS 2020"
    rep_grad = True
    noise = "uniform"

    def __init__(self, leak: float = 0.0) -> None:
        check_number("graddrop", "leak", leak, 0.0, 1.0)
        self._options = {"leak": leak}

    def combine(self, block: tf.Tensor, noise: tf.Tensor | None = None, **draws: Any) -> tf.Tensor:
        if noise is None:
            raise ValueError("aggregator 'graddrop' needs noise=: one uniform draw per coordinate")
        return graddrop_combine(block, noise, **self._options)


class TrimmedMean(CoordinatewiseAggregator):
    """Coordinate-wise trimmed mean (`trimmed_mean_combine`).

    Args:
        trim_number: values dropped at each end of every coordinate (required, >= 0).
    """

    name = "trimmed_mean"
    citation = "Yin et al., ICML 2018"

    def __init__(self, trim_number: int | None = None) -> None:
        if trim_number is None:
            raise ValueError("aggregator 'trimmed_mean' needs trim_number=t, the number of values "
                             "dropped at each end of every coordinate (an integer >= 0)")
        check_number("trimmed_mean", "trim_number", trim_number, 0, integer=True)
        self._options = {"trim_number": trim_number}

    def check_heads(self, num_heads: int) -> None:
        # Checked on all heads; a step with fewer heads trims fewer (`trimmed_mean_combine`).
        t = self._options["trim_number"]
        if num_heads <= 2 * t:
            raise ValueError(f"aggregator 'trimmed_mean': trim_number={t} "
                             f"drops every value of {num_heads} heads; it must be < K/2")

    def combine(self, block: tf.Tensor, **draws: Any) -> tf.Tensor:
        return trimmed_mean_combine(block, **self._options)
