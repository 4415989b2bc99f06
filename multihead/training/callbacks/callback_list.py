"""`CallbackList`: dispatches each hook of `fit` to every callback, in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from multihead.training.callbacks.base import Metrics, TrainerView
from multihead.training.callbacks.keras_adapter import adapted

if TYPE_CHECKING:  # annotations only
    from multihead.training.results import StepResult


class CallbackList:
    """Dispatches each hook to every callback, in order."""

    def __init__(self, callbacks: Sequence[Any], trainer: TrainerView) -> None:
        self.callbacks = [adapted(c, i) for i, c in enumerate(callbacks)]
        for callback in self.callbacks:
            callback.set_trainer(trainer)

    def periods(self) -> list[int]:
        """The `every` of each callback that has one."""
        return [c.every for c in self.callbacks if getattr(c, "every", None)]

    def on_train_begin(self) -> None:
        for callback in self.callbacks:
            callback.on_train_begin()

    def on_step_end(self, step: int, result: StepResult) -> None:
        for callback in self.callbacks:
            callback.on_step_end(step, result)

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        for callback in self.callbacks:
            callback.on_eval_end(step, metrics)

    def on_call_end(self, step: int) -> None:
        for callback in self.callbacks:
            callback.on_call_end(step)

    def on_train_end(self) -> None:
        for callback in self.callbacks:
            callback.on_train_end()

