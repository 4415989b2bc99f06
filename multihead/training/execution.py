"""How many steps `fit` runs (`fit_length`), and in one compiled call (`steps_per_execution`)."""

from __future__ import annotations

from typing import Any

from multihead._checks import check_int
from multihead.training.streams import batches_per_epoch


class ExecutionSize:
    """How many steps `fit` runs in its next compiled call: a fixed number, or, for
    `"auto"`, as many as take about `TARGET_SECONDS`, from the time per step of the last
    call. A call has a fixed Python and graph-setup cost whatever its size, small
    against `TARGET_SECONDS`, and the progress line still moves several times a second. The first call (which traces) measures slow, so it is
    followed by one step per call, then the size settles within a few calls.

    The workers of a multi-worker strategy must run the same calls: TensorFlow pairs
    their collectives call by call (each call of a compiled function takes the next id
    of that function's step-id sequence, shared across the workers), so a call of 4
    steps on one worker against 2 on another leaves both waiting for each other
    forever. Sizes measured from each worker's own clock differ, so there `"auto"` is
    the fixed `SYNCED_STEPS` (`clocked=False`).

    Args:
        steps_per_execution: an integer >= 1, or `"auto"`.
        clocked: whether `"auto"` may size calls from measured times (False under a
            multi-worker strategy).
    """

    TARGET_SECONDS = 0.05
    MAX_STEPS = 1000
    SYNCED_STEPS = 20

    def __init__(self, steps_per_execution: int | str, clocked: bool = True) -> None:
        if isinstance(steps_per_execution, str) and steps_per_execution == "auto":
            self.auto, self.next = clocked, 1 if clocked else self.SYNCED_STEPS
        else:
            self.auto, self.next = False, check_int(
                steps_per_execution, "steps_per_execution", minimum=1,
                hint="give an integer >= 1 or 'auto'")

    def observe(self, steps: int, seconds: float) -> None:
        """Records that the last call ran `steps` steps in `seconds`."""
        if self.auto and steps > 0:
            per_step = seconds / steps
            fits = int(self.TARGET_SECONDS / per_step) if per_step > 0 else self.MAX_STEPS
            self.next = max(1, min(self.MAX_STEPS, fits))


def fit_length(data: Any, steps: int | None, epochs: int | None,
               batch_size: int | None) -> tuple[int, int | None]:
    """The steps of `fit(steps=...)` or `fit(epochs=...)` (exactly one given), and the steps
    of an epoch (None for `steps`)."""
    if (steps is None) == (epochs is None):
        raise ValueError(f"fit: give exactly one of steps and epochs, got steps={steps!r} "
                         f"and epochs={epochs!r}")
    per_epoch = None
    if epochs is not None:
        epochs = check_int(epochs, "epochs", minimum=1)
        per_epoch = batches_per_epoch(data, batch_size)
        steps = epochs * per_epoch
    return check_int(steps, "steps", minimum=1), per_epoch
