"""`ProgressCallback`: the progress line of `fit(verbose=True)`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from multihead.monitoring.progress import Progress
from multihead.training.callbacks.base import Callback

if TYPE_CHECKING:  # annotations only
    from multihead.training.results import StepResult


class ProgressCallback(Callback):
    """The progress line of `fit(verbose=True)`: steps/s, ETA and the latest per-head losses;
    with `per_epoch` (steps an epoch, for `fit(epochs=...)`) also `epoch e/E`. When a
    callback stopped `fit`, its reason (`trainer.stop_reason`) is printed after the line, as
    are callbacks' notices (`Callback.announce`).

    Steps are counted on the trainer's step axis: a `fit` of 1200 steps from step 800
    shows `801/2000` after its first step.

    Args:
        total: the step `fit` ends at.
        start: the step `fit` starts from.
        per_epoch: steps an epoch, or None.
    """

    def __init__(self, total: int, start: int = 0, per_epoch: int | None = None) -> None:
        self.total = total
        self.start = start
        self.per_epoch = per_epoch
        self._progress: Progress | None = None
        self._done = start

    def on_train_begin(self) -> None:
        self._progress = Progress(self.total, per_epoch=self.per_epoch)
        self._done, self._noticed = self.start, 0

    def on_step_end(self, step: int, result: StepResult) -> None:
        self._done = step
        self._latest = result.losses

    def on_call_end(self, step: int) -> None:
        assert self._progress is not None
        self._progress.update(self._done, self._latest, force=self._done == self.total)
        notices = self.trainer.notices
        for line in notices[self._noticed:]:
            self._progress.note(line)
        self._noticed = len(notices)

    def on_train_end(self) -> None:
        if self._progress is not None and self._done > self.start:
            self._progress.close(self._done)
        if self._progress is not None and self.trainer.stop_reason is not None:
            self._progress.note(self.trainer.stop_reason)  # why `fit` ended early

