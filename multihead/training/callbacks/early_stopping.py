"""`EarlyStopping`: stops `fit` when a monitored evaluation quantity stops improving."""

from __future__ import annotations

from typing import Callable

import numpy as np

from multihead._checks import check_choice, check_float, check_int
from multihead.training.callbacks.base import Callback, Metrics
from multihead.training.callbacks.monitored import MonitoredQuantity


class EarlyStopping(Callback):
    """Stops `fit` when a monitored evaluation metric stops improving, and restores the
    weights of the best evaluation.

    Acts at evaluations (`fit(eval_data=..., eval_every=...)`): an evaluation improves
    when its value beats the best so far by more than `min_delta`; after `patience`
    evaluations in a row that do not improve, `fit` stops (after that evaluation's
    call). With `restore_best`, the model's weights (`model.weights`: trainable and
    non-trainable, as numpy copies) are snapshot at every improving evaluation and
    assigned back at the end of `fit`, bitwise, also when `fit` ran to the end.
    Optimizer slots and the step counter are not restored. The stop is one line in
    `stop_reason` (and `trainer.stop_reason`, printed by `fit(verbose=True)`): the
    monitor, its best value and step, the stop step, and whether the weights were restored.

    Example:
        >>> stop = mh.EarlyStopping("eval/y1/loss", patience=3, min_delta=1e-3)
        >>> trainer.fit(data, 10_000, eval_data=held_out, eval_every=500,
        ...             callbacks=[stop])                               # doctest: +SKIP
        >>> stop.best_step, stop.stopped_step, trainer.stop_reason       # doctest: +SKIP

    Args:
        monitor: see `MonitoredQuantity`: `"eval/<head>/<metric>"`, `"eval/mean_loss"`
            or a callable of the eval metrics.
        patience: how many evaluations in a row without improvement stop training (>= 1).
        min_delta: the amount an evaluation must beat the best by (>= 0).
        mode: `"min"`, `"max"` or `"auto"` (from the metric name).
        restore_best: restore the weights of the best evaluation at the end of `fit`.

    Attributes:
        best_step, best_value: the best evaluation of the last `fit` (None before one).
        stopped_step: the step at which it stopped `fit`, or None.
        stop_reason: why it stopped, also in `trainer.stop_reason`, or None.
    """

    def __init__(self, monitor: str | Callable[[Metrics], float] = "eval/mean_loss",
                 patience: int = 3, min_delta: float = 0.0, mode: str = "auto",
                 restore_best: bool = True) -> None:
        self.quantity = MonitoredQuantity(monitor, mode, "EarlyStopping")
        self.patience = check_int(patience, "EarlyStopping.patience", minimum=1)
        self.min_delta = check_float(min_delta, "EarlyStopping.min_delta", minimum=0)
        self.restore_best = check_choice(restore_best, "EarlyStopping.restore_best", (True, False))
        self.on_train_begin()

    def on_train_begin(self) -> None:
        self.wait = 0
        self.best_step: int | None = None
        self.best_value: float | None = None
        self.stopped_step: int | None = None
        self.stop_reason: str | None = None
        self._best_weights: list[np.ndarray] | None = None

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        value = self.quantity.value(metrics)
        if self.quantity.improves(value, self.best_value, self.min_delta):
            self.best_step, self.best_value, self.wait = step, value, 0
            if self.restore_best:
                self._best_weights = [np.array(v.numpy(), copy=True) for v in self.trainer.model.weights]
            return
        self.wait += 1
        if self.wait >= self.patience and self.stopped_step is None:
            self.stopped_step = step
            restored = (f"restored the weights of step {self.best_step}"
                        if self._best_weights is not None else "weights not restored")
            self.stop_reason = (
                f"EarlyStopping: {self.quantity.name} did not improve by more than {self.min_delta:g} "
                f"for {self.wait} evaluation(s) (best {self.best_value:.6g} at step {self.best_step}); "
                f"stopped at step {step}; {restored}")
            self.request_stop(self.stop_reason)

    def on_train_end(self) -> None:
        if self._best_weights is not None:
            for variable, value in zip(self.trainer.model.weights, self._best_weights):
                variable.assign(value)

