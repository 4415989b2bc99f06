"""`ReduceLROnPlateau`: lowers one head's learning rate when its evaluations stop improving."""

from __future__ import annotations

from typing import Callable

import keras
import numpy as np

from multihead._checks import check_float, check_int
from multihead.training.callbacks.base import Callback, Metrics
from multihead.training.callbacks.monitored import MonitoredQuantity


class ReduceLROnPlateau(Callback):
    """Multiplies one head's learning rate by `factor` when a monitored evaluation metric
    stops improving; the other heads' optimizers are untouched.

    As Keras' `ReduceLROnPlateau`, at evaluations: after `patience` evaluations in a row
    that do not beat the best by more than `min_delta`, the rate becomes
    `max(rate * factor, min_lr)`, then `cooldown` evaluations pass before waiting
    starts again. The rate is assigned to the optimizer's learning-rate variable, so the
    compiled step uses it from the next step on.

    Example:
        >>> plateau = mh.ReduceLROnPlateau("y1", factor=0.5, patience=2)
        >>> trainer.fit(data, 10_000, eval_data=held_out, eval_every=500,
        ...             callbacks=[plateau])                            # doctest: +SKIP
        >>> plateau.reductions          # [(step, old rate, new rate), ...]  # doctest: +SKIP

    Args:
        head: the head whose optimizer's learning rate is reduced.
        monitor: as for `EarlyStopping`; default `"eval/<head>/loss"`.
        factor: the factor applied, in (0, 1).
        patience: evaluations in a row without improvement before a reduction (>= 1).
        min_delta: the amount an evaluation must beat the best by (>= 0).
        min_lr: the rate is never reduced below this (>= 0).
        cooldown: evaluations after a reduction during which no waiting is counted (>= 0).
        mode: `"min"`, `"max"` or `"auto"`.

    Raises:
        ValueError: at the start of `fit`, if the head is unknown or its optimizer has a
            learning-rate schedule (a schedule cannot be assigned a constant).
    """

    def __init__(self, head: str, monitor: str | Callable[[Metrics], float] | None = None,
                 factor: float = 0.1, patience: int = 2, min_delta: float = 1e-4,
                 min_lr: float = 0.0, cooldown: int = 0, mode: str = "auto") -> None:
        if not isinstance(head, str) or not head:
            raise TypeError(f"ReduceLROnPlateau: head must be a head name, got {head!r}")
        self.head = head
        self.quantity = MonitoredQuantity(monitor if monitor is not None else f"eval/{head}/loss",
                                          mode, "ReduceLROnPlateau")
        self.factor = check_float(factor, "ReduceLROnPlateau.factor", minimum=0, maximum=1,
                                  min_open=True, max_open=True)
        self.patience = check_int(patience, "ReduceLROnPlateau.patience", minimum=1)
        self.min_delta = check_float(min_delta, "ReduceLROnPlateau.min_delta", minimum=0)
        self.min_lr = check_float(min_lr, "ReduceLROnPlateau.min_lr", minimum=0)
        self.cooldown = check_int(cooldown, "ReduceLROnPlateau.cooldown", minimum=0)
        self.reductions: list[tuple[int, float, float]] = []

    def on_train_begin(self) -> None:
        optimizers = self.trainer.optimizers
        if self.head not in optimizers:
            raise ValueError(f"ReduceLROnPlateau: head {self.head!r} is not a head of the trainer; "
                             f"heads are {list(optimizers)}")
        rate = optimizers[self.head].learning_rate
        if not isinstance(rate, keras.Variable):
            raise ValueError(
                f"ReduceLROnPlateau: the optimizer of head {self.head!r} has a learning-rate schedule "
                "(or callable), which cannot be assigned a constant rate; give it a float "
                "learning_rate, or drop ReduceLROnPlateau for this head")
        self._rate = rate
        self.wait, self._cooldown_left, self.best_value = 0, 0, None
        self.reductions = []

    @property
    def learning_rate(self) -> float:
        """The head's current learning rate."""
        return float(np.asarray(self._rate.numpy()))

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        value = self.quantity.value(metrics)
        if self._cooldown_left > 0:
            self._cooldown_left -= 1
            self.wait = 0
        if self.quantity.improves(value, self.best_value, self.min_delta):
            self.best_value, self.wait = value, 0
            return
        if self._cooldown_left > 0:
            return
        self.wait += 1
        if self.wait >= self.patience:
            old = self.learning_rate
            if old > self.min_lr:
                self._rate.assign(max(old * self.factor, self.min_lr))
                self.reductions.append((step, old, self.learning_rate))
                self._cooldown_left = self.cooldown
            self.wait = 0

