"""Callbacks: what `Trainer.fit` calls around its compiled steps.

`fit` runs several steps per compiled call. After each call it hands every step's
result to the callbacks, then evaluates if an evaluation is due, then tells the
callbacks the call ended. A callback that needs the model's *state* at certain
steps (to save it, to restore it) sets `every`: calls end at multiples of it, so
`on_call_end(step)` sees the state of those steps. Nothing else forces a call to
end, so callbacks cost nothing per step of the graph.

Step numbers are counts of steps done: `on_step_end(step, result)` gets
`step = result.step + 1`, the same numbering as evaluations and checkpoints.

Example:
    >>> import multihead as mh
    >>> class PrintLoss(mh.Callback):
    ...     def on_step_end(self, step, result):
    ...         if step % 100 == 0:
    ...             print(step, result.losses)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # annotations only: callbacks never import the trainer
    from multihead.core.trainer import StepResult, Trainer

Metrics = Mapping[str, Mapping[str, float]]


class Callback:
    """Base class of `fit` callbacks: every hook does nothing.

    Attributes:
        trainer: the `Trainer` running `fit`, set before `on_train_begin`.
        every: if set, compiled calls end at multiples of this step count, and
            `on_call_end` sees the model's state there.
    """

    every: int | None = None
    trainer: Trainer

    def set_trainer(self, trainer: Trainer) -> None:
        """Called once per `fit`, before `on_train_begin`."""
        self.trainer = trainer

    def on_train_begin(self) -> None:
        """At the start of `fit`."""

    def on_step_end(self, step: int, result: StepResult) -> None:
        """After the compiled call that ran the step; `step` counts steps done."""

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        """After an evaluation at `step`: `{head: {"loss": ..., metric: ...}}`."""

    def on_call_end(self, step: int) -> None:
        """After a compiled call (and the evaluation due at its last step): the model's
        state is that after `step` steps."""

    def on_train_end(self) -> None:
        """At the end of `fit`, also when a callback stopped it or it raised."""


class CallbackList:
    """Dispatches each hook to every callback, in order."""

    def __init__(self, callbacks: Sequence[Any], trainer: Trainer) -> None:
        self.callbacks = list(callbacks)
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
