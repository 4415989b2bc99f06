"""`NonFiniteGuard`: stops `fit` with an error naming the head whose loss stays non-finite."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from multihead.training.callbacks.base import Callback

if TYPE_CHECKING:  # annotations only
    from multihead.training.results import StepResult


class NonFiniteGuard(Callback):
    """Stops `fit` with an error naming the head when a head's loss is non-finite.

    With `Objective(on_nonfinite="raise")` at the first such step; otherwise when it
    stays non-finite for `limit` consecutive steps of that head (its updates are
    skipped meanwhile under the default `"skip"`). `Trainer` checks `limit` (its
    `max_nonfinite_steps`) at construction.

    With float16 loss scales (`Trainer.loss_scales`), a step a head skipped with a finite
    loss while its scale (read after the compiled call) is above 1 is an overflow the scale
    handles by halving: it neither counts nor raises.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._first: dict[str, tuple[int, float]] = {}
        self._count: dict[str, int] = {}

    def _scale_overflow(self, head: str, loss: float) -> bool:
        scales = getattr(self.trainer, "loss_scales", None)
        return scales is not None and math.isfinite(loss) and scales.values()[head] > 1.0

    def on_step_end(self, step: int, result: StepResult) -> None:
        for head, loss in result.losses.items():
            if math.isfinite(loss) and head not in result.skipped:
                self._count.pop(head, None)
                self._first.pop(head, None)
                continue
            if self._scale_overflow(head, loss):
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

