"""The train step: per-head gradients, planned by a trunk rule, applied by one applier.

Two schedules:

* `simultaneous`: one forward pass; every due head's gradient is taken at the
  same parameters (one persistent tape), then each head's optimizer applies its
  own, in head order. This is the well-defined version of TF1's
  `sess.run([train_op_1, train_op_2])`.
* `sequential`: heads update one after another, each with its own forward pass
  at the parameters the previous head left.

A head with `every=n` is due only on steps where `step % n == 0` (and, as every head,
only while it is not frozen and has a label in the batch: `due_heads`); the tests are
made in the graph on the step variable, so mixed cadences never retrace the step.

The step's math is here: the schedules and the distributed pass; the forward pass
is `multihead.step.forward`'s. What the heads' gradients become is the trunk rule's plan
(`multihead.step.trunk_rule`); every optimizer write is the applier's
(`multihead.step.applier`); compiling the step, one step or many per call, is
`multihead.step.compiled`'s.

With TensorBoard monitoring, the step is compiled in two variants, one that measures
(it returns its statistics, which the monitor writes after the call) and one without a
single monitoring op, and each call picks one in Python from the step counter (see
`multihead.monitoring.monitor`).

With a `tf.distribute` strategy, gradients are taken and all-reduced in replica
context and applied in cross-replica context (see `multihead.step.distribute`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Mapping, Sequence

import keras
import tensorflow as tf

from multihead.step import distribute
from multihead.step.affinity import TaskAffinity
from multihead.step.applier import (
    Applier,
    HeadsDone,
    PlannedUpdate,
    all_finite,
    stack_done,
    write_state,
)
from multihead.step.compiled import StepLoops, StepOutput, StepsOutput, split_at_logging_steps
from multihead.step.forward import Forward, ForwardPass
from multihead.step.freezing import FrozenHeads
from multihead.step.loss_scales import LossScales
from multihead.step.options import SCHEDULES, StepOptions
from multihead.model.model_view import HeadsModel
from multihead.step.trunk_rule import (
    Backward,
    StepObjective,
    HeadsPass,
    LossFactors,
    TrunkRule,
)
from multihead.monitoring import step_stats, tags
from multihead.monitoring.monitor import Monitor
from multihead.monitoring.step_stats import StepStats

__all__ = ["SCHEDULES", "Forward", "StepObjective", "HeadsDone", "PlannedUpdate", "StepOutput",
           "StepsOutput", "TrainStep", "all_finite"]

class TrainStep:
    """One compiled update of the due heads: `step(inputs, targets)` or `step.run(iterator, n)`.

    The step computes every head's objective in one forward pass (`forward`),
    hands the heads' losses and gradients to its trunk rule, whose planned updates
    its applier applies: per head (each head's optimizer updates trunk + head) or
    aggregated (one trunk optimizer applies a combination of the heads' trunk
    gradients). Target networks given to the step are updated after the
    optimizers, inside the same compiled step.

    Args:
        model: the built model.
        heads: the heads, in order.
        options: how the step runs (its schedule; trunk aggregation needs
            `"simultaneous"`, checked by `AggregatedRule.create`), handed on whole to the
            compiled loops and the applier.
        step: the step counter variable.
        rule: the trunk rule.
        monitor: the TensorBoard monitor, bound to the heads' variables before (its
            buffers must exist before the first trace: `StepAssembly.build`), or None.
        strategy: a `tf.distribute` strategy, or None.
        target_networks: objects whose `update()` runs after each step's updates.
        frozen: the heads' freeze flags, read in the step (a frozen head is never due:
            see `multihead.step.freezing`) and, when the trunk rule needs it, on the
            host to pick the variant without the frozen heads (`TrunkRule.step_heads`);
            None: no head is ever frozen.
        loss_scales: each head's dynamic loss scale (float16): a head's objective is
            scaled in `forward`, its gradient unscaled by the applier; None: none.
        affinity: computes the inter-task affinities the monitor writes on its affinity
            steps, before the updates (`multihead.step.affinity`), or None.
    """

    def __init__(self, model: HeadsModel, heads: Sequence[StepObjective], options: StepOptions,
                 step: tf.Variable, rule: TrunkRule, monitor: Monitor | None = None,
                 strategy: tf.distribute.Strategy | None = None, target_networks: Sequence[Any] = (),
                 frozen: FrozenHeads | None = None, loss_scales: LossScales | None = None,
                 affinity: TaskAffinity | None = None) -> None:
        self._model = model
        self._affinity = affinity
        self._loss_scales = loss_scales
        self._frozen = frozen
        self._heads = tuple(heads)
        self._schedule = options.schedule
        self._step = step
        self._rule = rule
        self._monitor = monitor
        self._strategy = strategy
        self._target_networks = tuple(target_networks)
        self._forward = ForwardPass(model, rule, strategy, loss_scales)
        self._applier = Applier(monitor, options, distributed=strategy is not None,
                                loss_scales=loss_scales)
        self.trace_count = 0
        #: Per head, in head order: steps whose update was dropped as non-finite.
        self.nonfinite_skips = tf.Variable(tf.zeros([len(self._heads)], tf.int64), trainable=False,
                                           name="nonfinite_skips")
        #: Per head, in head order: due steps skipped because no row of the batch had a label.
        self.missing_label_skips = tf.Variable(tf.zeros([len(self._heads)], tf.int64),
                                               trainable=False, name="missing_label_skips")
        #: The compiled variants, keyed (monitored, heads, own batches).
        self.loops = StepLoops(self._body_for, step, len(self._heads), options)

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

    # -- which variant: steps that do not log run one without any monitoring op ---------
    #
    # The choice is made in Python from the step counter: in the graph, even an untaken
    # conditional costs time on every step. Under a strategy every step runs the
    # monitored variant, gated piece by piece in the graph: the all-reduces must be the
    # same on every worker, whether it monitors or not.

    def _counter(self) -> int:
        # The raw op: cheaper in Python than `Variable.numpy()` on every call.
        return int(tf.raw_ops.ReadVariableOp(resource=self._step.handle, dtype=self._step.dtype))

    def __call__(self, inputs: Any, targets: Any, heads: Sequence[str] | None = None,
                 own_batches: bool = False) -> StepOutput:
        """One step on one batch (split across the replicas under a strategy).

        Args:
            heads: update only these heads (each distinct set is compiled once);
                None: all.
            own_batches: each head has a batch of its own: `inputs` and `targets` are
                dicts head -> that head's inputs / targets (see `forward`).
        """
        names = self._variant_heads(heads)
        if self._strategy is not None:
            distribute.check_not_in_scope(self._strategy)
            inputs, targets = distribute.distribute_batch(self._strategy, (inputs, targets))
        monitor = self._monitor
        logs = monitor is not None and monitor.logs_at(self._counter())
        return self._one((self._measures(logs), names, own_batches), inputs, targets, logs)

    def _measures(self, logs: bool) -> bool:
        """Whether a step runs the variant that measures: on logging steps, and under a
        strategy on every step (its all-reduces must be the same ops on every worker,
        logging or not; each piece is gated in the graph)."""
        return self._monitor is not None and (logs or self._strategy is not None)

    def _one(self, key: Hashable, inputs: Any, targets: Any, logs: bool) -> StepOutput:
        """One compiled step of variant `key`; on a logging step its statistics written."""
        output = self.loops.one(key, inputs, targets)
        if logs:
            self._monitor.write_stats(int(output.step) + 1, output.stats)
        return output

    def _variant_heads(self, heads: Sequence[str] | None) -> tuple[str, ...]:
        """The heads of the variant a step of `heads` (None: all) runs: with frozen heads
        the trunk rule may need a variant without them (`TrunkRule.step_heads`)."""
        names = self.head_names if heads is None else tuple(h for h in self.head_names if h in heads)
        if self._frozen is None:
            return names
        return self._rule.step_heads(names, self._frozen.names)

    def run(self, iterator: Any, max_steps: int, own_batches: bool = False,
            heads: Sequence[str] | None = None) -> StepsOutput:
        """Up to `max_steps` steps in compiled calls, taking batches from `iterator`
        (with `own_batches`, batches `({head: inputs}, {head: targets})`, see `forward`);
        `heads` as in `__call__`.

        One call, or, with a monitor, one per stretch of steps that do not log
        plus one per logging step. Fewer steps are run if the iterator is
        exhausted first (the end of an epoch); `StepsOutput.count` says how many.
        `every` schedules are decided per step in the graph, exactly as with
        single steps. Under a strategy, `iterator` iterates a distributed dataset.
        """
        if self._strategy is not None:
            distribute.check_not_in_scope(self._strategy)
        monitor = self._monitor
        cacheable = self._strategy is None
        names = self._variant_heads(heads)

        def part(logs: bool, n: int) -> StepsOutput:
            key = (self._measures(logs), names, own_batches)
            if logs:  # one step, its batch taken here: its statistics leave the call
                return self._one_from(key, iterator)
            return self.loops.many(key, iterator, n, cacheable)

        if monitor is None:
            return part(False, max_steps)
        return split_at_logging_steps(part, self._counter(), max_steps, monitor.logs_at,
                                      monitor.quiet_steps_from)

    def _one_from(self, key: Hashable, iterator: Any) -> StepsOutput:
        """One logging step on the next batch of `iterator`, as a `StepsOutput` of one row
        (none at the end of the data)."""
        batch = iterator.get_next_as_optional()
        if not bool(batch.has_value()):
            k = len(self._heads)
            return StepsOutput(self._step.read_value(), tf.constant(0), tf.zeros([1, k]),
                               tf.zeros([1, k], tf.bool), tf.zeros([1, k], tf.bool))
        inputs, targets = batch.get_value()
        out = self._one(key, inputs, targets, logs=True)
        return StepsOutput(out.step, tf.constant(1), out.losses[None], out.updated[None],
                           out.skipped[None])

    # -- the step body: a plain function of its inputs, compiled by `loops` ---------------

    def _body_for(self, key: Hashable) -> Callable[[Any, Any], tuple[Any, ...]]:
        measures, names, own_batches = key
        heads = tuple(h for h in self._heads if h.name in names)

        def body(inputs: Any, targets: Any) -> tuple[Any, ...]:
            losses, done, stats = self._body(inputs, targets, measures, heads, own_batches)
            order = self.head_names
            rows = (stack_done(order, losses, tf.float32, float("nan")),
                    stack_done(order, done.updated, tf.bool, False),
                    stack_done(order, done.skipped, tf.bool, False))
            return rows if stats is None else (*rows, stats.outputs())

        return body

    def _scalars(self, step: tf.Tensor | None) -> list[tuple[str, str, Callable[[], Any]]]:
        """(head, tag, value) of every scalar the step itself measures on logging steps (the
        trunk rule's aside): the one list `summary_tags` reads and `_count_and_log` records."""
        out: list[tuple[str, str, Callable[[], Any]]] = []
        for i, head in enumerate(self._heads):
            name = head.name
            out.append((name, tags.loss_weight(name), lambda head=head: head.weight(step)))
            if head.guarded:
                out.append((name, tags.nonfinite_skips(name), lambda i=i: self.nonfinite_skips[i]))
            if head.missing_label is not None:
                out.append((name, tags.missing_label_skips(name), lambda i=i: self.missing_label_skips[i]))
            if self._loss_scales is not None:
                out.append((name, tags.loss_scale(name), lambda name=name: self._loss_scales.scales[name]))
        return out

    def summary_tags(self) -> list[str]:
        """The scalar tags the step writes into the train run on logging steps."""
        return [tag for _, tag, _ in self._scalars(None)]

    def _count_and_log(self, heads: Sequence[StepObjective], step: tf.Tensor, done: HeadsDone,
                       stats: StepStats | None) -> None:
        """Counts the dropped updates; in a step that measures, records the step's scalars
        of `heads` (`_scalars`)."""
        guarded = [h for h in heads if h.guarded]
        if guarded:
            write_state([(self.nonfinite_skips, self.nonfinite_skips + tf.cast(
                stack_done(self.head_names, done.skipped, tf.bool, False), tf.int64))])
        if stats is not None:
            names = {h.name for h in heads}
            self._monitor.scalars(stats, [(tag, value) for head, tag, value in self._scalars(step)
                                          if head in names])

    def _body(self, inputs: Any, targets: Any, measures: bool, heads: tuple[StepObjective, ...],
              own_batches: bool = False,
              ) -> tuple[dict[str, tf.Tensor], HeadsDone, StepStats | None]:
        self.trace_count += 1  # Python side effect: runs once per trace, not per step
        step = self._step.read_value()
        stats = None
        if measures:
            stats = self._monitor.start(step, functional=self._strategy is None)
            gate_weights = getattr(self._model.trunk, "gate_weights", None)
            if gate_weights is not None and self._strategy is None and not own_batches:
                # before the updates; with own batches the gates see no one batch
                self._monitor.gates(stats, lambda: gate_weights(inputs, training=True))
            if self._affinity is not None:  # before the updates, at the same parameters
                self._monitor.affinity(
                    stats, lambda: self._affinity(inputs, targets, heads, step, own_batches))
        with self._monitor.user_summaries(stats) if self._monitor else contextlib.nullcontext():
            if self._strategy is not None:
                losses, done = self._replicated(inputs, targets, step, heads, stats)
            elif self._schedule == "simultaneous":
                losses, done = self._simultaneous(inputs, targets, step, heads, own_batches, stats)
            else:
                losses, done = self._sequential(inputs, targets, step, heads, own_batches, stats)
        self._count_and_log(heads, step, done, stats)
        for target in self._target_networks:
            target.update()
        write_state([(self._step, step + 1)])
        return losses, done, stats

    # -- the forward pass: every head's objective, one code path -------------------------

    def forward(self, inputs: Any, targets: Any, heads: Sequence[StepObjective], step: tf.Tensor,
                own_batches: bool = False) -> Forward:
        """One forward pass of `heads` (inside the caller's tape; see
        `multihead.step.forward.ForwardPass`)."""
        return self._forward(inputs, targets, heads, step, own_batches)

    def _pass(self, heads: tuple[StepObjective, ...], losses: dict[str, tf.Tensor], step: tf.Tensor,
              fwd: Forward | None = None, tape: tf.GradientTape | None = None,
              given: Any = None, counts: Mapping[str, tf.Tensor] | None = None,
              stats: StepStats | None = None) -> HeadsPass:
        """What the trunk rule plans from: `fwd` on `tape` (one device) or `given`
        gradients and `counts` of present labels (all-reduced under a strategy)."""
        counts = fwd.counts if fwd is not None else counts
        return HeadsPass(
            heads=heads, losses=losses, step=step,
            trunk_variables=tuple(self._model.trunk_variables),
            backward=None if tape is None else Backward(tape, fwd.objectives),
            given=given,
            features=None if fwd is None else fwd.features,
            trunk_reg=0.0 if fwd is None else fwd.trunk_reg,
            loss_factors=fwd.loss_factors if fwd is not None else LossFactors({}),
            # None in the variant that does not log: its rule needs no per-head statistics
            stats=stats,
            due=self._due(heads, counts or {}, step))

    def _due(self, heads: tuple[StepObjective, ...], counts: Mapping[str, tf.Tensor],
                     step: tf.Tensor) -> dict[str, tf.Tensor] | None:
        """`due_heads`; counts the heads whose cadence says so, unfrozen and without a
        label, in `missing_label_skips`."""
        unfrozen = None if self._frozen is None else self._frozen.unfrozen()
        due, unlabelled = due_heads(heads, counts, step, unfrozen)
        if unlabelled:
            write_state([(self.missing_label_skips, self.missing_label_skips + tf.cast(
                stack_done(self.head_names, unlabelled, tf.bool, False), tf.int64))])
        return due or None

    # -- schedules --------------------------------------------------------------------

    def _simultaneous(self, inputs: Any, targets: Any, step: tf.Tensor,
                      heads: tuple[StepObjective, ...], own_batches: bool = False,
                      stats: StepStats | None = None) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        with tf.GradientTape(persistent=True) as tape:
            fwd = self.forward(inputs, targets, heads, step, own_batches)
        plans = self._rule.plan(self._pass(heads, fwd.losses, step, fwd, tape, stats=stats))
        done = self._applier.apply_all(plans, step, stats=stats)
        del tape
        return fwd.losses, done

    def _sequential(self, inputs: Any, targets: Any, step: tf.Tensor,
                    heads: tuple[StepObjective, ...], own_batches: bool = False,
                    stats: StepStats | None = None) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        def one_head(head: StepObjective) -> tuple[dict[str, tf.Tensor], HeadsDone]:
            with tf.GradientTape() as tape:
                fwd = self.forward(inputs, targets, (head,), step, own_batches)
            plans = self._rule.plan(self._pass((head,), fwd.losses, step, fwd, tape, stats=stats))
            return fwd.losses, self._applier.apply_all(plans, step, cadence_decided=True, stats=stats)

        return _one_after_another(heads, step, one_head, stats)

    # -- tf.distribute: gradients in replica context, updates in cross-replica context ----

    def _replicated(self, inputs: Any, targets: Any, step: tf.Tensor,
                    heads: tuple[StepObjective, ...], stats: StepStats | None = None,
                    ) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        """The step under a strategy; `inputs`, `targets` are per-replica values."""
        if self._schedule == "simultaneous":
            return self._replicated_pass(inputs, targets, step, heads, stats=stats)
        # strategy.run inside a cross-replica tf.cond: the branch holds whole replica
        # functions, so their all-reduces are not inside replica control flow.
        return _one_after_another(
            heads, step,
            lambda head: self._replicated_pass(inputs, targets, step, (head,), True, stats),
            stats)

    def _replicated_pass(self, inputs: Any, targets: Any, step: tf.Tensor,
                         heads: tuple[StepObjective, ...], cadence_decided: bool = False,
                         stats: StepStats | None = None,
                         ) -> tuple[dict[str, tf.Tensor], HeadsDone]:
        """One forward pass of `heads` on every replica, every head's gradient all-reduced
        in replica context (an all-reduce cannot sit in a tf.cond there), then the trunk
        rule's plans applied in cross-replica context."""
        def gradients(inputs: Any, targets: Any) -> Any:
            scale = distribute.replica_share(inputs)
            with tf.GradientTape(persistent=True) as tape:
                fwd = self.forward(inputs, targets, heads, step)
                # A loss that is a mean over present labels: scaled by this replica's share.
                scales = {h: distribute.count_share(c) for h, c in fwd.counts.items()}
                scaled = {h: objective * scales.get(h, scale)
                          for h, objective in fwd.objectives.items()}
                trunk_reg = fwd.trunk_reg * scale
            grads = self._rule.replica_gradients(heads, Backward(tape, scaled), trunk_reg,
                                                 self._model.trunk_variables)
            del tape
            return distribute.all_reduce_sum(
                ({h: loss * scales.get(h, scale) for h, loss in fwd.losses.items()}, grads,
                 fwd.counts))

        strategy = self._strategy
        losses, grads, counts = distribute.first_replica(
            strategy, strategy.run(gradients, (inputs, targets)))
        plans = self._rule.plan(self._pass(heads, losses, step, given=grads, counts=counts,
                                           stats=stats))
        return losses, self._applier.apply_all(plans, step, cadence_decided, stats)


def due_heads(heads: Sequence[StepObjective], counts: Mapping[str, tf.Tensor], step: tf.Tensor,
              unfrozen: Mapping[str, tf.Tensor] | None,
              ) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
    """Head -> whether its update is due this step besides its cadence (`unfrozen`, and with
    a present label when it has a missing-label marker: `counts`), for the heads that may not
    be; and head -> whether its cadence says so while it is unfrozen and without a label."""
    due, unlabelled = {}, {}
    for head in heads:
        is_due = None if unfrozen is None else unfrozen[head.name]
        if head.name in counts:
            labelled = counts[head.name] > 0
            missed = tf.logical_not(labelled)
            if head.every != 1:
                missed = tf.logical_and(missed, tf.equal(step % head.every, 0))
            unlabelled[head.name] = missed if is_due is None else tf.logical_and(missed, is_due)
            is_due = labelled if is_due is None else tf.logical_and(is_due, labelled)
        if is_due is not None:
            due[head.name] = is_due
    return due, unlabelled


def _one_after_another(heads: Sequence[StepObjective], step: tf.Tensor,
                       one_head: Callable[[StepObjective], tuple[dict[str, tf.Tensor], HeadsDone]],
                       stats: StepStats | None = None) -> tuple[dict[str, tf.Tensor], HeadsDone]:
    """The sequential schedule: `one_head(head)` (a forward pass and update of that head
    alone) for each head, in order, on the steps where it is due."""
    losses, updated, skipped = {}, {}, {}
    for head in heads:
        def update(head: StepObjective = head) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            head_losses, done = one_head(head)
            return head_losses[head.name], done.updated[head.name], done.skipped[head.name]

        if head.every == 1:
            out = update()
        else:
            out = step_stats.cond(stats, tf.equal(step % head.every, 0), update,
                                  lambda: (tf.constant(float("nan")), tf.constant(False),
                                           tf.constant(False)))
        losses[head.name], updated[head.name], skipped[head.name] = out
    return losses, HeadsDone(updated, skipped)
