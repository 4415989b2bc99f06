"""`HeadEarlyStopping`: per-head early stopping, freezing each head whose evaluation
metric stops improving while the others train on.

A stopped head is frozen with `Trainer.freeze`: its variables and optimizer slots stay
as they are and none of its gradient reaches the trunk, so the trunk then moves
exactly as it would with that head absent. `fit` stops when every head is frozen. Each
head's best model is kept by a `BestCheckpoint` of its own (config:
`callbacks.best_checkpoint.per_head`), not restored here: the trunk has moved on since
that head's best step.

Resume: the frozen flags are in the trainer's checkpoint; the evaluations this callback
saw are in its `record` file, which a resumed `fit` replays up to the checkpoint's step
(evaluations after it are dropped: the resumed run makes them again).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

from multihead._boundary import read_json, write_atomic
from multihead._checks import check_choice, check_float, check_int
from multihead.training.callbacks import MODES, Callback, Metrics, MonitoredQuantity
from multihead.monitoring.metric_key import MetricKey


@dataclasses.dataclass
class HeadWatch:
    """One head's early-stopping state.

    Attributes:
        quantity: the head's monitored metric.
        best_value, best_step: its best evaluation so far (None before one).
        wait: evaluations in a row without improvement since the best.
        stopped_step: the step at which the head was frozen, or None.
        reason: the one line saying why it was frozen, or None.
    """

    quantity: MonitoredQuantity
    best_value: float | None = None
    best_step: int | None = None
    wait: int = 0
    stopped_step: int | None = None
    reason: str | None = None


class HeadEarlyStopping(Callback):
    """Freezes each head whose monitored evaluation metric stops improving; stops `fit`
    once every head is frozen.

    At each evaluation, head `h` watches `eval/<h>/<metric>`; as for `EarlyStopping`, an
    evaluation improves when it beats the head's best by more than `min_delta`, and after
    `patience` evaluations in a row that do not, the head is frozen (`Trainer.freeze`)
    and one line says so (printed by `fit(verbose=True)`, kept in `stops`). A head
    un-frozen by another callback (`Trainer.unfreeze`) is watched again from there. No
    weights are restored: keep each head's best with a per-head `BestCheckpoint`.

    Example:
        >>> stop = mh.HeadEarlyStopping(patience=3, record="runs/x/head_stopping.json")
        >>> trainer.fit(data, 10_000, eval_data=held_out, eval_every=500,
        ...             callbacks=[stop])                               # doctest: +SKIP
        >>> stop.stops            # {head: HeadWatch(..., stopped_step=..., reason=...)}  # doctest: +SKIP

    Args:
        heads: the heads to watch (default: every head of the trainer).
        metric: `"loss"` or a metric of each watched head's `Objective`.
        patience: evaluations in a row without improvement that freeze a head (>= 1).
        min_delta: the amount an evaluation must beat the best by (>= 0).
        mode: `"min"`, `"max"` or `"auto"` (from the metric name).
        record: a JSON file where the evaluations seen are kept, so that a `fit`
            resumed from a checkpoint continues exactly; None keeps them in memory.

    Attributes:
        watches: head -> `HeadWatch`, the state of each watched head.
    """

    def __init__(self, heads: Sequence[str] | None = None, metric: str = "loss",
                 patience: int = 3, min_delta: float = 0.0, mode: str = "auto",
                 record: str | os.PathLike[str] | None = None) -> None:
        if heads is not None and (isinstance(heads, str) or not heads):
            raise ValueError(f"HeadEarlyStopping: heads must be a non-empty list of head names or "
                             f"None (every head), got {heads!r}")
        if not isinstance(metric, str) or not metric or "/" in metric:
            raise ValueError(f"HeadEarlyStopping: metric must be 'loss' or a metric name of the "
                             f"heads, got {metric!r}")
        self.heads = None if heads is None else list(heads)
        self.metric = metric
        self.patience = check_int(patience, "HeadEarlyStopping.patience", minimum=1)
        self.min_delta = check_float(min_delta, "HeadEarlyStopping.min_delta", minimum=0)
        self.mode = check_choice(mode, "HeadEarlyStopping.mode", MODES)
        self.record = None if record is None else os.fspath(record)
        self._quantity("head")  # a mode="auto" the metric name cannot settle fails here
        self.watches: dict[str, HeadWatch] = {}
        self._seen: list[tuple[int, dict[str, float]]] = []

    def _quantity(self, head: str) -> MonitoredQuantity:
        return MonitoredQuantity(str(MetricKey(head, self.metric)), self.mode, "HeadEarlyStopping")

    @property
    def stops(self) -> dict[str, HeadWatch]:
        """The watched heads this callback froze (and that are still frozen by it)."""
        return {h: w for h, w in self.watches.items() if w.stopped_step is not None}

    def on_train_begin(self) -> None:
        heads = self.trainer.names
        if self.heads is not None:
            unknown = [h for h in self.heads if h not in self.trainer.names]
            if unknown:
                raise ValueError(f"HeadEarlyStopping.heads names head {unknown[0]!r}, but the "
                                 f"model's heads are {list(self.trainer.names)}")
        self.watches = {h: HeadWatch(self._quantity(h)) for h in (self.heads or heads)}
        step = int(self.trainer.global_step)
        seen = self._read_record() if self.record is not None else self._seen
        self._seen = []
        for at, values in seen:  # the state at `step`: what a resumed run had seen by then
            if at <= step:
                self._observe(at, values)
        self._write_record()

    def _read_record(self) -> list[tuple[int, dict[str, float]]]:
        assert self.record is not None
        if not os.path.lexists(self.record):
            return []
        # A regular file, not a symlink, of bounded size (a run directory is data).
        tree = read_json(os.path.dirname(os.path.abspath(self.record)),
                         os.path.basename(self.record), limit=1 << 24)
        try:
            return [(int(e["step"]), {h: float(v) for h, v in e["values"].items()})
                    for e in tree["evaluations"]]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"HeadEarlyStopping: {self.record} is not a record of this "
                             "callback (evaluations: [{step, values}]); remove it to start "
                             "afresh") from None

    def _write_record(self) -> None:
        if self.record is not None and getattr(self.trainer, "is_chief", True):
            tree = {"evaluations": [{"step": s, "values": v} for s, v in self._seen]}
            write_atomic(self.record, json.dumps(tree, indent=1) + "\n")

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        values = {h: w.quantity.value(metrics) for h, w in self.watches.items()}
        for head in self._observe(step, values):
            self.trainer.freeze(head)
            self.announce(self.watches[head].reason)
        self._write_record()
        frozen = set(self.trainer.frozen)
        if all(h in frozen for h in self.trainer.names):
            self.request_stop(f"HeadEarlyStopping: every head is frozen; stopped at step {step}")

    def _observe(self, step: int, values: dict[str, float]) -> list[str]:
        """Counts one evaluation; returns the heads it stops."""
        self._seen.append((step, values))
        frozen = set(self.trainer.frozen)
        stopped = []
        for head, watch in self.watches.items():
            if watch.stopped_step is not None:
                if head in frozen:
                    continue  # frozen: its evaluations do not change
                watch.stopped_step, watch.reason, watch.wait = None, None, 0  # un-frozen
            value = values[head]
            if watch.quantity.improves(value, watch.best_value, self.min_delta):
                watch.best_value, watch.best_step, watch.wait = value, step, 0
                continue
            watch.wait += 1
            if watch.wait >= self.patience:
                watch.stopped_step = step
                watch.reason = (
                    f"HeadEarlyStopping: {watch.quantity.name} did not improve by more than "
                    f"{self.min_delta:g} for {watch.wait} evaluation(s) (best {watch.best_value:.6g} "
                    f"at step {watch.best_step}); froze head {head!r} at step {step}; weights "
                    "not restored")
                stopped.append(head)
        return stopped
