"""Reference scores a trained head must beat."""

from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from multihead.objectives.objective import HeadLoss, Weighted, label_marker, present_labels


def constant_baseline(
    loss: HeadLoss,
    head: str,
    y_train: np.ndarray,
    y_eval: np.ndarray,
    output_shape: Sequence[int],
    steps: int = 500,
    learning_rate: float = 0.05,
) -> float:
    """Eval loss of the best constant predictor fitted on the training labels.

    The constant (one value per output unit) is fitted by Adam on the head's own
    loss over the whole training set, so the baseline is right for any loss:
    the label mean for MSE, the log-odds of the prior for a logit cross-entropy,
    the median for MAE.

    Args:
        loss: the head's resolved loss.
        head: the head's name (the key of its labels).
        y_train, y_eval: the head's labels.
        output_shape: shape of one example's output (e.g. `(1,)`).
        steps, learning_rate: of the fit.
    """
    const = _fit_constant(loss, head, y_train, output_shape, steps, learning_rate)
    return float(_constant_loss(loss, head, const, tf.constant(y_eval)))


def constant_baseline_metrics(
    loss: HeadLoss,
    head: str,
    y_train: np.ndarray,
    y_eval: np.ndarray,
    output_shape: Sequence[int],
    metrics: Sequence[keras.metrics.Metric] = (),
    w_train: np.ndarray | None = None,
    w_eval: np.ndarray | None = None,
) -> dict[str, float]:
    """The best constant predictor's eval loss (as `constant_baseline`) and its value of
    each of `metrics` on the eval labels (e.g. the majority class's accuracy), by name.

    Args:
        loss, head, y_train, y_eval, output_shape: as for `constant_baseline`.
        metrics: the head's metric objects (each is reset before and after).
        w_train, w_eval: the head's sample weights, if it has them: the constant is fitted
            on the weighted train loss, and the loss and metrics are weighted as the
            head's own evaluation weighs them, so the two compare like for like.
    """
    const = _fit_constant(loss, head, y_train, output_shape, 500, 0.05, w_train)
    labels = tf.constant(y_eval)
    weights = None if w_eval is None else tf.constant(w_eval, tf.float32)
    result = {"loss": float(_constant_loss(loss, head, const, labels, weights))}
    marker = label_marker(loss)
    if marker is not None:  # the metrics, as the head's, see the present labels only
        present, _ = present_labels(labels, marker)
        labels = tf.boolean_mask(labels, present)
        weights = None if weights is None else tf.boolean_mask(weights, present)
    outputs = tf.broadcast_to(const, (int(tf.shape(labels)[0]), *const.shape))
    for metric in metrics:
        metric.reset_state()
        metric.update_state(labels, outputs, sample_weight=weights)
        result[metric.name] = float(metric.result())
        metric.reset_state()
    return result


def _constant_loss(loss: HeadLoss, head: str, const: tf.Variable, labels: tf.Tensor,
                   weights: tf.Tensor | None = None) -> tf.Tensor:
    n = tf.shape(labels)[0]
    outputs = tf.broadcast_to(const, tf.concat([[n], tf.shape(const)], 0))
    return loss(None, {head: labels if weights is None else Weighted(labels, weights)}, outputs)


def _fit_constant(loss: HeadLoss, head: str, y_train: np.ndarray, output_shape: Sequence[int],
                  steps: int, learning_rate: float, w_train: np.ndarray | None = None,
                  ) -> tf.Variable:
    """The constant output minimising the head's (weighted) loss on the training labels (Adam)."""
    y_train_t = tf.constant(y_train)
    w_train_t = None if w_train is None else tf.constant(w_train, tf.float32)
    init = np.zeros(output_shape, np.float32)
    if tuple(np.shape(y_train)[1:]) == tuple(output_shape):
        init = np.asarray(np.average(y_train, axis=0, weights=w_train), np.float32)
        if np.isnan(init).any():  # NaN marks missing labels (data.missing_label): the present ones'
            present = ~np.isnan(y_train)
            init = np.asarray(np.where(present, y_train, 0).sum(axis=0)
                              / np.maximum(present.sum(axis=0), 1), np.float32)
    const = tf.Variable(init)
    optimizer = keras.optimizers.Adam(learning_rate)

    @tf.function
    def fit() -> None:
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                objective = _constant_loss(loss, head, const, y_train_t, w_train_t)
            optimizer.apply_gradients([(tape.gradient(objective, const), const)])

    fit()
    return const
