"""`LambdaCallback`: a callback made of functions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from multihead._checks import check_int
from multihead.training.callbacks.base import Callback, Metrics

if TYPE_CHECKING:  # annotations only
    from multihead.training.results import StepResult


class LambdaCallback(Callback):
    """A callback from functions, one per hook (omitted hooks do nothing).

    Example:
        >>> evals = []
        >>> record = mh.LambdaCallback(on_eval_end=lambda step, metrics: evals.append(step))

    Args:
        on_train_begin: `() -> None`.
        on_step_end: `(step, result) -> None`.
        on_eval_end: `(step, metrics) -> None`.
        on_call_end: `(step) -> None`.
        on_train_end: `() -> None`.
        every: as `Callback.every`: calls end at multiples of it, so `on_call_end` sees
            the state at those steps.
    """

    _HOOKS = ("on_train_begin", "on_step_end", "on_eval_end", "on_call_end", "on_train_end")

    def __init__(self, on_train_begin: Callable[[], Any] | None = None,
                 on_step_end: Callable[[int, StepResult], Any] | None = None,
                 on_eval_end: Callable[[int, Metrics], Any] | None = None,
                 on_call_end: Callable[[int], Any] | None = None,
                 on_train_end: Callable[[], Any] | None = None,
                 every: int | None = None) -> None:
        given = dict(zip(self._HOOKS, (on_train_begin, on_step_end, on_eval_end, on_call_end,
                                       on_train_end)))
        for name, fn in given.items():
            if fn is not None:
                if not callable(fn):
                    raise TypeError(f"LambdaCallback: {name} must be callable, got {fn!r}")
                setattr(self, name, fn)  # the instance attribute shadows the no-op method
        if every is not None:
            self.every = check_int(every, "LambdaCallback.every", minimum=1)

