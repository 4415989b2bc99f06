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
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, NamedTuple, Sequence

import keras
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead.core import distribute, updates
from multihead.core.model import MultiHeadModel, trunk_losses
from multihead.monitoring import tags
from multihead.monitoring.monitor import Monitor, write_scalar
from multihead.core.objectives import HeadLoss

if TYPE_CHECKING:
    from multihead.core.trunk_update import TrunkRule

SCHEDULES = ("simultaneous", "sequential")


@dataclasses.dataclass(frozen=True)
class HeadUpdate:
    """Everything the step needs about one head, resolved and validated.

    Attributes:
        weight: the head's loss weight at a step (a scalar tensor; see `LossWeight`).
        guarded: whether a non-finite loss or gradient drops the head's update.
    """

    name: str
    loss: HeadLoss
    optimizer: keras.optimizers.Optimizer
    var_list: tuple[keras.Variable, ...]
    weight: Callable[[tf.Tensor], tf.Tensor]
    every: int
    trains_trunk: bool
    guarded: bool = True


def not_converted(method: Callable[..., Any]) -> Callable[..., Any]:
    """Marks step internals that call no user code (gradients, optimizer updates) for
    autograph to leave alone: inspecting every call they make costs trace time per head.
    Forward passes stay converted: user losses may use Python control flow on tensors."""
    return tf.autograph.experimental.do_not_convert(method)


def regularization(layer: keras.layers.Layer) -> tf.Tensor | float:
    """The sum of `layer`'s regularization losses, or 0.0 if it has none."""
    losses = layer.losses
    return tf.add_n(losses) if losses else 0.0


def all_finite(loss: tf.Tensor, grads: Sequence[tf.Tensor | None]) -> tf.Tensor:
    """Whether `loss` and every gradient are finite.

    One sum per gradient (a single pass, no boolean copy): a NaN or Inf element makes
    the sum non-finite. Finite elements whose sum leaves float range count as
    non-finite too: such a gradient would not make a usable update either.
    """
    sums = [tf.reduce_sum(tf.cast(g, loss.dtype)) for g in grads if g is not None]
    return tf.math.is_finite(tf.add_n([loss] + sums) if sums else loss)


class Forward(NamedTuple):
    """One forward pass of some heads, recorded on the caller's tape.

    Attributes:
        features: the trunk output.
        losses: head -> unweighted loss (float32 scalar).
        objectives: head -> what the head's gradient is taken of: weight x loss
            (x the loss weighting's factor, for aggregated heads), plus the head's
            regularization, plus the trunk's when the head's optimizer updates the trunk.
        trunk_reg: the trunk's regularization (0.0 when it has none).
        extra: what the trunk update computed in the pass (e.g. a loss weighting's state).
    """

    features: Any
    losses: dict[str, tf.Tensor]
    objectives: dict[str, tf.Tensor]
    trunk_reg: tf.Tensor | float
    extra: Any


class HeadsDone(NamedTuple):
    """Per head (by name), as bool scalars: whether its optimizer applied an update, and
    whether a non-finite loss or gradient dropped it."""

    updated: dict[str, tf.Tensor]
    skipped: dict[str, tf.Tensor]


class StepOutput(NamedTuple):
    """What one compiled step returns, per head in head order.

    Attributes:
        step: the step counter before the step.
        losses: `(K,)` float32, NaN where the head was not evaluated.
        updated: `(K,)` bool, whether the head's optimizer applied an update.
        skipped: `(K,)` bool, whether a non-finite loss or gradient dropped it.
    """

    step: tf.Tensor
    losses: tf.Tensor
    updated: tf.Tensor
    skipped: tf.Tensor


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

    return StepsOutput(parts[0].first_step, tf.constant(total), rows("losses"), rows("updated"),
                       rows("skipped"))


class TrainStep:
    """One compiled update of the due heads: `step(inputs, targets)` or `step.run(iterator, n)`.

    The step computes every head's objective in one forward pass (`forward`) and
    hands the gradients to its trunk rule (`multihead.core.trunk_update`), which
    applies them: per head (each head's optimizer updates trunk + head) or
    aggregated (one trunk optimizer applies a combination of the heads' trunk
    gradients). Target networks given to the step are updated after the
    optimizers, inside the same compiled step.

    Args:
        model: the built model.
        heads: the heads, in order.
        schedule: `"simultaneous"` or `"sequential"` (checked by `Trainer`; trunk
            aggregation needs `"simultaneous"`, checked by `TrunkUpdate.create`).
        step: the step counter variable.
        rule: the trunk rule.
        monitor: the TensorBoard monitor, or None.
        jit_compile: XLA-compile the step.
        strategy: a `tf.distribute` strategy, or None.
        target_networks: objects whose `update()` runs after each step's updates.
    """

    def __init__(
        self,
        model: MultiHeadModel,
        heads: Sequence[HeadUpdate],
        schedule: str,
        step: tf.Variable,
        rule: TrunkRule,
        monitor: Monitor | None = None,
        jit_compile: bool = False,
        strategy: tf.distribute.Strategy | None = None,
        target_networks: Sequence[Any] = (),
        addresses: Mapping[int, str] | None = None,
    ) -> None:
        self._model = model
        self._heads = tuple(heads)
        self._schedule = schedule
        self._step = step
        self._rule = rule
        self._monitor = monitor
        self._strategy = strategy
        self._target_networks = tuple(target_networks)
        if monitor is not None and strategy is not None:
            monitor.distributed = True  # see Monitor.distributed
        if monitor is not None:  # its buffers must exist before the first trace
            monitor.bind({h.name: h.var_list for h in self._heads}, model.trunk_variables,
                         {h.name: h.optimizer for h in self._heads}, addresses=addresses)
        self.trace_count = 0
        #: Per head, in head order: steps whose update was dropped as non-finite.
        self.nonfinite_skips = tf.Variable(tf.zeros([len(self._heads)], tf.int64), trainable=False,
                                           name="nonfinite_skips")
        self._jit_compile = jit_compile
        self._concrete: dict[Hashable, Callable[..., Any]] = {}
        self._step_counts: dict[int, tf.Tensor] = {}
        # (monitored, heads, per-head batches) -> (one step, several steps), compiled lazily.
        self._variants: dict[tuple[bool, tuple[str, ...], bool], tuple[Callable[..., Any], ...]] = {}

    @property
    def head_names(self) -> tuple[str, ...]:
        """The heads, in order."""
        return tuple(h.name for h in self._heads)

    @property
    def monitor(self) -> Monitor | None:
        """The TensorBoard monitor, or None."""
        return self._monitor

    @property
    def trunk_variables(self) -> list[keras.Variable]:
        """The trunk's trainable variables."""
        return self._model.trunk_variables

    def _variant(self, monitored: bool, names: tuple[str, ...], per_head: bool = False,
                 ) -> tuple[Callable[..., Any], ...]:
        key = (monitored, names, per_head)
        if key not in self._variants:
            heads = tuple(h for h in self._heads if h.name in names)

            def body(inputs: Any, targets: Any) -> tuple[dict[str, tf.Tensor], HeadsDone]:
                return self._body(inputs, targets, monitored, heads, per_head)

            jit = self._jit_compile
            one = tf.function(lambda inputs, targets: self._single(body, inputs, targets),
                              jit_compile=jit, reduce_retracing=True)
            # XLA cannot compile the data iterator, so the loop stays plain and each step
            # in it is the same (optionally jit-compiled) function.
            step_body = tf.function(body, jit_compile=True) if jit else body
            many = tf.function(lambda iterator, max_steps: self._multi(step_body, iterator, max_steps),
                               reduce_retracing=True)
            self._variants[key] = (one, many)
        return self._variants[key]

    # -- which variant: steps that do not log run one without any monitoring op ---------
    #
    # The choice is made in Python from the step counter: in the graph, even an untaken
    # conditional costs ~10-25 us per step, reading the counter ~5-10 us per call. Under
    # a strategy every step runs the monitored variant, gated piece by piece in the
    # graph: the all-reduces must be the same on every worker, whether it monitors or not.

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

    def _one_step(self, monitored: bool, names: tuple[str, ...], inputs: Any, targets: Any,
                  per_head: bool = False) -> StepOutput:
        spec = _spec((inputs, targets))
        key = None if spec is None else ("one", monitored, names, per_head, spec)
        return self._through_concrete(self._variant(monitored, names, per_head)[0], key, inputs,
                                      targets)

    def _steps(self, monitored: bool, iterator: Any, max_steps: int, per_head: bool = False,
               ) -> StepsOutput:
        count = self._step_counts.get(max_steps)
        if count is None:
            count = self._step_counts[max_steps] = tf.constant(max_steps, tf.int32)
        key = None
        if self._strategy is None and isinstance(iterator, tf.data.Iterator):
            key = ("many", monitored, per_head, tf.type_spec_from_value(iterator))
        many = self._variant(monitored, self.head_names, per_head)[1]
        return self._through_concrete(many, key, iterator, count)

    def __call__(self, inputs: Any, targets: Any, heads: Sequence[str] | None = None,
                 per_head: bool = False) -> StepOutput:
        """One step on one batch (split across the replicas under a strategy).

        Args:
            heads: update only these heads (each distinct set is compiled once);
                None: all.
            per_head: each head has a batch of its own: `inputs` and `targets` are
                dicts head -> that head's inputs / targets (see `forward`).
        """
        names = self.head_names if heads is None else tuple(h for h in self.head_names if h in heads)
        if self._strategy is not None:
            distribute.check_not_in_scope(self._strategy)
            inputs, targets = distribute.distribute_batch(self._strategy, (inputs, targets))
        monitor = self._monitor
        monitored = monitor is not None and (monitor.distributed or monitor.logs_at(self._counter()))
        return self._one_step(monitored, names, inputs, targets, per_head)

    def run(self, iterator: Any, max_steps: int, per_head: bool = False) -> StepsOutput:
        """Up to `max_steps` steps in compiled calls, taking batches from `iterator`
        (with `per_head`, batches `({head: inputs}, {head: targets})`, see `forward`).

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
            return self._steps(monitor is not None, iterator, max_steps, per_head)
        step, left, parts = self._counter(), max_steps, []
        while left > 0:  # the counter moves only by these calls meanwhile
            logs = monitor.logs_at(step)
            n = 1 if logs else min(left, monitor.quiet_steps_from(step))
            part = self._steps(logs, iterator, n, per_head)
            parts.append(part)
            count = int(part.count)
            step, left = step + count, left - count
            if count < n:
                break  # the end of the data
        return _joined(parts, max_steps)

    def _stack(self, values: Mapping[str, tf.Tensor], dtype: tf.DType, missing: Any) -> tf.Tensor:
        return tf.stack([tf.cast(values[h.name], dtype) if h.name in values
                         else tf.constant(missing, dtype) for h in self._heads])

    def _outputs(self, losses: Mapping[str, tf.Tensor], done: HeadsDone,
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        return (self._stack(losses, tf.float32, float("nan")),
                self._stack(done.updated, tf.bool, False),
                self._stack(done.skipped, tf.bool, False))

    def _count_and_log(self, heads: Sequence[HeadUpdate], step: tf.Tensor, done: HeadsDone) -> None:
        """Counts the dropped updates; on logging steps writes each head's loss weight and
        its count of dropped updates."""
        guarded = [h for h in heads if h.guarded]
        if guarded:
            self.nonfinite_skips.assign_add(tf.cast(self._stack(done.skipped, tf.bool, False), tf.int64))
        monitor = self._monitor
        if monitor is None:
            return

        def log() -> None:
            for i, head in enumerate(self._heads):
                if head in heads:
                    write_scalar(tags.loss_weight(head.name), head.weight(step))
                    if head.guarded:
                        write_scalar(tags.nonfinite_skips(head.name), self.nonfinite_skips[i])

        monitor.when_scalars(log)

    def _single(self, body: Callable[..., Any], inputs: Any, targets: Any) -> StepOutput:
        step = self._step.read_value()
        return StepOutput(step, *self._outputs(*body(inputs, targets)))

    def _multi(self, body: Callable[..., Any], iterator: Any, max_steps: tf.Tensor) -> StepsOutput:
        first = self._step.read_value()
        k = len(self._heads)
        arrays = [tf.TensorArray(dtype, size=max_steps, element_shape=[k])
                  for dtype in (tf.float32, tf.bool, tf.bool)]
        count = tf.constant(0)
        for i in tf.range(max_steps):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            inputs, targets = batch.get_value()
            rows = self._outputs(*body(inputs, targets))
            arrays = [a.write(i, row) for a, row in zip(arrays, rows)]
            count = i + 1
        return StepsOutput(first, count, *(a.stack() for a in arrays))

    def _body(self, inputs: Any, targets: Any, monitored: bool, heads: tuple[HeadUpdate, ...],
              per_head: bool = False) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        self.trace_count += 1  # Python side effect: runs once per trace, not per step
        step = self._step.read_value()
        if self._strategy is not None:
            update = lambda: self._replicated(inputs, targets, step, heads)  # noqa: E731
        elif self._schedule == "simultaneous":
            update = lambda: self._simultaneous(inputs, targets, step, heads, per_head)  # noqa: E731
        else:
            update = lambda: self._sequential(inputs, targets, step, heads, per_head)  # noqa: E731
        if monitored:
            def update_and_log() -> tuple[dict[str, tf.Tensor], HeadsDone]:
                gate_weights = getattr(self._model.trunk, "gate_weights", None)
                if gate_weights is not None and self._strategy is None and not per_head:
                    # before the updates; with per-head batches the gates see no one batch
                    self._monitor.gates(lambda: gate_weights(inputs, training=True))
                out = update()
                self._count_and_log(heads, step, out[1])
                return out

            result = self._monitor.monitored(step, update_and_log)
        elif self._monitor is not None:
            with tf.summary.record_if(False):  # summaries written by user code: not this step
                result = update()
        else:
            result = update()
        if not monitored:
            self._count_and_log(heads, step, result[1])
        for target in self._target_networks:
            target.update()
        self._step.assign_add(1)
        return result

    # -- the forward pass: every head's objective, one code path -------------------------

    def _head_loss(self, head: HeadUpdate, inputs: Any, targets: Any, output: Any) -> tf.Tensor:
        loss = tf.convert_to_tensor(head.loss(inputs, targets, output, training=True))
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

    def forward(self, inputs: Any, targets: Any, heads: Sequence[HeadUpdate], step: tf.Tensor,
                per_head: bool = False) -> Forward:
        """One forward pass of `heads` (inside the caller's tape).

        A head with `trains_trunk=False` reads the trunk output through `stop_gradient`
        (a trunk that routes heads: see `MultiHeadModel.stop_shared`).
        With `per_head`, `inputs` and `targets` are dicts head -> that head's own batch:
        the trunk runs once per head, on the head's batch, and `Forward.features` is
        the dict head -> trunk output.
        """
        model = self._model
        if per_head:
            features = {h.name: model.features(inputs[h.name], training=True) for h in heads}
            stopped = {name: model.stop_shared(f) for name, f in features.items()}
        else:
            features = model.features(inputs, training=True)
            stopped = model.stop_shared(features)
        losses, weighted = {}, {}
        for head in heads:
            seen = features if head.trains_trunk else stopped
            x, y = inputs, targets
            if per_head:
                x, y, seen = x[head.name], y[head.name], seen[head.name]
            output = model.head_output(head.name, seen, training=True)
            losses[head.name] = self._head_loss(head, x, y, output)
            weighted[head.name] = head.weight(step) * losses[head.name]
        # A routing trunk's per-head layers (gates) regularize their own head's objective.
        shared_losses, owned_losses = trunk_losses(model.trunk)
        trunk_reg = tf.add_n(shared_losses) if shared_losses else 0.0
        scales, extra = self._rule.weigh(weighted)
        objectives = {}
        for head in heads:
            objective = weighted[head.name]
            if head.name in scales:
                objective = objective * scales[head.name]
            objective = objective + regularization(model.heads[head.name])
            if owned_losses.get(head.name):
                objective = objective + tf.add_n(owned_losses[head.name])
            if head.trains_trunk and self._rule.per_head:
                objective = objective + trunk_reg
            objectives[head.name] = objective
        return Forward(features, losses, objectives, trunk_reg, extra)

    @not_converted
    def gradients(self, head: HeadUpdate, objective: tf.Tensor, tape: tf.GradientTape,
                  sources: Sequence[Any], trunk_sources: int = 0) -> list[tf.Tensor | None]:
        """The gradient of a head's objective with respect to `sources`, whose first
        `trunk_sources` are the trunk's (variables or output) when the trunk rule
        aggregates the head's trunk gradient."""
        grads = tape.gradient(objective, list(sources))
        if trunk_sources and all(g is None for g in grads[:trunk_sources]):
            raise ValueError(
                f"the loss of head {head.name!r} does not depend on the trunk: check that the "
                "loss uses the head's output, or set trains_trunk=False for this head")
        if all(g is None for g in grads):
            raise ValueError(
                f"the loss of head {head.name!r} does not depend on any variable of its "
                "var_list: check that the loss uses the head's output")
        return grads

    @not_converted
    def apply_head(self, head: HeadUpdate, grads: Sequence[tf.Tensor | None],
                   variables: Sequence[keras.Variable], loss: tf.Tensor) -> None:
        """Head `head`'s optimizer applies `grads` to `variables` (monitored)."""
        updates.apply_gradients(head.optimizer, grads, variables)
        if self._monitor:
            self._monitor.head_update(head.name, loss, grads, variables, head.optimizer)

    def when_due(self, head: HeadUpdate, step: tf.Tensor,
                 update: Callable[[], tuple[tf.Tensor, tf.Tensor]]) -> tuple[tf.Tensor, tf.Tensor]:
        """`update()` -> (updated, skipped) on the steps where `head` is due."""
        if head.every == 1:
            return update()
        return tf.cond(tf.equal(step % head.every, 0), update,
                       lambda: (tf.constant(False), tf.constant(False)))

    def guarded(self, head: HeadUpdate, finite: tf.Tensor, apply: Callable[[], None],
                ) -> tuple[tf.Tensor, tf.Tensor]:
        """`apply()` unless the head is guarded and `finite` is False -> (updated, skipped)."""
        if not head.guarded:
            apply()
            return tf.constant(True), tf.constant(False)

        def applied() -> tf.Tensor:
            apply()
            return tf.constant(True)

        graph = tf.compat.v1.get_default_graph()
        start = len(graph.get_operations())
        updated = tf.cond(finite, applied, lambda: tf.constant(False))
        if self._strategy is None:
            # A lowered cond puts a Switch on every tensor the update reads; kept as a
            # function call, the branch runs as one op.
            for op in graph.get_operations()[start:]:
                if op.type in ("If", "StatelessIf"):
                    internals.keep_cond_functional(op)
        return updated, tf.logical_not(finite)

    # -- schedules --------------------------------------------------------------------

    def _simultaneous(self, inputs: Any, targets: Any, step: tf.Tensor,
                      heads: tuple[HeadUpdate, ...], per_head: bool = False,
                      ) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        with tf.GradientTape(persistent=True) as tape:
            fwd = self.forward(inputs, targets, heads, step, per_head)
        done = self._rule.apply(self, heads, fwd, step, tape=tape)
        del tape
        return fwd.losses, done

    def _sequential(self, inputs: Any, targets: Any, step: tf.Tensor,
                    heads: tuple[HeadUpdate, ...], per_head: bool = False,
                    ) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        def one_head(head: HeadUpdate) -> tuple[dict[str, tf.Tensor], HeadsDone]:
            with tf.GradientTape() as tape:
                fwd = self.forward(inputs, targets, (head,), step, per_head)
            return fwd.losses, self._rule.apply(self, (head,), fwd, step, tape=tape, due=False)

        return self._one_after_another(heads, step, one_head)

    def _one_after_another(self, heads: Sequence[HeadUpdate], step: tf.Tensor,
                           one_head: Callable[[HeadUpdate], tuple[dict[str, tf.Tensor], HeadsDone]],
                           ) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        """The sequential schedule: `one_head(head)` (a forward pass and update of that head
        alone) for each head, in order, on the steps where it is due."""
        losses, updated, skipped = {}, {}, {}
        for head in heads:
            def update(head: HeadUpdate = head) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
                head_losses, done = one_head(head)
                return head_losses[head.name], done.updated[head.name], done.skipped[head.name]

            if head.every == 1:
                out = update()
            else:
                out = tf.cond(tf.equal(step % head.every, 0), update,
                              lambda: (tf.constant(float("nan")), tf.constant(False),
                                       tf.constant(False)))
            losses[head.name], updated[head.name], skipped[head.name] = out
        return losses, HeadsDone(updated, skipped)

    # -- tf.distribute: gradients in replica context, updates in cross-replica context ----

    def _replicated(self, inputs: Any, targets: Any, step: tf.Tensor,
                    heads: tuple[HeadUpdate, ...]) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        """The step under a strategy; `inputs`, `targets` are per-replica values."""
        if self._schedule == "simultaneous":
            return self._replicated_pass(inputs, targets, step, heads)
        # strategy.run inside a cross-replica tf.cond: the branch holds whole replica
        # functions, so their all-reduces are not inside replica control flow.
        return self._one_after_another(
            heads, step, lambda head: self._replicated_pass(inputs, targets, step, (head,), due=False))

    def _replicated_pass(self, inputs: Any, targets: Any, step: tf.Tensor,
                         heads: tuple[HeadUpdate, ...], due: bool = True,
                         ) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        """One forward pass of `heads` on every replica, every head's gradient all-reduced
        in replica context (an all-reduce cannot sit in a tf.cond there), then the trunk
        rule applies them in cross-replica context."""
        def gradients(inputs: Any, targets: Any) -> Any:
            scale = distribute.replica_scale(inputs)
            with tf.GradientTape(persistent=True) as tape:
                fwd = self.forward(inputs, targets, heads, step)
                scaled = {h: objective * scale for h, objective in fwd.objectives.items()}
                trunk_reg = fwd.trunk_reg * scale
            grads = self._rule.replica_gradients(self, heads, scaled, trunk_reg, tape)
            del tape
            return distribute.all_reduce_sum(
                ({h: loss * scale for h, loss in fwd.losses.items()}, grads))

        strategy = self._strategy
        losses, grads = distribute.first_replica(strategy, strategy.run(gradients, (inputs, targets)))
        return losses, self._rule.apply(self, heads, Forward(None, losses, {}, 0.0, None), step,
                                        grads=grads, due=due)


def check_targets(
    targets: Any, heads: Sequence[str], needs_targets: Mapping[str, bool], strict: bool,
    required: Sequence[str] | None = None,
) -> None:
    """Raises a clear error if the batch's targets do not match the heads.

    Args:
        targets: the batch's targets structure (a dict head -> labels).
        heads: the trained heads.
        needs_targets: head -> whether its loss reads `targets[head]`.
        strict: if True, a target key that is not a head is an error (no research
            loss could be reading it).
        required: the heads this batch trains (None: all of `heads`).
    """
    if not isinstance(targets, Mapping):
        raise TypeError(
            f"targets must be a dict of head name -> labels, got {type(targets).__name__}"
        )
    for head in heads if required is None else required:
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
