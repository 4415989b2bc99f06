"""How many steps `fit` runs in one compiled call (`steps_per_execution`)."""

from __future__ import annotations

from multihead._checks import check_int


class ExecutionSize:
    """How many steps `fit` runs in its next compiled call: a fixed number, or, for
    `"auto"`, as many as take about `TARGET_SECONDS`, from the time per step of the last
    call. A call has a fixed Python and graph-setup cost whatever its size, small
    against `TARGET_SECONDS`, and the progress line still moves several times a second. The first call (which traces) measures slow, so it is
    followed by one step per call, then the size settles within a few calls.

    Args:
        steps_per_execution: an integer >= 1, or `"auto"`.
    """

    TARGET_SECONDS = 0.05
    MAX_STEPS = 1000

    def __init__(self, steps_per_execution: int | str) -> None:
        if isinstance(steps_per_execution, str) and steps_per_execution == "auto":
            self.auto, self.next = True, 1
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
