"""The name of one number of an evaluation: `eval/<head>/<metric>` or `eval/mean_loss`.

Callbacks' `monitor`, a sweep's `--objective` and the config checks all name evaluation
numbers this way; `MetricKey` is the one place that reads and writes that name, and that
knows which way the number improves.

Example:
    >>> key = MetricKey.parse("eval/y1/accuracy")
    >>> key.head, key.metric, key.direction, str(key)
    ('y1', 'accuracy', 'max', 'eval/y1/accuracy')
    >>> MetricKey.parse("eval/mean_loss").is_mean_loss
    True
"""

from __future__ import annotations

import dataclasses
from typing import Literal

SPLIT = "eval"
MEAN_LOSS = "eval/mean_loss"
FORMS = "eval/<head>/<metric> or eval/mean_loss"

# Substrings of a metric's name that say which way it improves (Keras' names and aliases:
# `mean_absolute_error`, `binary_crossentropy`, `sparse_categorical_accuracy`, `auc`, ...).
_LOWER_IS_BETTER = ("loss", "error", "mae", "mse", "rmse", "mape", "msle", "crossentropy",
                    "hinge", "divergence", "poisson", "logcosh", "log_cosh", "huber")
_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1", "iou", "r2", "correlation")


@dataclasses.dataclass(frozen=True)
class MetricKey:
    """One number of an evaluation.

    Attributes:
        head: the head whose metric it is; `None` for the mean of the heads' losses.
        metric: the metric's name as the evaluation reports it (`loss` for the mean loss).
    """

    head: str | None
    metric: str = "loss"

    @classmethod
    def mean_loss(cls) -> MetricKey:
        """`eval/mean_loss`: the mean of the heads' evaluation losses."""
        return cls(None, "loss")

    @classmethod
    def parse(cls, text: str) -> MetricKey:
        """Reads `eval/<head>/<metric>` or `eval/mean_loss`.

        Raises:
            ValueError: `text` is neither form (the message shows the value and the forms).
        """
        if text == MEAN_LOSS:
            return cls.mean_loss()
        parts = text.split("/") if isinstance(text, str) else []
        if len(parts) != 3 or parts[0] != SPLIT or not all(parts[1:]):
            raise ValueError(f"must be {FORMS}, got {text!r}")
        return cls(parts[1], parts[2])

    @property
    def is_mean_loss(self) -> bool:
        return self.head is None

    @property
    def tag(self) -> str:
        """The TensorBoard tag of this number in a run's `eval/` events (`<metric>/<head>`);
        the mean loss has none of its own."""
        if self.head is None:
            raise ValueError(f"{MEAN_LOSS} has no TensorBoard tag; it is the mean of loss/<head>")
        return f"{self.metric}/{self.head}"

    @property
    def direction(self) -> Literal["min", "max"] | None:
        """`"min"` for losses and errors, `"max"` for accuracies, AUC, precision, recall,
        ...; `None` when the metric's name does not say (see `metric_direction`)."""
        return metric_direction(self.metric)

    def __str__(self) -> str:
        return MEAN_LOSS if self.head is None else f"{SPLIT}/{self.head}/{self.metric}"


def metric_direction(metric: str) -> Literal["min", "max"] | None:
    """Which way a metric named `metric` improves: `"min"` (its name says loss, error,
    crossentropy, ...), `"max"` (accuracy, AUC, precision, recall, F1, IoU, R², correlation)
    or `None`."""
    name = metric.lower()
    if any(word in name for word in _LOWER_IS_BETTER):
        return "min"
    if any(word in name for word in _HIGHER_IS_BETTER):
        return "max"
    return None
