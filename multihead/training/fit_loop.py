"""`fit`'s loop over compiled calls: steps, callbacks, evaluations, history.

`Trainer.fit` checks its arguments and assembles the callbacks; `run_fit` then runs
compiled calls of the data stream until the steps ran or a callback stopped
training. Calls end at every callback's period and the evaluation's, so what
callbacks and evaluations observe is exactly what one step per call would give.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol

from multihead.training.callbacks import CallbackList
from multihead.training.execution import ExecutionSize
from multihead.training.results import History, step_result

__all__ = ["FitOwner", "run_fit"]


class FitOwner(Protocol):
    """What the loop reads and sets on the trainer running `fit` (a `multihead.Trainer`)."""

    objectives: Mapping[str, Any]
    names: tuple[str, ...]
    monitor: Any
    stop_training: bool
    stop_reason: str | None
    notices: list[str]

    @property
    def global_step(self) -> int:
        """Number of steps taken so far."""


def run_fit(trainer: FitOwner, stream: Any, steps: int, call_size: ExecutionSize,
            hooks: CallbackList, before_call: Callable[[], None],
            evaluate: Callable[[], dict[str, dict[str, float]]] | None,
            eval_every: int | None) -> History:
    """Runs compiled calls of `stream` (`stream.run(n)`) until `steps` steps ran or a
    callback stopped training; `before_call` runs before each call, `evaluate` every
    `eval_every` steps and at the end (when given).

    Returns:
        The per-head history of training losses and evaluations of this `fit`.
    """
    history = History(train={h: [] for h in trainer.objectives})
    periods = hooks.periods() + ([eval_every] if evaluate is not None and eval_every else [])
    trainer.stop_training, trainer.stop_reason, trainer.notices = False, None, []
    if trainer.monitor:  # the last step is logged, whatever the cadence
        trainer.monitor.log_last(trainer.global_step + steps)
    start = time.perf_counter()
    done = 0
    hooks.on_train_begin()
    try:
        while done < steps and not trainer.stop_training:
            chunk = min([steps - done, call_size.next]
                        + [p - trainer.global_step % p for p in periods])
            before_call()
            called = time.perf_counter()
            out = stream.run(chunk)
            call_size.observe(out.count, time.perf_counter() - called)
            if out.count == 0:
                continue  # the end of an epoch
            for i in range(out.count):
                result = step_result(trainer.names, out.first + i, out.losses[i],
                                     out.updated[i], out.skipped[i])
                for head in result.updated:
                    history.train[head].append((result.step, result.losses[head]))
                hooks.on_step_end(result.step + 1, result)
            done += out.count
            if evaluate is not None and (
                    done == steps or (eval_every and trainer.global_step % eval_every == 0)):
                metrics = evaluate()
                history.eval.append((trainer.global_step, metrics))
                hooks.on_eval_end(trainer.global_step, metrics)
            hooks.on_call_end(trainer.global_step)
    finally:
        hooks.on_train_end()
        history.wall_time = time.perf_counter() - start
        if trainer.monitor:
            trainer.monitor.flush()
    return history
