"""`MonitoredQuantity`: the number a callback watches in an evaluation's metrics, and the
direction that improves it."""

from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

from multihead._checks import check_choice
from multihead.monitoring.metric_key import MetricKey
from multihead.training.callbacks.base import Metrics


#: Metric names (or parts of names) for which smaller is better / larger is better.
MODES = ("auto", "min", "max")


class MonitoredQuantity:
    """A number taken from the metrics of an evaluation, and the direction that improves it.

    Example:
        >>> q = MonitoredQuantity("eval/a/loss", "auto", owner="EarlyStopping")
        >>> q.mode, q.value({"a": {"loss": 0.5}})
        ('min', 0.5)
        >>> q.improves(0.4, best=0.5, min_delta=0.05)
        True

    Args:
        monitor: `"eval/<head>/<metric>"` (`<metric>` is `loss` or a metric of the head's
            `Objective`), `"eval/mean_loss"` (the mean of the heads' eval losses), or a
            callable of the metrics dict `{head: {"loss": v, metric: v}}` returning a number.
        mode: `"min"`, `"max"`, or `"auto"`: from the metric name (losses and errors
            `"min"`, accuracies, AUC, precision, recall `"max"`); a callable needs
            `"min"` or `"max"`.
        owner: the callback's name, for error messages.
    """

    def __init__(self, monitor: str | Callable[[Metrics], float], mode: str, owner: str) -> None:
        self.owner = owner
        check_choice(mode, f"{owner}.mode", MODES)
        if callable(monitor):
            if mode == "auto":
                raise ValueError(f"{owner}: mode='auto' cannot tell whether the callable monitor "
                                 f"{getattr(monitor, '__name__', monitor)!r} should go down or up; "
                                 "pass mode='min' or mode='max'")
            self.key: MetricKey | None = None
        elif isinstance(monitor, str):
            try:
                self.key = MetricKey.parse(monitor)
            except ValueError:
                raise ValueError(f"{owner}: monitor must be 'eval/<head>/<metric>', 'eval/mean_loss' "
                                 f"or a callable of the eval metrics, got {monitor!r}") from None
        else:
            raise TypeError(f"{owner}: monitor must be a string or a callable, got {monitor!r}")
        self.monitor = monitor
        self.name = monitor if isinstance(monitor, str) else getattr(monitor, "__name__", "monitor")
        self.mode = mode if mode != "auto" else self._auto_mode()

    def _auto_mode(self) -> str:
        direction = self.key.direction  # type: ignore[union-attr]
        if direction is not None:
            return direction
        raise ValueError(f"{self.owner}: mode='auto' cannot tell whether {self.monitor!r} should go "
                         "down or up; pass mode='min' or mode='max'")

    @staticmethod
    def keys(metrics: Metrics) -> list[str]:
        """Every monitor string an evaluation with these metrics answers."""
        return [str(MetricKey(h, m)) for h, values in metrics.items() for m in values] + [
            str(MetricKey.mean_loss())]

    def value(self, metrics: Metrics) -> float:
        """The watched number in an evaluation's metrics.

        Raises:
            ValueError: the monitor names a head or metric the evaluation does not have.
        """
        if self.key is None:
            value = self.monitor(metrics)  # type: ignore[operator]
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{self.owner}: the monitor {self.name!r} returned {value!r}; "
                                "it must return a number")
            return float(value)
        if self.key.is_mean_loss:
            return float(np.mean([values["loss"] for values in metrics.values()]))
        head, metric = self.key.head, self.key.metric
        if head not in metrics or metric not in metrics[head]:
            raise ValueError(f"{self.owner}: monitor {self.monitor!r} is not in the evaluation; "
                             f"available: {self.keys(metrics)}")
        return float(metrics[head][metric])

    def improves(self, value: float, best: float | None, min_delta: float) -> bool:
        """True if `value` beats `best` by more than `min_delta` (always for the first
        value; never for NaN)."""
        if math.isnan(value):
            return False
        if best is None:
            return True
        return value < best - min_delta if self.mode == "min" else value > best + min_delta

