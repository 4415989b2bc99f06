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
import numbers
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import keras
import numpy as np

from multihead._checks import check_choice, check_float, check_int
from multihead.monitoring.metric_key import MetricKey
from multihead.monitoring.progress import Progress

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
        _request_stop(self.trainer, reason)


class CallbackList:
    """Dispatches each hook to every callback, in order."""

    def __init__(self, callbacks: Sequence[Any], trainer: TrainerView) -> None:
        self.callbacks = [_adapted(c, i) for i, c in enumerate(callbacks)]
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


# -- stopping -------------------------------------------------------------------------------


def _request_stop(trainer: TrainerView, reason: str) -> None:
    """Sets `trainer.stop_training`; `trainer.stop_reason` keeps the first reason of a `fit`."""
    if not trainer.stop_training or trainer.stop_reason is None:
        trainer.stop_reason = reason
    trainer.stop_training = True


# -- the quantity a callback watches --------------------------------------------------------

#: Metric names (or parts of names) for which smaller is better / larger is better.
MODES = ("auto", "min", "max")


class MonitoredQuantity:
    """A number taken from the metrics of an evaluation, and the direction that improves it.

    Example:
        >>> q = MonitoredQuantity("eval/a/loss", "auto", owner="EarlyStopping")
        >>> q.mode, q.value({"a": {"loss": 0.5}})
        ('min', 0.5)
        >>> q.improves(0.4, best=0.5, min_delta=0.05)
        True

    Args:
        monitor: `"eval/<head>/<metric>"` (`<metric>` is `loss` or a metric of the head's
            `Objective`), `"eval/mean_loss"` (the mean of the heads' eval losses), or a
            callable of the metrics dict `{head: {"loss": v, metric: v}}` returning a number.
        mode: `"min"`, `"max"`, or `"auto"`: from the metric name (losses and errors
            `"min"`, accuracies, AUC, precision, recall `"max"`); a callable needs
            `"min"` or `"max"`.
        owner: the callback's name, for error messages.
    """

    def __init__(self, monitor: str | Callable[[Metrics], float], mode: str, owner: str) -> None:
        self.owner = owner
        check_choice(mode, f"{owner}.mode", MODES)
        if callable(monitor):
            if mode == "auto":
                raise ValueError(f"{owner}: mode='auto' cannot tell whether the callable monitor "
                                 f"{getattr(monitor, '__name__', monitor)!r} should go down or up; "
                                 "pass mode='min' or mode='max'")
            self.key: MetricKey | None = None
        elif isinstance(monitor, str):
            try:
                self.key = MetricKey.parse(monitor)
            except ValueError:
                raise ValueError(f"{owner}: monitor must be 'eval/<head>/<metric>', 'eval/mean_loss' "
                                 f"or a callable of the eval metrics, got {monitor!r}") from None
        else:
            raise TypeError(f"{owner}: monitor must be a string or a callable, got {monitor!r}")
        self.monitor = monitor
        self.name = monitor if isinstance(monitor, str) else getattr(monitor, "__name__", "monitor")
        self.mode = mode if mode != "auto" else self._auto_mode()

    def _auto_mode(self) -> str:
        direction = self.key.direction  # type: ignore[union-attr]
        if direction is not None:
            return direction
        raise ValueError(f"{self.owner}: mode='auto' cannot tell whether {self.monitor!r} should go "
                         "down or up; pass mode='min' or mode='max'")

    @staticmethod
    def keys(metrics: Metrics) -> list[str]:
        """Every monitor string an evaluation with these metrics answers."""
        return [str(MetricKey(h, m)) for h, values in metrics.items() for m in values] + [
            str(MetricKey.mean_loss())]

    def value(self, metrics: Metrics) -> float:
        """The watched number in an evaluation's metrics.

        Raises:
            ValueError: the monitor names a head or metric the evaluation does not have.
        """
        if self.key is None:
            value = self.monitor(metrics)  # type: ignore[operator]
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{self.owner}: the monitor {self.name!r} returned {value!r}; "
                                "it must return a number")
            return float(value)
        if self.key.is_mean_loss:
            return float(np.mean([values["loss"] for values in metrics.values()]))
        head, metric = self.key.head, self.key.metric
        if head not in metrics or metric not in metrics[head]:
            raise ValueError(f"{self.owner}: monitor {self.monitor!r} is not in the evaluation; "
                             f"available: {self.keys(metrics)}")
        return float(metrics[head][metric])

    def improves(self, value: float, best: float | None, min_delta: float) -> bool:
        """True if `value` beats `best` by more than `min_delta` (always for the first
        value; never for NaN)."""
        if math.isnan(value):
            return False
        if best is None:
            return True
        return value < best - min_delta if self.mode == "min" else value > best + min_delta


# -- built-in callbacks ---------------------------------------------------------------------


class EarlyStopping(Callback):
    """Stops `fit` when a monitored evaluation metric stops improving, and restores the
    weights of the best evaluation.

    Acts at evaluations (`fit(eval_data=..., eval_every=...)`): an evaluation improves
    when its value beats the best so far by more than `min_delta`; after `patience`
    evaluations in a row that do not improve, `fit` stops (after that evaluation's
    call). With `restore_best`, the model's weights (`model.weights`: trainable and
    non-trainable, as numpy copies) are snapshot at every improving evaluation and
    assigned back at the end of `fit`, bitwise, also when `fit` ran to the end.
    Optimizer slots and the step counter are not restored. The stop is one line in
    `stop_reason` (and `trainer.stop_reason`, printed by `fit(verbose=True)`): the
    monitor, its best value and step, the stop step, and whether the weights were restored.

    Example:
        >>> stop = mh.EarlyStopping("eval/y1/loss", patience=3, min_delta=1e-3)
        >>> trainer.fit(data, 10_000, eval_data=held_out, eval_every=500,
        ...             callbacks=[stop])                               # doctest: +SKIP
        >>> stop.best_step, stop.stopped_step, trainer.stop_reason       # doctest: +SKIP

    Args:
        monitor: see `MonitoredQuantity`: `"eval/<head>/<metric>"`, `"eval/mean_loss"`
            or a callable of the eval metrics.
        patience: how many evaluations in a row without improvement stop training (>= 1).
        min_delta: the amount an evaluation must beat the best by (>= 0).
        mode: `"min"`, `"max"` or `"auto"` (from the metric name).
        restore_best: restore the weights of the best evaluation at the end of `fit`.

    Attributes:
        best_step, best_value: the best evaluation of the last `fit` (None before one).
        stopped_step: the step at which it stopped `fit`, or None.
        stop_reason: why it stopped, also in `trainer.stop_reason`, or None.
    """

    def __init__(self, monitor: str | Callable[[Metrics], float] = "eval/mean_loss",
                 patience: int = 3, min_delta: float = 0.0, mode: str = "auto",
                 restore_best: bool = True) -> None:
        self.quantity = MonitoredQuantity(monitor, mode, "EarlyStopping")
        self.patience = check_int(patience, "EarlyStopping.patience", minimum=1)
        self.min_delta = check_float(min_delta, "EarlyStopping.min_delta", minimum=0)
        self.restore_best = check_choice(restore_best, "EarlyStopping.restore_best", (True, False))
        self.on_train_begin()

    def on_train_begin(self) -> None:
        self.wait = 0
        self.best_step: int | None = None
        self.best_value: float | None = None
        self.stopped_step: int | None = None
        self.stop_reason: str | None = None
        self._best_weights: list[np.ndarray] | None = None

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        value = self.quantity.value(metrics)
        if self.quantity.improves(value, self.best_value, self.min_delta):
            self.best_step, self.best_value, self.wait = step, value, 0
            if self.restore_best:
                self._best_weights = [np.array(v.numpy(), copy=True) for v in self.trainer.model.weights]
            return
        self.wait += 1
        if self.wait >= self.patience and self.stopped_step is None:
            self.stopped_step = step
            restored = (f"restored the weights of step {self.best_step}"
                        if self._best_weights is not None else "weights not restored")
            self.stop_reason = (
                f"EarlyStopping: {self.quantity.name} did not improve by more than {self.min_delta:g} "
                f"for {self.wait} evaluation(s) (best {self.best_value:.6g} at step {self.best_step}); "
                f"stopped at step {step}; {restored}")
            self.request_stop(self.stop_reason)

    def on_train_end(self) -> None:
        if self._best_weights is not None:
            for variable, value in zip(self.trainer.model.weights, self._best_weights):
                variable.assign(value)


class ReduceLROnPlateau(Callback):
    """Multiplies one head's learning rate by `factor` when a monitored evaluation metric
    stops improving; the other heads' optimizers are untouched.

    As Keras' `ReduceLROnPlateau`, at evaluations: after `patience` evaluations in a row
    that do not beat the best by more than `min_delta`, the rate becomes
    `max(rate * factor, min_lr)`, then `cooldown` evaluations pass before waiting
    starts again. The rate is assigned to the optimizer's learning-rate variable, so the
    compiled step uses it from the next step on.

    Example:
        >>> plateau = mh.ReduceLROnPlateau("y1", factor=0.5, patience=2)
        >>> trainer.fit(data, 10_000, eval_data=held_out, eval_every=500,
        ...             callbacks=[plateau])                            # doctest: +SKIP
        >>> plateau.reductions          # [(step, old rate, new rate), ...]  # doctest: +SKIP

    Args:
        head: the head whose optimizer's learning rate is reduced.
        monitor: as for `EarlyStopping`; default `"eval/<head>/loss"`.
        factor: the factor applied, in (0, 1).
        patience: evaluations in a row without improvement before a reduction (>= 1).
        min_delta: the amount an evaluation must beat the best by (>= 0).
        min_lr: the rate is never reduced below this (>= 0).
        cooldown: evaluations after a reduction during which no waiting is counted (>= 0).
        mode: `"min"`, `"max"` or `"auto"`.

    Raises:
        ValueError: at the start of `fit`, if the head is unknown or its optimizer has a
            learning-rate schedule (a schedule cannot be assigned a constant).
    """

    def __init__(self, head: str, monitor: str | Callable[[Metrics], float] | None = None,
                 factor: float = 0.1, patience: int = 2, min_delta: float = 1e-4,
                 min_lr: float = 0.0, cooldown: int = 0, mode: str = "auto") -> None:
        if not isinstance(head, str) or not head:
            raise TypeError(f"ReduceLROnPlateau: head must be a head name, got {head!r}")
        self.head = head
        self.quantity = MonitoredQuantity(monitor if monitor is not None else f"eval/{head}/loss",
                                          mode, "ReduceLROnPlateau")
        self.factor = check_float(factor, "ReduceLROnPlateau.factor", minimum=0, maximum=1,
                                  min_open=True, max_open=True)
        self.patience = check_int(patience, "ReduceLROnPlateau.patience", minimum=1)
        self.min_delta = check_float(min_delta, "ReduceLROnPlateau.min_delta", minimum=0)
        self.min_lr = check_float(min_lr, "ReduceLROnPlateau.min_lr", minimum=0)
        self.cooldown = check_int(cooldown, "ReduceLROnPlateau.cooldown", minimum=0)
        self.reductions: list[tuple[int, float, float]] = []

    def on_train_begin(self) -> None:
        optimizers = self.trainer.optimizers
        if self.head not in optimizers:
            raise ValueError(f"ReduceLROnPlateau: head {self.head!r} is not a head of the trainer; "
                             f"heads are {list(optimizers)}")
        rate = optimizers[self.head].learning_rate
        if not isinstance(rate, keras.Variable):
            raise ValueError(
                f"ReduceLROnPlateau: the optimizer of head {self.head!r} has a learning-rate schedule "
                "(or callable), which cannot be assigned a constant rate; give it a float "
                "learning_rate, or drop ReduceLROnPlateau for this head")
        self._rate = rate
        self.wait, self._cooldown_left, self.best_value = 0, 0, None
        self.reductions = []

    @property
    def learning_rate(self) -> float:
        """The head's current learning rate."""
        return float(np.asarray(self._rate.numpy()))

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        value = self.quantity.value(metrics)
        if self._cooldown_left > 0:
            self._cooldown_left -= 1
            self.wait = 0
        if self.quantity.improves(value, self.best_value, self.min_delta):
            self.best_value, self.wait = value, 0
            return
        if self._cooldown_left > 0:
            return
        self.wait += 1
        if self.wait >= self.patience:
            old = self.learning_rate
            if old > self.min_lr:
                self._rate.assign(max(old * self.factor, self.min_lr))
                self.reductions.append((step, old, self.learning_rate))
                self._cooldown_left = self.cooldown
            self.wait = 0


class TerminateOnNonFinite(Callback):
    """Stops `fit` (without raising) at the first NaN or infinite loss of a step or value of
    an evaluation.

    The stop takes effect after the compiled call holding that step; with
    `steps_per_execution=1` no step after it is taken. Without this callback the
    trainer's own guard raises after `Trainer(max_nonfinite_steps=...)` such steps.

    Attributes:
        stopped_step: the step (a count of steps done) of the first non-finite value, or None.
        stop_reason: what was non-finite, also in `trainer.stop_reason`, or None.
    """

    def on_train_begin(self) -> None:
        self.stopped_step: int | None = None
        self.stop_reason: str | None = None

    def _stop(self, step: int, what: str, value: float) -> None:
        self.stopped_step = step
        self.stop_reason = f"TerminateOnNonFinite: {what} was {value} at step {step}"
        self.request_stop(self.stop_reason)

    def on_step_end(self, step: int, result: StepResult) -> None:
        if self.stopped_step is None:
            for head, loss in result.losses.items():
                if not math.isfinite(loss):
                    return self._stop(step, f"the training loss of head {head!r}", loss)

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        if self.stopped_step is None:
            for head, values in metrics.items():
                for name, value in values.items():
                    if not math.isfinite(value):
                        return self._stop(step, str(MetricKey(head, name)), value)


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


# -- Keras callbacks ------------------------------------------------------------------------


def _adapted(callback: Any, index: int) -> Any:
    """A `keras.callbacks.Callback` wrapped so `fit` can drive it; others as they are."""
    if isinstance(callback, keras.callbacks.Callback):
        return KerasCallbackAdapter(callback)
    missing = [h for h in LambdaCallback._HOOKS + ("set_trainer",) if not hasattr(callback, h)]
    if missing:
        raise TypeError(f"callbacks[{index}] must be a multihead.Callback or a keras.callbacks."
                        f"Callback, got {type(callback).__name__} (it lacks {missing[0]})")
    return callback


class _ModelProxy:
    """What a Keras callback sees as `self.model`: `stop_training` (setting it True stops
    `fit`) and the `MultiHeadModel`'s weights; nothing else."""

    metrics: list[Any] = []  # Keras' mode="auto" reads it; there are no compiled metrics

    def __init__(self, adapter: KerasCallbackAdapter) -> None:
        self._adapter = adapter

    @property
    def stop_training(self) -> bool:
        return bool(self._adapter.trainer.stop_training)

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        if value:  # never cancels another callback's stop
            adapter = self._adapter
            _request_stop(adapter.trainer, f"{type(adapter.callback).__name__} (Keras) set "
                                           f"stop_training at step {adapter.last_step}")

    @property
    def weights(self) -> list[Any]:
        return self._adapter.trainer.model.weights

    def get_weights(self) -> list[np.ndarray]:
        return self._adapter.trainer.model.get_weights()

    def set_weights(self, weights: Sequence[Any]) -> None:
        self._adapter.trainer.model.set_weights(weights)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"a Keras callback in Trainer.fit sees a model with only stop_training, weights, "
            f"get_weights and set_weights, not {name!r}; use a multihead callback for this "
            "(e.g. multihead.ReduceLROnPlateau, multihead.BestCheckpoint)")


class KerasCallbackAdapter(Callback):
    """Drives a `keras.callbacks.Callback` that reads `logs` and sets `stop_training`
    (`EarlyStopping`, `CSVLogger`, `TerminateOnNaN`, `LambdaCallback`, ...).

    `CallbackList` wraps Keras callbacks in it; there is no need to do it by hand.
    An evaluation is a Keras epoch. The hooks map as:

    * `on_step_end(step, result)` -> `on_train_batch_end(step - 1, logs)` with
      `logs = {"<head>_loss": v, "loss": sum of them}` (the heads updated at that step);
    * `on_eval_end(step, metrics)` -> `on_epoch_end(i, logs)` for the `i`-th evaluation
      of the `fit` (then `on_epoch_begin(i + 1)`), with `logs` holding
      `"val_<head>_<metric>"` for every eval metric (`"val_<head>_loss"` included),
      `"val_loss"` (the sum of the heads' eval losses, as `"loss"` sums their training
      losses), each head's latest training loss `"<head>_loss"`, their sum `"loss"`,
      and `"step"`;
    * `on_train_begin` / `on_train_end` -> the same with the latest logs.

    The callback's `model` is a proxy: setting `model.stop_training = True` sets
    `trainer.stop_training`; `get_weights` / `set_weights` are the `MultiHeadModel`'s
    (so `restore_best_weights` works). With Keras' `mode="auto"`, only `"val_loss"` and
    `"loss"` have a known direction; give `mode="min"` for per-head keys.

    Args:
        callback: the Keras callback.
    """

    def __init__(self, callback: keras.callbacks.Callback) -> None:
        self.callback = callback
        self.last_step = 0

    def on_train_begin(self) -> None:
        self._epoch = 0
        self._latest: dict[str, float] = {}
        self._logs: dict[str, float] = {}
        self.callback.set_model(_ModelProxy(self))
        self.callback.set_params({"verbose": 0, "epochs": None, "steps": None})
        self.callback.on_train_begin(logs={})
        self.callback.on_epoch_begin(self._epoch, logs={})

    def on_step_end(self, step: int, result: StepResult) -> None:
        self.last_step = step
        logs = {f"{head}_loss": loss for head, loss in result.losses.items()}
        logs["loss"] = float(sum(result.losses.values()))
        self._latest.update(result.losses)
        self._logs = logs
        self.callback.on_train_batch_end(result.step, logs=logs)

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        self.last_step = step
        logs: dict[str, float] = {f"{head}_loss": loss for head, loss in self._latest.items()}
        if self._latest:
            logs["loss"] = float(sum(self._latest.values()))
        for head, values in metrics.items():
            logs.update({f"val_{head}_{name}": float(v) for name, v in values.items()})
        logs["val_loss"] = float(sum(values["loss"] for values in metrics.values()))
        logs["step"] = step
        self._logs = logs
        self.callback.on_epoch_end(self._epoch, logs=logs)
        self._epoch += 1
        self.callback.on_epoch_begin(self._epoch, logs={})

    def on_train_end(self) -> None:
        self.callback.on_train_end(logs=self._logs)
