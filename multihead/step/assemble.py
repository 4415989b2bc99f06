"""Assembling a step: objectives -> head specs -> trunk rule -> the compiled `TrainStep`.

`StepAssembly` resolves and checks, at construction, everything the step is made
of: each objective's loss and optimizer (created in the strategy's scope when given
by name), the aggregated trunk update, the loss scales, the step counter and the
freeze flags. `build` makes the compiled step once the model is built: each
optimizer built on its var_list, the trunk rule, the monitor bound to the heads'
variables, the `TrainStep` with the options passed whole. The Trainer keeps only the loop (`multihead.training.trainer`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import tensorflow as tf

from multihead import _keras_internals as internals
from multihead.model.addresses import variable_addresses
from multihead.model.model_view import HeadsModel
from multihead.model.taps import blocks_table
from multihead.monitoring import tags
from multihead.monitoring.monitor import Monitor
from multihead.objectives.loss_weights import LossWeight
from multihead.objectives.objective import (
    Objective,
    check_created_in_scope,
    check_distinct_optimizers,
    resolve_loss,
    resolve_optimizer,
)
from multihead.objectives.parts import check_objectives, declares_trunk, objective_order, resolve_parts
from multihead.settings import PYTHON, check_loss_scaling, check_rep_grad_trunk, check_strategy_limits
from multihead.step import distribute
from multihead.step.affinity import TaskAffinity
from multihead.step.forward import ForwardPass
from multihead.step.freezing import FrozenHeads
from multihead.step.loss_scales import DynamicLossScale, LossScales, computes_in_float16
from multihead.step.options import StepOptions
from multihead.step.train_step import TrainStep
from multihead.step.trunk_policy import TrunkPolicy
from multihead.step.trunk_rule import PerHeadRule, StepObjective, TrunkRule, trunk_scale
from multihead.step.trunk_update import AggregatedRule

__all__ = ["StepAssembly"]


class StepAssembly:
    """What a trainer's step is made of, resolved and checked at construction.

    Args:
        model: the model (it may be unbuilt).
        objectives: name -> `Objective`, one for every head of the model.
        options: the step's options.
        trunk: `"per_head"`, a `TrunkPolicy` (or a dict of its fields), or a trunk rule
            of the user's (`TrunkRule` with `heads_update_trunk = True`, e.g. a subclass
            of `PerHeadRule`).
        strategy: a `tf.distribute` strategy, or None.
        target_networks: objects whose `update()` runs inside the step.
        logging: whether TensorBoard logging is on.

    Attributes:
        objectives: name -> objective, those named for heads in head order, then the others.
        loss_fns: name -> the resolved loss.
        optimizers: name -> the objective's optimizer.
        trunk_update: the aggregated trunk update, None for per_head.
        own_rule: the user's trunk rule given as `trunk`, or None.
        rep_grad: whether the trunk aggregates at its output.
        step_variable: the step counter.
        frozen: the objectives' freeze flags.
        loss_scales: each objective's dynamic loss scale (float16), or None.
        weights: name -> its loss weight, filled by `build`.
    """

    def __init__(self, model: HeadsModel, objectives: Mapping[str, Objective], options: StepOptions,
                 *, trunk: str | TrunkPolicy | TrunkRule | Mapping[str, Any] = "per_head",
                 strategy: tf.distribute.Strategy | None = None,
                 target_networks: Sequence[Any] = (), logging: bool = False) -> None:
        check_objectives(model, objectives)
        for target in target_networks:
            if not callable(getattr(target, "update", None)):
                raise TypeError(f"target_networks must have an update() method, got {target!r}")
        if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(f"strategy must be a tf.distribute.Strategy or None, got {strategy!r}")
        where = None if strategy is None else f"a strategy ({type(strategy).__name__})"
        options.check(logging=logging, strategy=where, spell=PYTHON)
        self.model, self.options, self.strategy = model, options, strategy
        self.target_networks = tuple(target_networks)
        self.objectives = {n: objectives[n] for n in objective_order(model, objectives)}
        names = tuple(self.objectives)
        self.loss_fns = {h: resolve_loss(o.loss, h, o.missing_label)
                         for h, o in self.objectives.items()}
        with distribute.scope(strategy):  # optimizers given by name are created in the scope
            self.optimizers = {h: resolve_optimizer(o.optimizer, h) for h, o in self.objectives.items()}
            check_distinct_optimizers(self.optimizers)
            self.own_rule = _own_rule(trunk)
            self.trunk_update = AggregatedRule.create(
                "per_head" if self.own_rule else trunk,
                {n: dataclasses.replace(o, trains_trunk=declares_trunk(o))
                        for n, o in self.objectives.items()}, options, self.optimizers)
        policy = self.trunk_update.policy if self.trunk_update is not None else None
        self.rep_grad = bool(policy and policy.rep_grad)
        if strategy is not None:
            check_created_in_scope(self.optimizers, strategy)
            check_strategy_limits(
                where, rep_grad=self.rep_grad, spell=PYTHON,
                loss_weighting=policy.loss_weighting_label if policy and policy.is_loss_weighting
                else None)
        check_rep_grad_trunk(self.rep_grad, type(model.trunk).__name__, model.routes_heads, PYTHON,
                             tapped=list(getattr(model, "taps", None) or ()))
        scale = _loss_scale_options(options.loss_scale, model)
        check_loss_scaling(scale is not None, self.trunk_update is not None, PYTHON)
        with distribute.scope(strategy):
            self.step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.frozen = FrozenHeads(names)
            self.loss_scales = None if scale is None else LossScales(names, scale)
        self.weights: dict[str, LossWeight] = {}

    def build(self, monitor: Monitor | None) -> TrainStep:
        """The compiled step: partitions the variables and builds each optimizer eagerly on
        its var_list (the model must be built); writes which trunk blocks each head's
        gradient reaches to `monitor`."""
        model, strategy = self.model, self.strategy
        if strategy is not None:
            distribute.check_created_in_scope(strategy, model.weights, "model")
        with distribute.scope(strategy):  # optimizer slots become mirrored variables
            heads = self._head_specs()
        rule: Any = self.own_rule or PerHeadRule(self.options.batched)
        if self.trunk_update is not None:
            with distribute.scope(strategy):
                self.trunk_update.build(model.trunk_variables)
            rule = self.trunk_update
        affinity = None
        if monitor is not None and monitor.affinity_every:
            affinity = TaskAffinity(model, heads, rule,
                                    ForwardPass(model, rule, strategy, self.loss_scales),
                                    monitor.affinity_lookahead, self.options,
                                    self.loss_scales)
        step = TrainStep(model, heads, self.options, self.step_variable, rule, monitor,
                         strategy=strategy, target_networks=self.target_networks,
                         frozen=self.frozen, loss_scales=self.loss_scales, affinity=affinity)
        if monitor is not None:  # before the first trace
            self._bind(monitor, heads, rule.summary_tags() + step.summary_tags()
                       + (affinity.tags() if affinity is not None else []))
        # Which trunk blocks each head's gradient reaches (trunk taps), once, at step 0.
        blocks = blocks_table(model.trunk, {
            n: p.var_list for n, p in resolve_parts(model, self.objectives).items()})
        if blocks is not None and monitor is not None:
            monitor.write_text(tags.TRUNK_BLOCKS, blocks)
        return step

    def _bind(self, monitor: Monitor, heads: Sequence[StepObjective], other_tags: list[str]) -> None:
        """Binds `monitor` to the heads' variables and optimizers and to the tags the trunk
        rule and the step write (`other_tags`): its buffers must exist before the first trace."""
        if self.strategy is not None:
            monitor.distributed = True  # see Monitor.distributed
        monitor.bind({h.name: h.var_list for h in heads}, self.model.trunk_variables,
                     {h.name: h.optimizer for h in heads},
                     addresses={id(v): a for a, v in variable_addresses(self.model).items()},
                     other_tags=other_tags)

    def _head_specs(self) -> list[StepObjective]:
        """Each objective's spec, its optimizer built on its var_list."""
        parts = resolve_parts(self.model, self.objectives, aggregated=self.trunk_update is not None)
        heads = []
        for name, objective in self.objectives.items():
            var_list = parts[name].var_list
            optimizer = self.optimizers[name]
            if optimizer.built:
                built_on = [id(v) for v in internals.built_variables(optimizer)]
                if built_on != [id(v) for v in var_list]:
                    raise ValueError(
                        f"the optimizer of objective {name!r} was already built on other "
                        "variables; pass a fresh optimizer")
            else:
                optimizer.build(list(var_list))
            self.weights[name] = LossWeight(name, objective.weight)
            heads.append(StepObjective(
                name=name,
                loss=self.loss_fns[name],
                optimizer=optimizer,
                var_list=tuple(var_list),
                weight=self.weights[name],
                every=objective.every,
                trains_trunk=parts[name].trains_trunk,
                # An overflow of a scaled gradient is skipped: the scale relies on it.
                guarded=objective.on_nonfinite != "apply" or self.loss_scales is not None,
                missing_label=objective.missing_label,
                parts=parts[name],
                trunk_scale=trunk_scale(objective.trunk_scale),
            ))
        return heads


def _loss_scale_options(loss_scale: DynamicLossScale | str | None, model: HeadsModel,
                        ) -> DynamicLossScale | None:
    """The heads' loss scale options `loss_scale` asks for (`StepOptions.loss_scale`), or None."""
    if isinstance(loss_scale, str):  # "auto", checked by StepOptions
        return DynamicLossScale() if computes_in_float16([model.trunk, *model.heads.values()]) else None
    return loss_scale


def _own_rule(trunk: Any) -> TrunkRule | None:
    """`trunk` when it is a trunk rule of the user's, else None. Its heads' optimizers are
    built on their var_lists (trunk + head) as under `per_head`: a rule that plans a trunk
    optimizer of its own (`heads_update_trunk = False`) is refused."""
    if not isinstance(trunk, TrunkRule) or isinstance(trunk, AggregatedRule):
        return None
    if not trunk.heads_update_trunk:
        raise ValueError(
            f"trunk: the rule {type(trunk).__name__} has heads_update_trunk = False; a rule of "
            "your own plans the heads' updates on their var_lists (trunk + head), so it must "
            "set heads_update_trunk = True (to aggregate, give a TrunkPolicy)")
    return trunk
