"""Compiled loops: a step body as `tf.function`s, one step or many steps per call.

Kept apart from the step's math, as Keras keeps `train_step` apart from
`make_train_function`: the step (`multihead.step.train_step`) is a plain function of its
inputs; this module compiles it.

* `StepLoops`: per variant key (e.g. monitored or not, which heads), a function
  for one step and one for a loop of up to `n` steps over a data iterator
  (`steps_per_execution`), both compiled lazily, once per key;
* `ConcreteCache`: calls the concrete function traced for the arguments' types
  directly, past `tf.function`'s per-call dispatch;
* `split_at_logging_steps`: runs `n` steps as stretches of steps that do not log
  and single logging steps, each its own call, and joins the outputs;
* `batch_loop` / `fold_batches`: the in-graph loops over an iterator, read with
  `get_next_as_optional`, shared by training and `Evaluator`.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._autograph import plain
from multihead.step.options import StepOptions


class StepOutput(NamedTuple):
    """What one compiled step returns, per head in head order.

    Attributes:
        step: the step counter before the step.
        losses: `(K,)` float32, NaN where the head was not evaluated.
        updated: `(K,)` bool, whether the head's optimizer applied an update.
        skipped: `(K,)` bool, whether a non-finite loss or gradient dropped it.
        stats: what a step that measures measured, for the monitor to write
            (`multihead.monitoring.step_stats.StatsOutput`); None for the others.
    """

    step: tf.Tensor
    losses: tf.Tensor
    updated: tf.Tensor
    skipped: tf.Tensor
    stats: Any = None


class StepsOutput(NamedTuple):
    """What `TrainStep.run` returns for several steps in one call.

    Attributes:
        first_step: the step counter before the first step.
        count: how many steps ran (fewer than asked at the end of the data).
        losses: `(max_steps, K)`; rows past `count` are zeros.
        updated: `(max_steps, K)` bool; rows past `count` are False.
        skipped: `(max_steps, K)` bool; rows past `count` are False.
    """

    first_step: tf.Tensor
    count: tf.Tensor
    losses: tf.Tensor
    updated: tf.Tensor
    skipped: tf.Tensor


#: A step body: `(inputs, targets) -> (losses, updated, skipped)`, each a `(K,)` row, and
#: in a step that measures its statistics after them.
Rows = tuple[Any, ...]
_ROW_DTYPES = (tf.float32, tf.bool, tf.bool)


def _as_tensors(value: Any) -> Any:
    """`value` with its numpy arrays as tensors (dicts, lists and tuples walked; a plain
    loop: `tf.nest` costs more than the step of a small model)."""
    if isinstance(value, np.ndarray):
        return tf.convert_to_tensor(value)
    if isinstance(value, dict):
        return {k: _as_tensors(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_as_tensors(v) for v in value)
    return value


def spec_of(value: Any) -> Hashable | None:
    """A hashable description of the tensors in `value` (shapes, dtypes, dict keys), or None
    if it holds anything but tensors, dicts, lists and tuples."""
    if value is None:
        return ()
    if isinstance(value, tf.Tensor):
        return tuple(value.shape), value.dtype
    if isinstance(value, Mapping):
        items = tuple((key, spec_of(v)) for key, v in value.items())
        return None if any(spec is None for _, spec in items) else ("dict", items)
    if isinstance(value, (list, tuple)):
        items = tuple(spec_of(v) for v in value)
        return None if any(spec is None for spec in items) else (type(value).__name__, items)
    return None


class ConcreteCache:
    """Calls through concrete functions, one per key (the arguments' types): `tf.function`'s
    own dispatch hashes the arguments' types on every call, a large share of a small
    model's step (docs/performance.md)."""

    def __init__(self) -> None:
        self._concrete: dict[Hashable, Callable[..., Any]] = {}
        self._flat: dict[Hashable, Callable[[list[tf.Tensor]], Any]] = {}

    def call(self, fn: Any, key: Hashable | None, *args: Any) -> Any:
        """`fn(*args)`, through the concrete function traced for `key` when there is a key
        (None: e.g. numpy arrays, per-replica values, the general path)."""
        if key is None:
            return fn(*args)
        concrete = self._concrete.get(key)
        if concrete is None:
            concrete = self._concrete[key] = fn.get_concrete_function(*args)
        return concrete(*args)

    def call_tensors(self, fn: Any, key: Hashable, *args: Any) -> Any:
        """`fn(*args)` for arguments that hold tensors only (in dicts, lists and tuples), of
        the shapes and dtypes `key` stands for (`spec_of`), through the concrete function's
        flat inputs (`_keras_internals.flat_call`: no per-call binding to its signature)."""
        call = self._flat.get(key)
        if call is None:
            concrete = self._concrete[key] = fn.get_concrete_function(*args)
            call = self._flat[key] = internals.flat_call(concrete)
        return call(tf.nest.flatten(args))


def fold_batches(iterator: Any, body: Callable[[Any, Any], Any], carry: Any,
                 max_steps: tf.Tensor | None = None) -> Any:
    """In the graph: `carry = body(batch, carry)` over the batches of `iterator`, at most
    `max_steps` of them (None: until the end of the data)."""
    if max_steps is None:
        for batch in iterator:  # autograph: a graph loop on `get_next_as_optional`
            carry = body(batch, carry)
        return carry

    # With `max_steps`, the loop is written out (no autograph: transpiling it and importing
    # autograph took most of the first multi-step call's trace): the next batch is an
    # optional, and the loop ends at `max_steps` or at the first empty one.
    def step(index: tf.Tensor, ended: tf.Tensor, carry: Any) -> tuple[tf.Tensor, tf.Tensor, Any]:
        batch = iterator.get_next_as_optional()
        ended, carry = tf.cond(batch.has_value(),
                               lambda: (tf.constant(False), body(batch.get_value(), carry)),
                               lambda: (tf.constant(True), carry))
        return index + 1, ended, carry

    _, _, carry = tf.while_loop(lambda index, ended, _: tf.logical_and(index < max_steps, ~ended),
                                step, (tf.constant(0), tf.constant(False), carry))
    return carry


def batch_loop(iterator: Any, body: Callable[[Any, Any], Sequence[tf.Tensor]], width: int,
               max_steps: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """In the graph: `body(inputs, targets)` on up to `max_steps` batches of `iterator`
    -> (how many ran, each of the body's `(width,)` rows stacked `(max_steps, width)`)."""
    def step(batch: Any, carry: tuple[tf.Tensor, list[tf.TensorArray]],
             ) -> tuple[tf.Tensor, list[tf.TensorArray]]:
        index, arrays = carry
        inputs, targets = batch
        rows = body(inputs, targets)[:3]  # a loop's steps log nothing: no statistics
        return index + 1, [a.write(index, row) for a, row in zip(arrays, rows)]

    arrays = [tf.TensorArray(dtype, size=max_steps, element_shape=[width]) for dtype in _ROW_DTYPES]
    count, arrays = fold_batches(iterator, step, (tf.constant(0), arrays), max_steps)
    return count, [a.stack() for a in arrays]


class StepLoops:
    """A step body compiled per variant: one step per call, or a loop of steps.

    Args:
        body_for: variant key -> the step body `(inputs, targets) -> Rows`.
        counter: the step counter (read before the step(s) for the outputs).
        width: the length of each row (the number of heads).
        options: the step's options; with `jit_compile`, the step is XLA-compiled (the
            loop around it stays plain: XLA cannot compile the data iterator).
    """

    def __init__(self, body_for: Callable[[Hashable], Callable[[Any, Any], Rows]],
                 counter: tf.Variable, width: int, options: StepOptions = StepOptions()) -> None:
        self._body_for = body_for
        self._counter = counter
        self._width = width
        self._jit_compile = options.jit_compile
        self._functions: dict[Hashable, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        self._cache = ConcreteCache()
        self._step_counts: dict[int, tf.Tensor] = {}

    def functions(self, key: Hashable) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The variant `key`'s `tf.function`s: (one step, up to n steps), compiled lazily."""
        if key not in self._functions:
            body = self._body_for(key)
            jit = self._jit_compile
            # The step's own code and the loop over the iterator are traced as plain Python
            # (`multihead._autograph`, `fold_batches`).
            one = tf.function(lambda inputs, targets: self._single(body, inputs, targets),
                              jit_compile=jit, reduce_retracing=True, autograph=False)
            step_body = (tf.function(body, jit_compile=True, autograph=False) if jit
                         else plain(body))
            many = tf.function(lambda iterator, max_steps: self._multi(step_body, iterator, max_steps),
                               reduce_retracing=True, autograph=False)
            self._functions[key] = (one, many)
        return self._functions[key]

    def one(self, key: Hashable, inputs: Any, targets: Any) -> StepOutput:
        """One step of variant `key` on one batch (numpy arrays are taken as the tensors
        `tf.function` would make of them, so that they find their concrete function too)."""
        inputs, targets = _as_tensors(inputs), _as_tensors(targets)
        spec = spec_of((inputs, targets))
        if spec is None:
            return self._cache.call(self.functions(key)[0], None, inputs, targets)
        return self._cache.call_tensors(self.functions(key)[0], ("one", key, spec), inputs, targets)

    def many(self, key: Hashable, iterator: Any, max_steps: int, cacheable: bool = True,
             ) -> StepsOutput:
        """Up to `max_steps` steps of variant `key` in one call, batches from `iterator`.

        Args:
            cacheable: `iterator` is a plain `tf.data.Iterator` whose type spec may key
                a concrete function (not a distributed iterator).
        """
        count = self._step_counts.get(max_steps)
        if count is None:
            count = self._step_counts[max_steps] = tf.constant(max_steps, tf.int32)
        concrete_key = None
        if cacheable and isinstance(iterator, tf.data.Iterator):
            concrete_key = ("many", key, tf.type_spec_from_value(iterator))
        return self._cache.call(self.functions(key)[1], concrete_key, iterator, count)

    def _single(self, body: Callable[[Any, Any], Rows], inputs: Any, targets: Any) -> StepOutput:
        step = self._counter.read_value()
        return StepOutput(step, *body(inputs, targets))  # statistics last, if measured

    def _multi(self, body: Callable[[Any, Any], Rows], iterator: Any, max_steps: tf.Tensor,
               ) -> StepsOutput:
        first = self._counter.read_value()
        count, stacked = batch_loop(iterator, body, self._width, max_steps)
        return StepsOutput(first, count, *stacked)


def split_at_logging_steps(run: Callable[[bool, int], StepsOutput], first_step: int,
                           max_steps: int, logs_at: Callable[[int], bool],
                           quiet_steps_from: Callable[[int], int]) -> StepsOutput:
    """Up to `max_steps` steps from `first_step` as calls `run(logs, n)`: one per stretch
    of steps that do not log (`logs=False`), one per logging step (`logs=True, n=1`);
    stops early at the end of the data (a call that ran fewer steps than asked)."""
    step, left, parts = first_step, max_steps, []
    while left > 0:  # the counter moves only by these calls meanwhile
        logs = logs_at(step)
        n = 1 if logs else min(left, quiet_steps_from(step))
        part = run(logs, n)
        parts.append(part)
        count = int(part.count)
        step, left = step + count, left - count
        if count < n:
            break  # the end of the data
    return joined(parts, max_steps)


def joined(parts: Sequence[StepsOutput], max_steps: int) -> StepsOutput:
    """Consecutive `parts` of a run as one `StepsOutput` of `max_steps` rows."""
    if len(parts) == 1:
        return parts[0]
    counts = [int(p.count) for p in parts]
    total = sum(counts)

    def rows(field: str) -> tf.Tensor:
        valid = tf.concat([getattr(p, field)[:c] for p, c in zip(parts, counts)], 0)
        return tf.pad(valid, [[0, max_steps - total], [0, 0]])

    return StepsOutput(parts[0].first_step, tf.constant(total), rows("losses"), rows("updated"),
                       rows("skipped"))
