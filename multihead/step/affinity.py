"""Inter-task affinity: how one head's update of the trunk changes every head's loss.

Fifty et al. (NeurIPS 2021, "Efficiently Identifying Task Groupings for Multi-Task
Learning", TAG) define the affinity of head i onto head j at a step as

    Z_{i->j} = 1 - L_j(theta_s - Delta_i, theta_j) / L_j(theta_s, theta_j),

the relative change of head j's loss on the step's batch after a lookahead update
`Delta_i` of the shared (trunk) parameters `theta_s` by head i alone, the heads' own
parameters `theta_j` unchanged. Positive: head i's update lowers head j's loss.

`TaskAffinity` computes every `Z_{i->j}` of a step, for every head i whose update moves
the trunk and every head j of the step (j = i included: how much head i's own trunk
update lowers its own loss), at the parameters the step starts from, on its batch.

The lookahead `Delta_i` (`lookahead=`):

* `"optimizer"` (default): head i's own planned trunk update, the step its optimizer
  would apply: the optimizer's update of head i's gradient, computed on copies of its
  variables and slots (iterations, learning rate, moments), so its momentum and
  adaptive scaling are those of the run. Only the trunk part of it moves the trunk.
  It is what head i's update does to the trunk in this run, where the paper's lookahead
  (below) is a plain gradient step whatever the optimizer.
* `"sgd"`: the paper's lookahead, `Delta_i = lr_i * g_i`, head i's trunk gradient times
  its optimizer's current learning rate.

With an aggregated trunk (one trunk optimizer applies an aggregate of the heads' trunk
gradients, `multihead.step.trunk_update`), no head has a trunk update of its own; head
i's lookahead is then the trunk update of a step of head i alone: the trunk optimizer's
update (on copies of its slots) of head i's own trunk gradient, the gradient it feeds
the aggregator (weight x loss, x the loss weighting's factor under one), plus the trunk
regularization's gradient, which the step adds once to the aggregate; with `"sgd"`, that
gradient times the trunk optimizer's learning rate. It is neither the head's share of
the aggregate (which depends on the other heads) nor the aggregate itself.

Nothing of the training state is written: the passes run in a `keras.StatelessScope`
(batch-norm statistics and dropout seeds are read, not advanced: the lookahead passes
see the step's own dropout masks), and the optimizer's update runs on copies (scratch
variables and a clone of the optimizer, created once when the step is built). A run
with affinity logging trains bitwise as one without. The cost, on the steps that
compute it: one forward pass and one backward pass per moving head, then one forward
pass per moving head (docs/affinity.md gives the measured cost); memory: a copy of the
moving heads' variables and of their optimizers' slots.
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from multihead.monitoring import tags
from multihead.step.applier import write_lookahead, write_state
from multihead.step.forward import ForwardPass
from multihead.step.loss_scales import LossScales
from multihead.step.options import StepOptions
from multihead.step.trunk_rule import StepObjective, TrunkRule

__all__ = ["LOOKAHEADS", "TaskAffinity"]

#: The lookaheads (see the module docstring).
LOOKAHEADS = ("optimizer", "sgd")


class _Scratch:
    """A copy of an optimizer and of the variables it is built on, written by the lookahead
    only: each lookahead copies the real values in, applies, and reads the result."""

    def __init__(self, optimizer: keras.optimizers.Optimizer, variables: Sequence[keras.Variable],
                 copies: dict[int, keras.Variable], who: str) -> None:
        self.optimizer = optimizer
        self.variables = tuple(variables)
        with tf.init_scope():
            for v in variables:
                if id(v) not in copies:
                    copies[id(v)] = keras.Variable(tf.zeros(v.shape, v.dtype), dtype=v.dtype,
                                                   name=v.name)
            self.copies = tuple(copies[id(v)] for v in variables)
            try:
                self.clone = type(optimizer).from_config(optimizer.get_config())
                self.clone.build(list(self.copies))
            except Exception as err:  # a user's optimizer class: any failure means "cannot clone"
                raise ValueError(
                    f"affinity_lookahead='optimizer': the optimizer of {who} cannot be copied "
                    f"({type(err).__name__}: {err}); use affinity_lookahead='sgd'") from None
        real, clone = optimizer.variables, self.clone.variables
        if len(real) != len(clone) or any(a.shape != b.shape for a, b in zip(real, clone)):
            raise ValueError(
                f"affinity_lookahead='optimizer': a copy of the optimizer of {who} "
                f"({type(optimizer).__name__}) does not have its variables (slots) in the same "
                "order; use affinity_lookahead='sgd'")

    def step(self, variables: Sequence[keras.Variable], grads: Sequence[Any],
             options: StepOptions) -> dict[int, tf.Tensor]:
        """id(variable) -> its value after the optimizer's update of `grads` (one per variable
        of `variables`, some or all of those it is built on, in order), computed on the copies."""
        write_state(list(zip(self.clone.variables, self.optimizer.variables))
                    + list(zip(self.copies, self.variables)))
        copy_of = dict(zip(map(id, self.variables), self.copies))
        copies = [copy_of[id(v)] for v in variables]
        write_lookahead(self.clone, list(grads), copies, options)
        return {id(v): tf.convert_to_tensor(c) for v, c in zip(variables, copies)}


class TaskAffinity:
    """Every `Z_{i->j}` of a step (see the module docstring), as TensorBoard tags.

    Build it eagerly (it creates its scratch variables), then call it inside the step,
    before the step's updates.

    Args:
        model: the built model.
        heads: the step's heads.
        rule: the step's trunk rule (per-head, or an aggregated `AggregatedRule`).
        forward: the step's forward pass.
        lookahead: `"optimizer"` or `"sgd"` (`LOOKAHEADS`).
        options: the step's options (the lookahead updates as the step's updates do).
        loss_scales: the heads' loss scales (float16), or None.
    """

    def __init__(self, model: Any, heads: Sequence[StepObjective], rule: TrunkRule,
                 forward: ForwardPass, lookahead: str = "optimizer",
                 options: StepOptions = StepOptions(),
                 loss_scales: LossScales | None = None) -> None:
        if lookahead not in LOOKAHEADS:
            raise ValueError(f"affinity_lookahead: must be one of {list(LOOKAHEADS)}, "
                             f"got {lookahead!r}")
        self._model = model
        self._heads = tuple(heads)
        self._forward = forward
        self._lookahead = lookahead
        self._options = options
        self._loss_scales = loss_scales
        self._trunk = tuple(model.trunk_variables)
        trunk_ids = {id(v) for v in self._trunk}
        self._aggregated = not rule.heads_update_trunk
        if self._aggregated:
            self._trunk_optimizer = rule.optimizer
            self.movers = tuple(h.name for h in self._heads if h.name in rule.heads)
        else:
            self.movers = tuple(h.name for h in self._heads if h.trains_trunk
                                and any(id(v) in trunk_ids for v in h.var_list))
        self._scratch: dict[str, _Scratch] = {}
        if lookahead == "optimizer":
            copies: dict[int, keras.Variable] = {}
            if self._aggregated and self.movers:
                self._scratch["trunk"] = _Scratch(rule.optimizer, rule.var_list, copies,
                                                  "the trunk")
            elif not self._aggregated:
                for head in self._heads:
                    if head.name in self.movers:
                        self._scratch[head.name] = _Scratch(head.optimizer, head.var_list, copies,
                                                            head.label)

    def tags(self) -> list[str]:
        """The tags written: `affinity/<i>/<j>` for every moving head i and every head j."""
        return [tags.affinity(i, h.name) for i in self.movers for h in self._heads]

    def __call__(self, inputs: Any, targets: Any, heads: Sequence[StepObjective], step: tf.Tensor,
                 own_batches: bool = False) -> dict[str, tf.Tensor]:
        """Tag -> `Z_{i->j}` (float32) of the step's batch, for the heads of this step
        (`heads`); writes nothing but its scratch variables."""
        heads = tuple(heads)
        variables = self._model.trainable_variables
        with tf.summary.record_if(False):  # summaries a research loss writes: the step's own
            with tf.GradientTape(persistent=True) as tape:
                # Every trainable variable mapped to its value (read on the tape): Keras
                # reads a weight regularizer's variable from the scope's mapping.
                current = [(v, tf.convert_to_tensor(v)) for v in variables]
                with keras.StatelessScope(state_mapping=current):
                    fwd = self._forward(inputs, targets, heads, step, own_batches)
            names = {h.name for h in heads}
            out = {}
            for head in self._heads:
                if head.name not in self.movers or head.name not in names:
                    continue
                moved = self._lookahead_trunk(head, fwd, tape)
                mapping = [(v, moved.get(id(v), value)) for v, value in current]
                with keras.StatelessScope(state_mapping=mapping):
                    after = self._forward(inputs, targets, heads, step, own_batches).losses
                for other in heads:
                    out[tags.affinity(head.name, other.name)] = (
                        1.0 - after[other.name] / fwd.losses[other.name])
            del tape
        return out

    def _lookahead_trunk(self, head: StepObjective, fwd: Any, tape: tf.GradientTape,
                         ) -> dict[int, tf.Tensor]:
        """id(trunk variable) -> its value after head `head`'s lookahead."""
        trunk_ids = {id(v) for v in self._trunk}
        if self._aggregated:
            variables = list(self._trunk)
            grads = [None if g is None else tf.convert_to_tensor(g)
                     for g in tape.gradient(fwd.objectives[head.name], variables)]
            if not isinstance(fwd.trunk_reg, float):
                reg = tape.gradient(fwd.trunk_reg, variables)
                grads = [g if r is None else r if g is None else g + r for g, r in zip(grads, reg)]
            # As the aggregate, whose row of a variable the head does not reach is zeros.
            grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]
            optimizer = self._trunk_optimizer
        else:
            variables = list(head.var_list)
            grads = tape.gradient(fwd.objectives[head.name], variables)
            if self._loss_scales is not None:
                grads = self._loss_scales.unscale(head.name, grads)
            optimizer = head.optimizer
        if self._lookahead == "sgd":
            return {id(v): tf.convert_to_tensor(v)
                    - tf.convert_to_tensor(g) * tf.cast(optimizer.learning_rate, v.dtype)
                    for g, v in zip(grads, variables) if g is not None and id(v) in trunk_ids}
        # Aggregated: the trunk optimizer's update of the trunk variables alone (not of the
        # loss weighting's variables it is built on too).
        scratch = self._scratch["trunk" if self._aggregated else head.name]
        new = scratch.step(variables, grads, self._options)
        return {ref: value for ref, value in new.items() if ref in trunk_ids}

