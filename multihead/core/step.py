"""The compiled training step: per-head gradients applied by per-head optimizers.

Two schedules:

* `simultaneous`: one forward pass; every due head's gradient is taken at the
  same parameters (one persistent tape), then each head's optimizer applies its
  own, in head order. This is the well-defined version of TF1's
  `sess.run([train_op_1, train_op_2])`.
* `sequential`: heads update one after another, each with its own forward pass
  at the parameters the previous head left.

A head with `every=n` is due on steps where `step % n == 0`; the test is made in
the graph on the step variable, so mixed cadences never retrace the step.

With TensorBoard monitoring, the step is compiled in two variants, with and without
the monitor, and each call picks one in Python from the step counter (see
`multihead.monitoring.monitor`).

With a `tf.distribute` strategy, gradients are taken and all-reduced in replica
context and applied in cross-replica context (see `multihead.core.distribute`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Mapping, NamedTuple, Sequence

import keras
import tensorflow as tf

from multihead.core import distribute, updates
from multihead.core.model import MultiHeadModel
from multihead.monitoring.monitor import Monitor
from multihead.core.objectives import HeadLoss

SCHEDULES = ("simultaneous", "sequential")


@dataclasses.dataclass(frozen=True)
class HeadUpdate:
    """Everything the step needs about one head, resolved and validated."""

    name: str
    loss: HeadLoss
    optimizer: keras.optimizers.Optimizer
    var_list: tuple[keras.Variable, ...]
    weight: float
    every: int
    trains_trunk: bool


def _not_converted(method: Callable[..., Any]) -> Callable[..., Any]:
    """Marks step internals that call no user code (gradients, optimizer updates) for
    autograph to leave alone: inspecting every call they make cost ~0.5 s of the step's
    trace at K=64. Forward passes stay converted: user losses may use Python control flow
    on tensors."""
    return tf.autograph.experimental.do_not_convert(method)


def _not_updated() -> tf.Tensor:
    return tf.constant(False)


def _skipped() -> tuple[tf.Tensor, tf.Tensor]:
    """A head that was not due: no loss evaluated, no update."""
    return tf.constant(float("nan")), tf.constant(False)


def _regularization(layer: keras.layers.Layer) -> tf.Tensor | float:
    losses = layer.losses
    return tf.add_n(losses) if losses else 0.0


class StepOutput(NamedTuple):
    """What one compiled step returns, per head in head order.

    Attributes:
        step: the step counter before the step.
        losses: `(K,)` float32, NaN where the head was not evaluated.
        updated: `(K,)` bool, whether the head's optimizer applied an update.
    """

    step: tf.Tensor
    losses: tf.Tensor
    updated: tf.Tensor


class StepsOutput(NamedTuple):
    """What `TrainStep.run` returns for several steps in one call.

    Attributes:
        first_step: the step counter before the first step.
        count: how many steps ran (fewer than asked at the end of the data).
        losses: `(max_steps, K)`; rows past `count` are zeros.
        updated: `(max_steps, K)` bool; rows past `count` are False.
    """

    first_step: tf.Tensor
    count: tf.Tensor
    losses: tf.Tensor
    updated: tf.Tensor


def _spec(value: Any) -> Hashable | None:
    """A hashable description of the tensors in `value` (shapes, dtypes, dict keys), or None
    if it holds anything but tensors, dicts, lists and tuples."""
    if value is None:
        return ()
    if isinstance(value, tf.Tensor):
        return tuple(value.shape), value.dtype
    if isinstance(value, Mapping):
        items = tuple((key, _spec(v)) for key, v in value.items())
        return None if any(spec is None for _, spec in items) else ("dict", items)
    if isinstance(value, (list, tuple)):
        items = tuple(_spec(v) for v in value)
        return None if any(spec is None for spec in items) else (type(value).__name__, items)
    return None


def _joined(parts: Sequence[StepsOutput], max_steps: int) -> StepsOutput:
    """The consecutive `parts` of a `TrainStep.run` as one `StepsOutput` of `max_steps` rows."""
    if len(parts) == 1:
        return parts[0]
    counts = [int(p.count) for p in parts]
    total = sum(counts)

    def rows(field: str) -> tf.Tensor:
        valid = tf.concat([getattr(p, field)[:c] for p, c in zip(parts, counts)], 0)
        return tf.pad(valid, [[0, max_steps - total], [0, 0]])

    return StepsOutput(parts[0].first_step, tf.constant(total), rows("losses"), rows("updated"))


class TrainStep:
    """One compiled update of all due heads: `step(inputs, targets)` or `step.run(iterator, n)`."""

    def __init__(
        self,
        model: MultiHeadModel,
        heads: Sequence[HeadUpdate],
        schedule: str,
        step: tf.Variable,
        monitor: Monitor | None = None,
        jit_compile: bool = False,
        strategy: tf.distribute.Strategy | None = None,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self._model = model
        self._heads = tuple(heads)
        self._schedule = schedule
        self._step = step
        self._monitor = monitor
        self._strategy = strategy
        if strategy is not None and jit_compile:
            raise ValueError("jit_compile=True is not supported with a tf.distribute strategy; "
                             "set jit_compile=False")
        if monitor is not None and strategy is not None:
            monitor.distributed = True  # see Monitor.distributed
        if monitor is not None:  # its buffers must exist before the first trace
            monitor.bind({h.name: h.var_list for h in self._heads}, model.trunk_variables,
                         {h.name: h.optimizer for h in self._heads})
        self.trace_count = 0
        self._concrete: dict[Hashable, Callable[..., Any]] = {}
        self._step_counts: dict[int, tf.Tensor] = {}
        # Compiled lazily: (one step, several steps) without monitoring, and with it.
        self._variants = {False: self._compile(False, jit_compile),
                          True: self._compile(True, jit_compile)}

    def _compile(self, monitored: bool, jit_compile: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
        def body(inputs: Any, targets: Any) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
            return self._body(inputs, targets, monitored)

        one = tf.function(lambda inputs, targets: self._single(body, inputs, targets),
                          jit_compile=jit_compile, reduce_retracing=True)
        # XLA cannot compile the data iterator, so the loop stays plain and each step
        # in it is the same (optionally jit-compiled) function.
        step_body = tf.function(body, jit_compile=True) if jit_compile else body
        many = tf.function(lambda iterator, max_steps: self._multi(step_body, iterator, max_steps),
                           reduce_retracing=True)
        return one, many

    # -- which variant: steps that do not log run one without any monitoring op ---------
    #
    # The choice is made in Python from the step counter: in the graph, even an untaken
    # conditional costs ~10-25 us per step, reading the counter ~5-10 us per call (a
    # value cached in Python and checked in the graph measured worse: the check's
    # dependencies cost ~50 us). Under a strategy every step runs the monitored
    # variant, gated piece by piece in the graph: the all-reduces must be the same on
    # every worker, whether it monitors or not.

    def _counter(self) -> int:
        # The raw op: `Variable.numpy()` costs ~18 us of Python per call, this ~5 us.
        return int(tf.raw_ops.ReadVariableOp(resource=self._step.handle, dtype=self._step.dtype))

    def _through_concrete(self, fn: Any, key: Hashable | None, *args: Any) -> Any:
        """`fn(*args)`, through the concrete function traced for `key` (the arguments'
        types) when there is a key: `tf.function`'s own dispatch (hashing the arguments'
        types) costs ~70-100 us per call, a third of a small model's step."""
        if key is None:  # e.g. numpy arrays, per-replica values: the general path
            return fn(*args)
        concrete = self._concrete.get(key)
        if concrete is None:
            concrete = self._concrete[key] = fn.get_concrete_function(*args)
        return concrete(*args)

    def _one_step(self, monitored: bool, inputs: Any, targets: Any) -> StepOutput:
        """One step of a variant."""
        spec = _spec((inputs, targets))
        key = None if spec is None else ("one", monitored, spec)
        return self._through_concrete(self._variants[monitored][0], key, inputs, targets)

    def _steps(self, monitored: bool, iterator: Any, max_steps: int) -> StepsOutput:
        """Up to `max_steps` steps of a variant in one call."""
        count = self._step_counts.get(max_steps)
        if count is None:
            count = self._step_counts[max_steps] = tf.constant(max_steps, tf.int32)
        key = None
        if self._strategy is None and isinstance(iterator, tf.data.Iterator):
            key = ("many", monitored, tf.type_spec_from_value(iterator))
        return self._through_concrete(self._variants[monitored][1], key, iterator, count)

    def __call__(self, inputs: Any, targets: Any) -> StepOutput:
        """One step on one batch (split across the replicas under a strategy)."""
        if self._strategy is not None:
            distribute.check_not_in_scope(self._strategy)
            inputs, targets = distribute.distribute_batch(self._strategy, (inputs, targets))
        monitor = self._monitor
        monitored = monitor is not None and (monitor.distributed or monitor.logs_at(self._counter()))
        return self._one_step(monitored, inputs, targets)

    def run(self, iterator: Any, max_steps: int) -> StepsOutput:
        """Up to `max_steps` steps in compiled calls, taking batches from `iterator`.

        One call, or, with a monitor, one per stretch of steps that do not log
        plus one per logging step. Fewer steps are run if the iterator is
        exhausted first (the end of an epoch); `StepsOutput.count` says how many.
        `every` schedules are decided per step in the graph, exactly as with
        single steps. Under a strategy, `iterator` iterates a distributed dataset.
        """
        if self._strategy is not None:
            distribute.check_not_in_scope(self._strategy)
        monitor = self._monitor
        if monitor is None or monitor.distributed:
            return self._steps(monitor is not None, iterator, max_steps)
        step, left, parts = self._counter(), max_steps, []
        while left > 0:  # the counter moves only by these calls meanwhile
            logs = monitor.logs_at(step)
            n = 1 if logs else min(left, monitor.quiet_steps_from(step))
            part = self._steps(logs, iterator, n)
            parts.append(part)
            count = int(part.count)
            step, left = step + count, left - count
            if count < n:
                break  # the end of the data
        return _joined(parts, max_steps)

    def _stack(self, values: Mapping[str, tf.Tensor], dtype: tf.DType) -> tf.Tensor:
        return tf.stack([tf.cast(values[h.name], dtype) for h in self._heads])

    def _single(self, body: Callable[..., Any], inputs: Any, targets: Any) -> StepOutput:
        step = self._step.read_value()
        losses, updated = body(inputs, targets)
        return StepOutput(step, self._stack(losses, tf.float32), self._stack(updated, tf.bool))

    def _multi(self, body: Callable[..., Any], iterator: Any, max_steps: tf.Tensor) -> StepsOutput:
        first = self._step.read_value()
        k = len(self._heads)
        losses = tf.TensorArray(tf.float32, size=max_steps, element_shape=[k])
        updated = tf.TensorArray(tf.bool, size=max_steps, element_shape=[k])
        count = tf.constant(0)
        for i in tf.range(max_steps):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            inputs, targets = batch.get_value()
            step_losses, step_updated = body(inputs, targets)
            losses = losses.write(i, self._stack(step_losses, tf.float32))
            updated = updated.write(i, self._stack(step_updated, tf.bool))
            count = i + 1
        return StepsOutput(first, count, losses.stack(), updated.stack())

    def _body(self, inputs: Any, targets: Any, monitored: bool,
              ) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
        self.trace_count += 1  # Python side effect: runs once per trace, not per step
        step = self._step.read_value()
        if self._strategy is not None:
            update = lambda: self._replicated(inputs, targets, step)  # noqa: E731
        elif self._schedule == "simultaneous":
            update = lambda: self._simultaneous(inputs, targets, step)  # noqa: E731
        else:
            update = lambda: self._sequential(inputs, targets, step)  # noqa: E731
        if monitored:
            result = self._monitor.monitored(step, update)
        elif self._monitor is not None:
            with tf.summary.record_if(False):  # summaries written by user code: not this step
                result = update()
        else:
            result = update()
        self._step.assign_add(1)
        return result

    def _head_loss(self, head: HeadUpdate, inputs: Any, targets: Any, output: Any) -> tf.Tensor:
        loss = tf.convert_to_tensor(head.loss(inputs, targets, output))
        if loss.shape.rank != 0:
            raise ValueError(
                f"the loss of head {head.name!r} must be a scalar, got shape {loss.shape}; "
                "reduce it (e.g. tf.reduce_mean) inside the loss function"
            )
        if self._strategy is not None and getattr(head.loss, "elementwise", False):
            # A Keras Loss object in replica context already divides its batch mean by the
            # number of replicas; undo it: `distribute.replica_scale` does the scaling.
            loss = loss * tf.cast(self._strategy.num_replicas_in_sync, loss.dtype)
        return tf.cast(loss, tf.float32)

    def _objective(self, head: HeadUpdate, loss: tf.Tensor, trunk_reg: Any) -> tf.Tensor:
        total = head.weight * loss + _regularization(self._model.heads[head.name])
        return total + trunk_reg if head.trains_trunk else total

    def _when_due(self, head: HeadUpdate, step: tf.Tensor, update: Callable[[], tf.Tensor],
                  skipped: Callable[[], tf.Tensor]) -> tf.Tensor:
        if head.every == 1:
            return update()
        return tf.cond(tf.equal(step % head.every, 0), update, skipped)

    def _update_due(self, heads: Sequence[HeadUpdate], step: tf.Tensor,
                    apply: Callable[[HeadUpdate], None]) -> dict[str, tf.Tensor]:
        """Runs `apply(head)` for each of `heads` that is due at `step` (in the graph).

        Returns:
            head name -> whether it was updated.
        """
        updated = {}
        for head in heads:
            def update(head: HeadUpdate = head) -> tf.Tensor:
                apply(head)
                return tf.constant(True)

            updated[head.name] = self._when_due(head, step, update, _not_updated)
        return updated

    @_not_converted
    def _apply(self, head: HeadUpdate, objective: tf.Tensor, loss: tf.Tensor,
               tape: tf.GradientTape) -> None:
        self._apply_gradients(head, self._gradients(head, objective, tape), loss)

    @_not_converted
    def _gradients(self, head: HeadUpdate, objective: tf.Tensor,
                   tape: tf.GradientTape) -> list[tf.Tensor | None]:
        grads = tape.gradient(objective, list(head.var_list))
        if all(g is None for g in grads):
            raise ValueError(
                f"the loss of head {head.name!r} does not depend on any variable of its "
                "var_list (trunk + head): check that the loss uses the head's output"
            )
        return grads

    @_not_converted
    def _apply_gradients(self, head: HeadUpdate, grads: Sequence[tf.Tensor | None],
                         loss: tf.Tensor) -> None:
        updates.apply_gradients(head.optimizer, grads, head.var_list)
        if self._monitor:
            self._monitor.head_update(head.name, loss, grads, head.var_list, head.optimizer)

    def _head_losses(self, inputs: Any, targets: Any) -> tuple[Any, dict[str, tf.Tensor]]:
        """One forward pass (inside the caller's tape): the trunk output and each head's loss.

        A head with `trains_trunk=False` reads the trunk output through `stop_gradient`.
        """
        model = self._model
        feats = model.features(inputs, training=True)
        stopped = tf.nest.map_structure(tf.stop_gradient, feats)
        losses = {}
        for head in self._heads:
            output = model.head_output(head.name, feats if head.trains_trunk else stopped,
                                       training=True)
            losses[head.name] = self._head_loss(head, inputs, targets, output)
        return feats, losses

    def _forward(self, inputs: Any, targets: Any) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
        """One forward pass (inside the caller's tape): per-head losses and objectives."""
        _, losses = self._head_losses(inputs, targets)
        trunk_reg = _regularization(self._model.trunk)
        objectives = {h.name: self._objective(h, losses[h.name], trunk_reg) for h in self._heads}
        return losses, objectives

    def _head_forward(self, head: HeadUpdate, inputs: Any, targets: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """One head's forward pass (inside the caller's tape): its loss and objective."""
        model = self._model
        feats = model.features(inputs, training=True)
        if not head.trains_trunk:
            feats = tf.nest.map_structure(tf.stop_gradient, feats)
        output = model.head_output(head.name, feats, training=True)
        loss = self._head_loss(head, inputs, targets, output)
        return loss, self._objective(head, loss, _regularization(model.trunk))

    def _simultaneous(self, inputs: Any, targets: Any, step: tf.Tensor):
        with tf.GradientTape(persistent=True) as tape:
            losses, objectives = self._forward(inputs, targets)
        updated = self._update_due(
            self._heads, step, lambda h: self._apply(h, objectives[h.name], losses[h.name], tape))
        del tape
        return losses, updated

    def _sequential(self, inputs: Any, targets: Any, step: tf.Tensor):
        losses, updated = {}, {}
        for head in self._heads:
            def update(head: HeadUpdate = head) -> tuple[tf.Tensor, tf.Tensor]:
                with tf.GradientTape() as tape:
                    loss, objective = self._head_forward(head, inputs, targets)
                self._apply(head, objective, loss, tape)
                return loss, tf.constant(True)

            losses[head.name], updated[head.name] = self._when_due(head, step, update, _skipped)
        return losses, updated

    # -- tf.distribute: gradients in replica context, updates in cross-replica context ----

    def _replicated(self, inputs: Any, targets: Any, step: tf.Tensor):
        """The step under a strategy; `inputs`, `targets` are per-replica values."""
        if self._schedule == "simultaneous":
            return self._replicated_simultaneous(inputs, targets, step)
        return self._replicated_sequential(inputs, targets, step)

    def _replicated_simultaneous(self, inputs: Any, targets: Any, step: tf.Tensor):
        def gradients(inputs: Any, targets: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            scale = distribute.replica_scale(inputs)
            with tf.GradientTape(persistent=True) as tape:
                losses, objectives = self._forward(inputs, targets)
                scaled = {h: objective * scale for h, objective in objectives.items()}
            # Every head's gradient, due or not: an all-reduce cannot sit in a tf.cond here.
            grads = {h.name: self._gradients(h, scaled[h.name], tape) for h in self._heads}
            del tape
            return distribute.all_reduce_sum(
                ({h: loss * scale for h, loss in losses.items()}, grads))

        strategy = self._strategy
        losses, grads = distribute.first_replica(strategy, strategy.run(gradients, (inputs, targets)))
        updated = self._update_due(
            self._heads, step, lambda h: self._apply_gradients(h, grads[h.name], losses[h.name]))
        return losses, updated

    def _replicated_sequential(self, inputs: Any, targets: Any, step: tf.Tensor):
        strategy = self._strategy
        losses, updated = {}, {}
        for head in self._heads:
            def gradient(inputs: Any, targets: Any, head: HeadUpdate = head) -> Any:
                scale = distribute.replica_scale(inputs)
                with tf.GradientTape() as tape:
                    loss, objective = self._head_forward(head, inputs, targets)
                    objective = objective * scale
                return distribute.all_reduce_sum(
                    (loss * scale, self._gradients(head, objective, tape)))

            def update(head: HeadUpdate = head, gradient: Callable[..., Any] = gradient,
                       ) -> tuple[tf.Tensor, tf.Tensor]:
                # strategy.run inside a cross-replica tf.cond: the branch holds whole
                # replica functions, so their all-reduces are not inside replica control flow.
                loss, grads = distribute.first_replica(strategy, strategy.run(gradient, (inputs, targets)))
                self._apply_gradients(head, grads, loss)
                return loss, tf.constant(True)

            losses[head.name], updated[head.name] = self._when_due(head, step, update, _skipped)
        return losses, updated


def check_targets(
    targets: Any, heads: Sequence[str], needs_targets: Mapping[str, bool], strict: bool
) -> None:
    """Raises a clear error if the batch's targets do not match the heads.

    Args:
        targets: the batch's targets structure (a dict head -> labels).
        heads: the trained heads.
        needs_targets: head -> whether its loss reads `targets[head]`.
        strict: if True, a target key that is not a head is an error (no research
            loss could be reading it).
    """
    if not isinstance(targets, Mapping):
        raise TypeError(
            f"targets must be a dict of head name -> labels, got {type(targets).__name__}"
        )
    for head in heads:
        if needs_targets[head] and head not in targets:
            raise ValueError(
                f"the data has no targets for head {head!r} (its keys are {sorted(targets)})"
            )
    if strict:
        extra = sorted(k for k in targets if k not in heads)
        if extra:
            raise ValueError(
                f"the data has targets for {extra[0]!r}, but the model has no head "
                f"{extra[0]!r}; its heads are {list(heads)}"
            )
