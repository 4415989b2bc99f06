"""What training returns: `StepResult` for one step, `History` for a `fit` call."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np


class StepResult(NamedTuple):
    """The outcome of one training step.

    Attributes:
        step: the step counter value the update was taken at (0 for the first).
        losses: head -> (unweighted) loss, for the heads that were due this step.
        updated: the names of the heads whose optimizer applied an update.
        skipped: the due heads whose update was dropped because their loss or a
            gradient was not finite (`Objective(on_nonfinite="skip")`).
    """

    step: int
    losses: dict[str, float]
    updated: tuple[str, ...]
    skipped: tuple[str, ...] = ()


def step_result(heads: Sequence[str], step: int, losses: np.ndarray, updated: np.ndarray,
                skipped: np.ndarray) -> StepResult:
    """The `StepResult` of one row of the compiled step's outputs.

    Args:
        heads: the head names, in the order of the output columns.
        step: the step counter value the update was taken at.
        losses: per head, its loss (meaningful for the due heads only).
        updated: per head, whether its optimizer applied an update.
        skipped: per head, whether its due update was dropped (non-finite).
    """
    done = tuple(h for h, flag in zip(heads, updated) if flag)
    dropped = tuple(h for h, flag in zip(heads, skipped) if flag)
    values = {h: float(v) for h, v, a, b in zip(heads, losses, updated, skipped) if a or b}
    return StepResult(step=step, losses=values, updated=done, skipped=dropped)


@dataclasses.dataclass
class History:
    """What `Trainer.fit` recorded.

    Attributes:
        train: head -> list of `(step, loss)` for every step the head was updated.
        eval: list of `(step, {head: {metric: value}})` for every evaluation.
        wall_time: seconds spent in `fit`.
    """

    train: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    eval: list[tuple[int, dict[str, dict[str, float]]]] = dataclasses.field(default_factory=list)
    wall_time: float = 0.0

    def losses(self, head: str) -> np.ndarray:
        """The training losses of `head`, one per update, as an array."""
        return np.array([loss for _, loss in self.train.get(head, [])])
