"""The pure math of the monitor: norms, dot products, cosines, histograms and the gradients an
optimizer applies after its own clipping, on gradients as the step has them (dense or
`IndexedSlices`, any float dtype; computed in float32, histograms in float64)."""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

_Grad = tf.Tensor | tf.IndexedSlices | None
HISTOGRAM_BINS = 30


def _dense(grad: tf.Tensor | tf.IndexedSlices) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(grad), tf.float32)


def global_norm(tensors: Sequence[tf.Tensor | tf.IndexedSlices]) -> tf.Tensor:
    """L2 norm of the concatenation of `tensors` (float32), 0 for an empty list."""
    if not tensors:
        return tf.constant(0.0)
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(_dense(t))) for t in tensors]))


def flat_dot(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor]) -> tf.Tensor:
    """Dot product of the concatenations of `a` and `b` (same shapes, pairwise)."""
    return tf.add_n([tf.reduce_sum(_dense(x) * _dense(y)) for x, y in zip(a, b)])


def cosine(dot: tf.Tensor, norm_a: tf.Tensor, norm_b: tf.Tensor) -> tf.Tensor:
    """`dot / (norm_a * norm_b)`, and 0 when either vector is zero (no direction)."""
    return tf.math.divide_no_nan(dot, norm_a * norm_b)


def histogram_buckets(values: tf.Tensor, bins: int = HISTOGRAM_BINS) -> tf.Tensor:
    """TensorBoard's histogram format: `[bins, 3]` float64 rows `(left, right, count)`.

    Equal-width bins over `[min, max]` of the (non-empty) values; when all values
    are equal, a range of width 1 centred on them. One `histogram_fixed_width`
    op: TensorBoard's `tf.summary.histogram` builds dozens of ops and a `tf.cond`
    per call, which multiplied the step's trace time.
    """
    flat = tf.reshape(tf.cast(values, tf.float64), [-1])
    low, high = tf.reduce_min(flat), tf.reduce_max(flat)
    same = tf.equal(low, high)
    low = tf.where(same, low - 0.5, low)
    high = tf.where(same, high + 0.5, high)
    counts = tf.histogram_fixed_width(flat, tf.stack([low, high]), nbins=bins)
    edges = low + (high - low) * tf.range(bins + 1, dtype=tf.float64) / bins
    return tf.stack([edges[:-1], edges[1:], tf.cast(counts, tf.float64)], axis=1)


def clipped_gradients(optimizer: keras.optimizers.Optimizer,
                      grads: Sequence[_Grad]) -> list[tf.Tensor] | None:
    """The gradients as `optimizer` applies them after its own clipping (`clipnorm` per
    variable, else `global_clipnorm`, else `clipvalue`, Keras' order), or None when it
    does not clip."""
    dense = [_dense(g) for g in grads]
    if optimizer.clipnorm:
        return [tf.clip_by_norm(g, optimizer.clipnorm) for g in dense]
    if optimizer.global_clipnorm:
        return tf.clip_by_global_norm(dense, optimizer.global_clipnorm)[0]
    if optimizer.clipvalue:
        return [tf.clip_by_value(g, -optimizer.clipvalue, optimizer.clipvalue) for g in dense]
    return None
