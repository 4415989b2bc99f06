"""The one place a train step writes variables: through an optimizer, and its state.

A trunk rule (`multihead.step.trunk_rule.TrunkRule`) turns the heads' gradients
into `PlannedUpdate`s, the heads' and the trunk's; `Applier.apply_all` applies
them in order. Everything that decides whether an update happens and what it
reports sits here, once. One word says an update happens this step: it is *due*, when

* its head's cadence says so (`every=n`: steps where `step % n == 0`, decided in the graph),
* and the pass and the rule say so (`PlannedUpdate.due`: the head is not frozen and has a
  present label in its batch, `HeadsPass.due`; or a condition of the rule's own, e.g. the
  trunk update of an aggregate that lost two heads to non-finite gradients).

A due update is then carried out unless:

* the non-finite guard drops it: a guarded update whose loss or gradient is not finite is
  *skipped* (reported per head);
* its head's dynamic loss scale (float16) overflowed: its gradient is unscaled before the
  guard reads it, an overflowing head is dropped as a non-finite one, and its scale is
  updated (`multihead.step.loss_scales`).

In a step that measures, what each head's update did (loss, gradient norms, histograms:
`multihead.monitoring.head_updates`) is measured around the update and taken out of these
conditionals (`multihead.monitoring.step_stats`).

Like optax's `apply_updates`, the applier computes nothing about *what* the
update is: the rule decides that.

The step's other state (an aggregator's and a loss weighting's, the loss scales, the
step's counters, the target networks' copies) is computed by its owner as new values,
`StateWrites`, and written here (`write_state`), where the update it belongs to happens:
the aggregator state a trunk plan's gradients come with (`WithState`) when the trunk
update is applied, a head's loss scale after its guarded update.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

import keras
import tensorflow as tf

from multihead._autograph import plain
from multihead.aggregation.loss_weighting import StateWrites
from multihead.step import adam_sgd_ops
from multihead.step.loss_scales import LossScales
from multihead.step.options import StepOptions
from multihead.monitoring import step_stats
from multihead.monitoring.monitor import Monitor
from multihead.monitoring.step_stats import StepStats

Gradients = Sequence[Union[tf.Tensor, tf.IndexedSlices, None]]


def write_state(writes: StateWrites | None) -> None:
    """Writes each variable's new value, in order: the one place a step assigns state.
    None writes nothing (a user's loss weighting whose `update` assigned its own state)."""
    for variable, value in writes or ():
        variable.assign(value)


class WithState(NamedTuple):
    """What a plan's delayed gradient function may return: the gradients, and the state
    written with the update they make (e.g. the aggregator state of the aggregate the
    trunk's gradients are), written where the gradients are taken."""

    gradients: Gradients
    writes: StateWrites


def not_converted(method: Callable[..., Any]) -> Callable[..., Any]:
    """Marks step internals that call no user code (gradients, optimizer updates) for
    autograph to leave alone: inspecting every call they make costs trace time per head.
    Forward passes stay converted: user losses may use Python control flow on tensors."""
    return plain(method)


def all_finite(loss: tf.Tensor, grads: Gradients) -> tf.Tensor:
    """Whether `loss` and every gradient are finite.

    One sum per gradient (a single pass, no boolean copy): a NaN or Inf element makes
    the sum non-finite. Finite elements whose sum leaves float range count as
    non-finite too: such a gradient would not make a usable update either.
    """
    sums = [tf.reduce_sum(tf.cast(g, loss.dtype)) for g in grads if g is not None]
    return tf.math.is_finite(tf.add_n([loss] + sums) if sums else loss)


class _PlannedFields(NamedTuple):
    """The fields of `PlannedUpdate`, whose docstring says what each is."""

    optimizer: keras.optimizers.Optimizer
    gradients: Gradients | Callable[[], Gradients | WithState]
    variables: Sequence[keras.Variable]
    head: str | None = None
    guarded: bool = False
    loss: tf.Tensor | None = None
    finite: tf.Tensor | None = None
    every: int = 1
    due: tf.Tensor | None = None


class PlannedUpdate(_PlannedFields):
    """One optimizer update a trunk rule plans; only `Applier` carries it out.

    Attributes:
        optimizer: the optimizer that applies it (built on a superset of `variables`).
        gradients: one gradient per variable (None: no dependence), or a function
            returning them (or `WithState`), called only where the update happens (a
            head that is not due takes no gradient).
        variables: the variables written.
        head: the head whose update this is (reported in `HeadsDone`, monitored);
            None for an update of no single head (the trunk's own optimizer).
        guarded: drop the update when `loss` or the gradients are not finite.
        loss: the head's loss (checked by the guard, logged by the monitor).
        finite: the guard's verdict when the rule computed it already (e.g. over the
            head's whole gradient, trunk part included, of which `gradients` is the
            head's own part); None: the applier checks `loss` and `gradients`.
        every: the head's cadence: due only on steps where `step % every == 0`.
        due: whether the update is due this step besides its cadence (a bool scalar:
            e.g. `HeadsPass.is_due(head)`, or a condition of the rule's own); None: it is.
    """

    __slots__ = ()

    def __new__(cls, *args: Any, when: tf.Tensor | None = None, **kwargs: Any) -> PlannedUpdate:
        if when is not None:  # the former name of `due`
            kwargs["due"] = when
        return super().__new__(cls, *args, **kwargs)

    @property
    def when(self) -> tf.Tensor | None:
        """Former name of `due`."""
        return self.due


def take_gradients(plan: PlannedUpdate) -> Gradients:
    """`plan`'s gradients, taken now (call it only where the update happens), with the state
    they come with (`WithState`) written."""
    grads = plan.gradients() if callable(plan.gradients) else plan.gradients
    if isinstance(grads, WithState):
        write_state(grads.writes)
        grads = grads.gradients
    return grads


class HeadsDone(NamedTuple):
    """Per head (by name), as bool scalars: whether its optimizer applied an update, and
    whether a non-finite loss or gradient dropped it."""

    updated: dict[str, tf.Tensor]
    skipped: dict[str, tf.Tensor]


def _not_done() -> tuple[tf.Tensor, tf.Tensor]:
    return tf.constant(False), tf.constant(False)


class Applier:
    """Applies planned updates: the due ones, through the non-finite guard, measured.

    Args:
        monitor: the TensorBoard monitor (its `updates` measure each head's update in a
            step that measures), or None.
        distributed: the step runs under a `tf.distribute` strategy.
        options: the step's options; with `fused_updates`, plain Adam and SGD optimizers
            update through TF1's fused kernels (see `multihead.step.adam_sgd_ops`).
        loss_scales: the heads' loss scales, whose heads' gradients arrive scaled; None:
            no loss scaling.
    """

    def __init__(self, monitor: Monitor | None = None, options: StepOptions = StepOptions(),
                 distributed: bool = False, loss_scales: LossScales | None = None) -> None:
        self._monitor = monitor
        self._distributed = distributed
        self._fused = options.fused_updates
        self._loss_scales = loss_scales

    def apply_all(self, plans: Sequence[PlannedUpdate], step: tf.Tensor,
                  cadence_decided: bool = False, stats: StepStats | None = None) -> HeadsDone:
        """Applies `plans` in order; per head, whether it updated and whether it was skipped.

        Args:
            step: the step counter before the step.
            cadence_decided: the caller runs this only on steps where the heads' cadence
                says so (the sequential schedule's per-head branch): `every` is not checked
                again.
            stats: the step's measurements, in a step that measures; None: none.
        """
        updated, skipped = {}, {}
        for plan in plans:
            done = self.apply(plan, step, cadence_decided, stats)
            if plan.head is not None:
                updated[plan.head], skipped[plan.head] = done
        return HeadsDone(updated, skipped)

    def apply(self, plan: PlannedUpdate, step: tf.Tensor, cadence_decided: bool = False,
              stats: StepStats | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """Applies one plan -> (updated, skipped), bool scalars."""
        scales = self._loss_scales
        scaled = scales is not None and plan.head in scales.scales

        def run() -> tuple[tf.Tensor, tf.Tensor]:
            grads = take_gradients(plan)
            if scaled:
                grads = scales.unscale(plan.head, grads)
            if not plan.guarded and not scaled:
                self._write(plan, grads, stats)
                return tf.constant(True), tf.constant(False)
            finite = plan.finite if plan.finite is not None else all_finite(plan.loss, grads)
            done = self._guarded(finite, lambda: self._write(plan, grads, stats), stats)
            if scaled:
                write_state(scales.updated(plan.head, finite))
            return done

        conditions = [] if plan.due is None else [plan.due]
        if plan.every != 1 and not cadence_decided:
            conditions.append(tf.equal(step % plan.every, 0))
        if not conditions:
            return run()
        return step_stats.cond(
            stats, conditions[0] if len(conditions) == 1 else tf.logical_and(*conditions),
            run, _not_done)

    @not_converted
    def _write(self, plan: PlannedUpdate, grads: Gradients, stats: StepStats | None) -> None:
        measured = stats is not None and plan.head is not None
        if measured:
            self._monitor.updates.before_update(stats, plan.head, plan.variables, plan.optimizer)
        adam_sgd_ops.apply_gradients(plan.optimizer, grads, plan.variables, fused=self._fused)
        if measured:
            self._monitor.updates.head_update(stats, plan.head, plan.loss, grads, plan.variables,
                                              plan.optimizer)

    def _guarded(self, finite: tf.Tensor, write: Callable[[], None], stats: StepStats | None,
                 ) -> tuple[tf.Tensor, tf.Tensor]:
        def applied() -> tf.Tensor:
            write()
            return tf.constant(True)

        # Kept a function call (not under a strategy: see `StepStats`), the branch runs as one op.
        updated = step_stats.cond(stats, finite, applied, lambda: tf.constant(False),
                                  functional=not self._distributed)
        return updated, tf.logical_not(finite)


def write_lookahead(optimizer: keras.optimizers.Optimizer, grads: Gradients,
                    variables: Sequence[Any], options: StepOptions) -> None:
    """A lookahead's update (`multihead.step.affinity`): `optimizer`, a copy built on scratch
    copies `variables` of the model's, applies `grads` to them as the step's own updates
    would. It writes the copies only; every write through an optimizer is in this module."""
    adam_sgd_ops.apply_gradients(optimizer, grads, variables, fused=options.fused_updates)


def stack_done(heads: Sequence[str], values: Mapping[str, tf.Tensor], dtype: tf.DType,
               missing: Any) -> tf.Tensor:
    """`values` in the order of `heads` as one vector, `missing` for a head not in it."""
    return tf.stack([tf.cast(values[h], dtype) if h in values else tf.constant(missing, dtype)
                     for h in heads])
