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

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from multihead.monitoring.progress import Progress

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


class ProgressCallback(Callback):
    """The progress line of `fit(verbose=True)`: steps/s, ETA and the latest per-head losses."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._progress: Progress | None = None
        self._done = 0

    def on_train_begin(self) -> None:
        self._progress, self._done = Progress(self.total), 0

    def on_step_end(self, step: int, result: StepResult) -> None:
        self._done += 1
        self._latest = result.losses

    def on_call_end(self, step: int) -> None:
        assert self._progress is not None
        self._progress.update(self._done, self._latest, force=self._done == self.total)

    def on_train_end(self) -> None:
        if self._progress is not None and self._done:
            self._progress.close(self._done)


class NonFiniteGuard(Callback):
    """Stops `fit` with an error naming the head when a head's loss is non-finite.

    With `Objective(on_nonfinite="raise")` at the first such step; otherwise when it
    stays non-finite for `limit` consecutive steps of that head (its updates are
    skipped meanwhile under the default `"skip"`).
    """

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_nonfinite_steps must be an integer >= 1, got {limit!r}")
        self.limit = limit
        self._first: dict[str, tuple[int, float]] = {}
        self._count: dict[str, int] = {}

    def on_step_end(self, step: int, result: StepResult) -> None:
        for head, loss in result.losses.items():
            if math.isfinite(loss) and head not in result.skipped:
                self._count.pop(head, None)
                self._first.pop(head, None)
                continue
            self._first.setdefault(head, (result.step, loss))
            self._count[head] = self._count.get(head, 0) + 1
            policy = self.trainer.objectives[head].on_nonfinite
            if policy == "raise" or self._count[head] >= self.limit:
                at, value = self._first[head]
                what = f"the loss of head {head!r} became {value}" if not math.isfinite(value) \
                    else f"a gradient of head {head!r} became non-finite"
                raise FloatingPointError(
                    f"{what} at step {at}" + ("" if policy == "raise" else
                    f" and stayed non-finite for {self._count[head]} consecutive steps of the "
                    "head; check its labels and learning rate"))
