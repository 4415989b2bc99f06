"""The statistics a monitored step returns: measured in the graph, written after the step.

A monitored step body measures into one `StepStats`: `record(tag, value, present)` for a
scalar or histogram it returns, `keep(key, value, present)` for a value only later
measurements read (a head's trunk gradient, for the cosines of the heads updated after
it). Each entry is a value with a flag, `present`: whether the step measured it (a head
that did not update, a piece that was not due this step, is not present).

A value measured inside a `tf.cond` or `tf.switch_case` branch (a head with `every > 1`,
the non-finite guard, the aggregation's choice of heads) leaves the branch as one of its
outputs: the step's conditionals that hold measurements are taken through `cond` and
`switch_case` here, which return, beside the branches' own outputs, every entry a branch
recorded (absent in the branches that did not record it). So nothing is written inside
the step: the step returns `outputs()`, and the monitor writes the present entries at the
step's number of updates (`Monitor.write_stats`).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, NamedTuple, Sequence, TypeVar

import numpy as np
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead.monitoring.gradient_stats import HISTOGRAM_BINS

T = TypeVar("T")
_Entry = tuple[tf.Tensor, tf.Tensor]  # (value, present)


class StatsOutput(NamedTuple):
    """What a monitored step returns to be written, packed in six tensors (a call's outputs
    cost per tensor): the tags, values and flags of its scalars (float32) and histograms
    (TensorBoard's `[bins, 3]` rows)."""

    scalar_tags: tf.Tensor
    scalars: tf.Tensor
    scalars_present: tf.Tensor
    histogram_tags: tf.Tensor
    histograms: tf.Tensor
    histograms_present: tf.Tensor


class StepStats:
    """The measurements of one monitored step body, traced once per trace of the body.

    Args:
        done: the number of updates after the step, the step its statistics are written at
            (for the cadence's gates).
        scalars_due: whether the step's scalars are due (a bool scalar tensor).
        functional: keep the conditionals of `gated` functional (`If` ops called, not
            lowered to Switch/Merge): the pieces not due cost one op call, not a visit of
            each of their nodes. False under a `tf.distribute` strategy, where an unlowered
            `If` reading mirrored variables cannot be placed.
    """

    def __init__(self, done: tf.Tensor, scalars_due: tf.Tensor, functional: bool = True) -> None:
        self.done = done
        self.scalars_due = scalars_due
        self._functional = functional
        self._entries: dict[Hashable, _Entry] = {}
        self._kinds: dict[str, str] = {}  # tag -> "scalar" | "histogram"

    # -- recording ------------------------------------------------------------------------

    def record(self, tag: str, value: Any, present: Any = True, histogram: bool = False) -> None:
        """Records `value` under `tag` (a scalar, or TensorBoard histogram rows), for the step
        to return; the monitor writes it when `present`."""
        self._kinds[tag] = "histogram" if histogram else "scalar"
        value = tf.convert_to_tensor(value)
        self._entries[tag] = (value if histogram else tf.cast(value, tf.float32),
                              tf.convert_to_tensor(present, tf.bool))

    def keep(self, key: tuple[Any, ...], value: Any, present: Any = True) -> None:
        """Holds `value` for later measurements of the step (`get`), not written."""
        self._entries[key] = (tf.convert_to_tensor(value), tf.convert_to_tensor(present, tf.bool))

    def forget(self, keys: Sequence[Hashable]) -> None:
        """Drops kept values no later measurement reads: they do not leave the conditionals
        around (each output of a conditional costs trace time)."""
        for key in keys:
            self._entries.pop(key, None)

    def get(self, key: Hashable) -> _Entry | None:
        """`(value, present)` recorded or kept under `key` so far in the step, or None."""
        return self._entries.get(key)

    # -- conditionals that hold measurements ---------------------------------------------

    def cond(self, pred: Any, true_fn: Callable[[], T], false_fn: Callable[[], T]) -> T:
        """`tf.cond(pred, true_fn, false_fn)`, the entries either branch records taken out."""
        return self._branched(lambda fns: tf.cond(pred, *fns), (true_fn, false_fn))

    def switch_case(self, index: Any, branches: Sequence[Callable[[], T]]) -> T:
        """`tf.switch_case(index, branches)`, the entries the branches record taken out.
        Every branch records the same entries, or none."""
        return self._branched(lambda fns: tf.switch_case(index, list(fns)), tuple(branches))

    def gated(self, due: Any, measure: Callable[[], None]) -> None:
        """`measure()` (it records) only when `due`, as a conditional kept functional."""
        cond(self, due, measure, lambda: None, functional=self._functional)

    def _branched(self, call: Callable[[Sequence[Callable[[], Any]]], Any],
                  branches: Sequence[Callable[[], T]]) -> T:
        """`call(branches)` with each branch returning, beside its own output, the entries
        the first branch traced recorded (TensorFlow traces a conditional's branches in
        order); an entry a branch did not record is its value before the conditional, or
        absent (zeros, not present). The float32 scalars and the flags leave packed, one
        vector each: a conditional's trace costs per output."""
        before = dict(self._entries)
        recorded: list[Hashable] = []
        first: dict[Hashable, _Entry] = {}
        packed: list[bool] = []  # per recorded entry: a float32 scalar, in the packed vector

        def wrapped(fn: Callable[[], T], index: int) -> Callable[[], tuple[T, Any]]:
            def branch() -> tuple[T, Any]:
                self._entries = dict(before)
                out = fn()
                changed = [k for k, e in self._entries.items() if before.get(k) is not e]
                if index == 0:
                    recorded.extend(changed)
                    first.update((k, self._entries[k]) for k in changed)
                    packed.extend(first[k][0].shape.rank == 0 and first[k][0].dtype == tf.float32
                                  for k in recorded)
                elif set(changed) - set(recorded):
                    raise RuntimeError(f"a branch recorded {sorted(map(str, set(changed) - set(recorded)))} "
                                       "that the first branch did not: record the same entries in "
                                       "every branch")
                entries = [self._entries.get(k) or _absent(first[k]) for k in recorded]
                if not entries:
                    return out, None
                scalars = [v for (v, _), p in zip(entries, packed) if p]
                return out, (tf.stack(scalars) if scalars else None,
                             [v for (v, _), p in zip(entries, packed) if not p],
                             tf.stack([present for _, present in entries]))

            return branch

        out, outputs = call([wrapped(fn, i) for i, fn in enumerate(branches)])
        self._entries = before
        if outputs is not None:
            scalars, others, flags = outputs
            scalars = iter(tf.unstack(scalars, num=sum(packed)) if scalars is not None else ())
            others = iter(others)
            values = [next(scalars) if p else next(others) for p in packed]
            self._entries.update(zip(recorded, zip(values, tf.unstack(flags, num=len(recorded)))))
        return out

    # -- the step's output ----------------------------------------------------------------

    def outputs(self) -> StatsOutput:
        """Every scalar and histogram recorded, with its tag and whether it is present."""
        packed = []
        for kind, empty in (("scalar", [0]), ("histogram", [0, HISTOGRAM_BINS, 3])):
            tags = [tag for tag, k in self._kinds.items() if k == kind]
            entries = [self._entries[tag] for tag in tags]
            packed += [tf.constant(tags, tf.string, shape=[len(tags)]),
                       tf.stack([v for v, _ in entries]) if entries
                       else tf.zeros(empty, tf.float32 if kind == "scalar" else tf.float64),
                       tf.stack([p for _, p in entries]) if entries else tf.zeros([0], tf.bool)]
        return StatsOutput(*packed)


def cond(stats: StepStats | None, pred: Any, true_fn: Callable[[], T],
         false_fn: Callable[[], T], functional: bool = False) -> T:
    """`tf.cond(pred, true_fn, false_fn)`, through `stats` (`StepStats.cond`) in a step that
    measures. `functional`: the `If` kept a function call, not lowered to Switch/Merge (a
    lowered cond visits every node of the branch not taken, and puts a Switch on every
    tensor the branches read)."""
    branch = tf.cond if stats is None else stats.cond
    if not functional:
        return branch(pred, true_fn, false_fn)
    graph = tf.compat.v1.get_default_graph()  # the ops the cond adds, scanned only here
    start = len(graph.get_operations())
    out = branch(pred, true_fn, false_fn)
    for op in graph.get_operations()[start:]:
        if op.type in ("If", "StatelessIf"):
            internals.keep_cond_functional(op)
    return out


def _absent(entry: _Entry) -> _Entry:
    value, _ = entry
    return tf.zeros_like(value), tf.constant(False)


def present_entries(stats: StatsOutput) -> tuple[dict[int, str], dict[int, str]]:
    """Position -> tag of the scalars and of the histograms a step measured (eager outputs)."""
    def present(tags: tf.Tensor, flags: tf.Tensor) -> dict[int, str]:
        names = tags.numpy()
        return {int(i): names[i].decode() for i in np.flatnonzero(flags.numpy())}

    return (present(stats.scalar_tags, stats.scalars_present),
            present(stats.histogram_tags, stats.histograms_present))
