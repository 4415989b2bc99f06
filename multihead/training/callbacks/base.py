"""The base of every callback: `Callback`, and what a callback may read of the trainer
(`TrainerView`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol

if TYPE_CHECKING:  # annotations only
    from multihead.training.results import StepResult


class TrainerView(Protocol):
    """What a callback may read and set on the trainer running `fit` (a `multihead.Trainer`);
    callbacks never import the trainer module, which imports them."""

    model: Any
    objectives: Mapping[str, Any]
    #: The objectives' names, in order (the heads' own first).
    names: tuple[str, ...]
    optimizers: Mapping[str, Any]
    stop_training: bool
    stop_reason: str | None
    notices: list[str]

    @property
    def frozen(self) -> tuple[str, ...]:
        """The frozen heads, in head order."""

    def freeze(self, head: str) -> None:
        """Freezes `head` from the next step on: no update of its variables, none of its
        gradient reaches the trunk (`Trainer.freeze`)."""

    def unfreeze(self, head: str) -> None:
        """Lets a frozen `head` update again from the next step on."""

    def fit(self, *args: Any, **kwargs: Any) -> Any: ...


Metrics = Mapping[str, Mapping[str, float]]


class Callback:
    """Base class of `fit` callbacks: every hook does nothing.

    Attributes:
        trainer: the `Trainer` running `fit`, set before `on_train_begin`.
        every: if set, compiled calls end at multiples of this step count, and
            `on_call_end` sees the model's state there.
    """

    every: int | None = None
    trainer: TrainerView

    def set_trainer(self, trainer: TrainerView) -> None:
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

    def announce(self, line: str) -> None:
        """Says in one line that something happened (e.g. a head stopped early): kept in
        `trainer.notices`, printed by `fit(verbose=True)` after the call's progress line."""
        self.trainer.notices.append(line)

    def request_stop(self, reason: str) -> None:
        """Ends `fit` after the current compiled call, recording why in
        `trainer.stop_reason` (the first reason given in a `fit` is kept)."""
        record_stop(self.trainer, reason)


def record_stop(trainer: TrainerView, reason: str) -> None:
    """Sets `trainer.stop_training`; `trainer.stop_reason` keeps the first reason of a `fit`."""
    if not trainer.stop_training or trainer.stop_reason is None:
        trainer.stop_reason = reason
    trainer.stop_training = True

