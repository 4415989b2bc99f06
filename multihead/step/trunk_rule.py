"""Trunk rules: what the heads' gradients become, as planned updates.

A train step computes every head's objective in one forward pass; its trunk rule
turns the heads' gradients into `PlannedUpdate`s, which the step's one `Applier`
applies. A rule never sees the step: it gets a `HeadsPass` (the heads, their
losses, their gradients on demand) and returns plans.

* `PerHeadRule` (the default, `trunk="per_head"`): each head's optimizer applies
  the head's gradient to its var_list, trunk + head, with its own slots:
  exactly `minimize(loss_k, var_list=trunk + head_k)`.
* `multihead.step.trunk_update.AggregatedRule` (a `TrunkPolicy`): one trunk optimizer
  applies an aggregate of the heads' trunk gradients, each head's optimizer its
  own variables.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

import keras
import tensorflow as tf

from multihead._autograph import converted
from multihead.monitoring.step_stats import StepStats
from multihead.step import batched_backward
from multihead.step.applier import PlannedUpdate, not_converted
from multihead.objectives.objective import HeadLoss
from multihead.objectives.parts import ObjectiveParts


@dataclasses.dataclass(frozen=True)
class StepObjective:
    """Everything the step needs about one head, resolved and validated.

    Attributes:
        name: the head's name.
        loss: the resolved loss `(inputs, targets, output, training=...) -> scalar`.
        optimizer: the head's optimizer, built on `var_list`.
        var_list: what the head's optimizer updates (trunk + head, or the head only).
        weight: the head's loss weight at a step (a scalar tensor; see `LossWeight`).
        every: the head is due on steps where `step % every == 0`.
        trains_trunk: the head's gradient reaches the trunk.
        guarded: whether a non-finite loss or gradient drops the head's update.
        missing_label: the label value marking a row without a label (None: every row
            has one); a batch with no row present gives the head no update.
        parts: what the objective reads and trains (`multihead.objectives.parts`); None: its
            own head's output, trunk + head.
        trunk_scale: the factor on its gradient into the trunk at a step, or None: 1.
    """

    name: str
    loss: HeadLoss
    optimizer: keras.optimizers.Optimizer
    var_list: tuple[keras.Variable, ...]
    weight: Callable[[tf.Tensor], tf.Tensor]
    every: int
    trains_trunk: bool
    guarded: bool = True
    missing_label: float | None = None
    parts: ObjectiveParts | None = None
    trunk_scale: Callable[[tf.Tensor], tf.Tensor] | None = None

    @property
    def reads(self) -> tuple[str, ...]:
        """The outputs its loss reads."""
        return self.parts.reads if self.parts is not None else (self.name,)

    @property
    def trained_heads(self) -> tuple[str, ...]:
        """The heads whose variables it trains."""
        return self.parts.trained_heads if self.parts is not None else (self.name,)

    @property
    def label(self) -> str:
        """How errors name it: `head 'a'` for a head's own objective, else `objective 'x'`."""
        plain = self.parts is None or self.parts.is_plain
        return f"{'head' if plain else 'objective'} {self.name!r}"

    def prediction(self, outputs: Mapping[str, Any], inputs: Any) -> Any:
        """What its loss compares with the labels, from the outputs it reads."""
        if self.parts is None:
            return outputs[self.name]
        return self.parts.prediction(outputs, inputs)


def trunk_scale(spec: Any) -> Callable[[tf.Tensor], tf.Tensor] | None:
    """An objective's `trunk_scale` as the step reads it: None for 1 (the gradient enters
    the trunk as is), else a function of the step giving the factor (float32)."""
    if not callable(spec):
        value = float(spec)
        return None if value == 1.0 else (lambda step: tf.constant(value, tf.float32))
    schedule = converted(spec)
    return lambda step: tf.cast(schedule(step), tf.float32)


def scale_gradient(value: Any, factor: tf.Tensor) -> Any:
    """`value` in the forward pass (an identity); its gradient times `factor` in the
    backward pass."""
    def scaled(v: tf.Tensor) -> tf.Tensor:
        @tf.custom_gradient
        def identity(x: tf.Tensor) -> Any:
            return tf.identity(x), lambda dy: dy * tf.cast(factor, dy.dtype)

        return identity(v)

    return tf.nest.map_structure(scaled, value)


class LossFactors(NamedTuple):
    """What a rule's loss weighting computed in the forward pass (on the tape).

    Attributes:
        factors: head -> the factor its weighted loss is multiplied by (heads absent:
            no factor).
        losses: the stacked weighted losses the weighting saw, or None.
        weights: the weighting's factors as a vector, or None.
        objective: the scalar the weighting's own trainable variables descend, or None.
    """

    factors: dict[str, tf.Tensor]
    losses: tf.Tensor | None = None
    weights: tf.Tensor | None = None
    objective: tf.Tensor | None = None


NO_FACTORS = LossFactors({})


class Backward:
    """Gradients from one recorded forward pass: the heads' objectives on a tape.

    Args:
        tape: the tape the forward pass was recorded on.
        objectives: head -> the scalar its gradient is taken of.
    """

    def __init__(self, tape: tf.GradientTape, objectives: Mapping[str, tf.Tensor]) -> None:
        self._tape = tape
        self._objectives = objectives

    @property
    def objectives(self) -> Mapping[str, tf.Tensor]:
        """Head -> the scalar its gradient is taken of."""
        return self._objectives

    @not_converted
    def head(self, head: StepObjective, sources: Sequence[Any], trunk_sources: int = 0,
             ) -> list[tf.Tensor | None]:
        """The gradient of `head`'s objective with respect to `sources`, whose first
        `trunk_sources` are the trunk's (variables or output).

        Raises:
            ValueError: the objective depends on none of the trunk sources, or on none
                of `sources`.
        """
        grads = self._tape.gradient(self._objectives[head.name], list(sources))
        if trunk_sources and all(g is None for g in grads[:trunk_sources]):
            raise ValueError(
                f"the loss of {head.label} does not depend on the trunk: check that the "
                "loss uses the head's output, or set trains_trunk=False for this head")
        if all(g is None for g in grads):
            raise ValueError(
                f"the loss of {head.label} does not depend on any variable of its "
                "var_list: check that the loss uses the head's output")
        return grads

    @not_converted
    def gradient(self, target: Any, sources: Sequence[Any],
                 output_gradients: Any = None) -> list[tf.Tensor | None]:
        """`tape.gradient(target, sources, output_gradients)`."""
        return self._tape.gradient(target, list(sources), output_gradients=output_gradients)


class HeadsPass(NamedTuple):
    """What a trunk rule plans from: one forward pass of some heads.

    Attributes:
        heads: the heads of the pass, in order.
        losses: head -> unweighted loss (float32 scalar).
        step: the step counter before the step.
        trunk_variables: the trunk's trainable variables.
        backward: the heads' gradients on demand (one device), or None.
        given: under a strategy, what the rule's `replica_gradients` returned,
            all-reduced; None on one device.
        features: the trunk output (None under a strategy).
        trunk_reg: the trunk's regularization (0.0 when it has none).
        loss_factors: what the rule's `loss_factors` computed in the pass.
        stats: the measurements of a monitored step, which the rule records into and
            takes out of its conditionals (`multihead.monitoring.step_stats`); None
            without a monitor and in the step variant that does not log.
        due: head -> bool scalar, whether the head's update is due this step as far as
            the pass knows (False: frozen, or no present label in its batch; its cadence,
            `every`, is the applier's): a head that is not due is dropped exactly as the
            non-finite guard drops one. None, or a head not in it: due.
    """

    heads: tuple[StepObjective, ...]
    losses: dict[str, tf.Tensor]
    step: tf.Tensor
    trunk_variables: tuple[keras.Variable, ...]
    backward: Backward | None = None
    given: Any = None
    features: Any = None
    trunk_reg: tf.Tensor | float = 0.0
    loss_factors: LossFactors = NO_FACTORS
    stats: StepStats | None = None
    due: Mapping[str, tf.Tensor] | None = None

    def is_due(self, head: str) -> tf.Tensor | None:
        """Whether `head`'s update is due this step (a bool scalar), or None: it is."""
        return None if self.due is None else self.due.get(head)

    # The former names of `due` and `is_due`, kept as aliases.
    @property
    def active(self) -> Mapping[str, tf.Tensor] | None:
        """Former name of `due`."""
        return self.due

    def takes_part(self, head: str) -> tf.Tensor | None:
        """Former name of `is_due`."""
        return self.is_due(head)


@runtime_checkable
class TrunkRule(Protocol):
    """How a step turns the heads' gradients into updates (see the module docstring).

    Attributes:
        heads_update_trunk: each head's optimizer updates the trunk, so each head's
            objective carries the trunk's regularization.
    """

    heads_update_trunk: bool

    def loss_factors(self, weighted: Mapping[str, tf.Tensor]) -> LossFactors:
        """Inside the forward pass (on the tape): factors of the heads' weighted losses."""

    def replica_gradients(self, heads: Sequence[StepObjective], backward: Backward,
                          trunk_reg: tf.Tensor | float,
                          trunk_variables: Sequence[keras.Variable]) -> Any:
        """Under a strategy, in replica context: every gradient `plan` will need, as a
        nest of tensors (the step all-reduces it and hands it over as `HeadsPass.given`)."""

    def plan(self, heads_pass: HeadsPass) -> list[PlannedUpdate]:
        """The updates of one step, in the order they are applied."""

    def step_heads(self, heads: tuple[str, ...], frozen: Sequence[str]) -> tuple[str, ...]:
        """The heads a step of `heads` is compiled for while the heads `frozen` are frozen:
        `heads` when `plan` drops the frozen ones in the graph (`HeadsPass.due`, no
        retrace), else the heads of `heads` that are not frozen."""

    def summary_tags(self) -> list[str]:
        """The scalar tags the rule writes into the train run on logging steps (for the
        Custom Scalars layout, `multihead.monitoring.layout`)."""


def head_plans(heads: Sequence[StepObjective], heads_pass: HeadsPass,
               batched: bool = False) -> list[PlannedUpdate]:
    """Each head's optimizer applies the head's whole gradient to its whole var_list,
    when due (`every`, `HeadsPass.due`); a guarded head's only when its loss
    and gradient are finite. The gradient is taken only where the update happens, or,
    with `batched`, in one vectorised trunk backward pass for the heads it can batch
    (`multihead.step.batched_backward`)."""
    together = (batched_backward.head_gradients(heads, heads_pass)
                if batched and heads_pass.given is None else {})
    plans = []
    for head in heads:
        grads = (heads_pass.given[head.name] if heads_pass.given is not None
                 else together.get(head.name) or _deferred(heads_pass.backward, head))
        plans.append(PlannedUpdate(head.optimizer, grads, head.var_list, head.name, head.guarded,
                                   heads_pass.losses[head.name], every=head.every,
                                   due=heads_pass.is_due(head.name)))
    return plans


def _deferred(backward: Backward | None, head: StepObjective) -> Callable[[], list[tf.Tensor | None]]:
    """`head`'s gradient on its var_list, taken when called."""
    assert backward is not None, "a HeadsPass has `backward` or `given`"
    return lambda: backward.head(head, head.var_list)


class PerHeadRule:
    """The per-head rule: each head's optimizer updates trunk + head with its own slots.

    Args:
        batched_backward: take the heads' trunk gradients in one vectorised backward
            pass instead of one pass per head (see `multihead.step.batched_backward`).
    """

    heads_update_trunk = True

    def __init__(self, batched_backward: bool = False) -> None:
        self.batched_backward = batched_backward

    def loss_factors(self, weighted: Mapping[str, tf.Tensor]) -> LossFactors:
        """No loss weighting: no factors."""
        del weighted
        return NO_FACTORS

    def replica_gradients(self, heads: Sequence[StepObjective], backward: Backward,
                          trunk_reg: tf.Tensor | float,
                          trunk_variables: Sequence[keras.Variable],
                          ) -> dict[str, list[tf.Tensor | None]]:
        """Every head's gradient on its var_list (under a strategy, due or not)."""
        del trunk_reg, trunk_variables  # the regularization is inside each head's objective
        return {h.name: backward.head(h, h.var_list) for h in heads}

    def plan(self, heads_pass: HeadsPass) -> list[PlannedUpdate]:
        """One update per head, in head order (see `head_plans`)."""
        return head_plans(heads_pass.heads, heads_pass, self.batched_backward)

    def step_heads(self, heads: tuple[str, ...], frozen: Sequence[str]) -> tuple[str, ...]:
        """`heads`: each head's update is dropped in the graph, frozen or not."""
        del frozen
        return heads

    def summary_tags(self) -> list[str]:
        """None: the monitor logs each head's update itself."""
        return []
