"""`TerminateOnNonFinite`: stops `fit` at the first non-finite loss or evaluation metric."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from multihead.monitoring.metric_key import MetricKey
from multihead.training.callbacks.base import Callback, Metrics

if TYPE_CHECKING:  # annotations only
    from multihead.training.results import StepResult


class TerminateOnNonFinite(Callback):
    """Stops `fit` (without raising) at the first NaN or infinite loss of a step or value of
    an evaluation.

    The stop takes effect after the compiled call holding that step; with
    `steps_per_execution=1` no step after it is taken. Without this callback the
    trainer's own guard raises after `Trainer(max_nonfinite_steps=...)` such steps.

    Attributes:
        stopped_step: the step (a count of steps done) of the first non-finite value, or None.
        stop_reason: what was non-finite, also in `trainer.stop_reason`, or None.
    """

    def on_train_begin(self) -> None:
        self.stopped_step: int | None = None
        self.stop_reason: str | None = None

    def _stop(self, step: int, what: str, value: float) -> None:
        self.stopped_step = step
        self.stop_reason = f"TerminateOnNonFinite: {what} was {value} at step {step}"
        self.request_stop(self.stop_reason)

    def on_step_end(self, step: int, result: StepResult) -> None:
        if self.stopped_step is None:
            for head, loss in result.losses.items():
                if not math.isfinite(loss):
                    return self._stop(step, f"the training loss of head {head!r}", loss)

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        if self.stopped_step is None:
            for head, values in metrics.items():
                for name, value in values.items():
                    if not math.isfinite(value):
                        return self._stop(step, str(MetricKey(head, name)), value)

