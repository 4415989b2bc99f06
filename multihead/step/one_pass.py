"""One backward pass for an aggregated trunk whose combination is linear in the heads' gradients.

With constant weights `w` (`sum`, `mean`, fixed `weights`: a `GramianWeighting` whose weights
read neither the Gramian, nor random draws, nor a state), the trunk aggregate
`d = sum_k w_k g_k` is the gradient of the weighted loss `sum_k w_k L_k`: one backward pass
instead of K. A loss weighting scales each `L_k` in the forward pass already, so under it the
same holds as long as it reads no gradient (`needs_grad_norms`, GradNorm, does).

Each head's own variables still get the gradient of its own objective alone: from the same
pass when every weight is 1 (the other heads' objectives do not reach a head's variables),
else from a second pass of `sum_k L_k` on the heads' variables only (through the heads, not
the trunk). Those are bitwise the per-head passes' gradients; the trunk's differs by float32
rounding (the sum is taken at the trunk output instead of over the trunk's gradients).

The trunk rule (`multihead.step.trunk_update.AggregatedRule.plan`) takes this path on steps that
need no per-head trunk gradient: not a logging step (the aggregation's per-head norms and
cosines are written from the per-head gradients), not under a strategy, every aggregated
objective its own head's alone; and not with `rep_grad`, whose combination at the trunk output
(K head-sized passes, one trunk pass) is as cheap. When a head is guarded, or may not be
due, the step checks the one-pass result: every aggregated loss and gradient finite and every
head due. Otherwise it redoes the step per head within the same compiled step (`tf.cond`), so
a non-finite head is isolated and dropped exactly as without this path. A weight of 0 keeps
the per-head path: it could hide a head's non-finite gradient from that check.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import keras
import tensorflow as tf

from multihead._autograph import converted
from multihead.aggregation.base import Aggregator, GramianWeighting
from multihead.aggregation.loss_weighting import LossWeighting
from multihead.step.applier import PlannedUpdate, all_finite, take_gradients, write_state
from multihead.step.trunk_rule import StepObjective, HeadsPass

__all__ = ["linear_weights", "one_pass_plans", "takes_one_pass"]


def linear_weights(aggregator: Aggregator, weighting: LossWeighting | None,
                   num_heads: int) -> tuple[float, ...] | None:
    """The constant weights of `aggregator` for `num_heads` heads when its aggregate is the
    gradient of a weighted loss (under `weighting`, which must read no gradient); None when
    it is not, or when a weight is 0 (see the module docstring)."""
    if (not isinstance(aggregator, GramianWeighting) or not aggregator.constant
            or aggregator.noise is not None or aggregator.random_order or aggregator.stateful
            or aggregator.needs_losses or aggregator.log_losses):
        return None
    if weighting is not None and weighting.needs_grad_norms:
        return None
    weights = tf.get_static_value(aggregator.weigh(tf.zeros([num_heads, num_heads])).weights)
    if weights is None or weights.shape != (num_heads,):
        return None
    values = tuple(float(w) for w in weights)
    if not all(w != 0.0 and math.isfinite(w) for w in values):
        return None
    return values


def takes_one_pass(heads_pass: HeadsPass, agg: Sequence[StepObjective]) -> bool:
    """Whether a pass of the aggregated heads `agg` can take the one-pass path (known at trace
    time): one device, a step that does not log, each objective its own head's alone on
    variables of its own."""
    p = heads_pass
    if p.given is not None or p.backward is None or p.stats is not None or not agg:
        return False
    seen: set[int] = set()
    for head in agg:
        if head.parts is not None and not (head.parts.is_plain
                                           and head.trained_heads == (head.name,)):
            return False
        ids = {id(v) for v in head.var_list}
        if ids & seen:
            return False
        seen |= ids
    return True


class _Values(NamedTuple):
    """A step's aggregated updates as tensors: the trunk optimizer's gradients and whether it
    applies them; per aggregated head, its own gradients and the guard's verdict."""

    trunk: list[tf.Tensor]
    trunk_applies: tf.Tensor
    own: list[list[tf.Tensor]]
    finite: list[tf.Tensor]


def _dense(grads: Sequence[Any], variables: Sequence[keras.Variable]) -> list[tf.Tensor]:
    """`grads` as dense tensors, zeros for None (the two branches of a cond must match)."""
    return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, variables)]


def one_pass_plans(p: HeadsPass, agg: Sequence[StepObjective], weights: Sequence[float],
                   trunk_optimizer: keras.optimizers.Optimizer,
                   trunk_var_list: Sequence[keras.Variable], weighting: LossWeighting | None,
                   per_head: Callable[[], list[PlannedUpdate]]) -> list[PlannedUpdate]:
    """The plans of the aggregated heads `agg` and of the trunk, from one backward pass of
    the weighted loss; `per_head()` gives the per-head path's plans (the trunk's first, then
    one per head of `agg`), taken instead within the step when the one-pass result fails the
    check (see the module docstring).

    Args:
        p: the pass (`takes_one_pass`).
        weights: the aggregator's constant weights, one per head of `agg` (`linear_weights`).
        trunk_optimizer: the trunk optimizer, built on `trunk_var_list` (the trunk's
            variables, then the loss weighting's trainable ones).
        weighting: the loss weighting (its trainable variables' gradient, its update), or None.
    """
    trunk_vars = list(p.trunk_variables)
    extra_vars = list(trunk_var_list[len(trunk_vars):])
    own_vars = [list(h.var_list) for h in agg]
    flat_own = [v for vs in own_vars for v in vs]
    # The tape recorded the objectives, not their sum: the weights enter the backward pass
    # as its output gradients, so one pass gives `sum_k w_k grad(objective_k)`.
    objectives = [p.backward.objectives[h.name] for h in agg]
    targets, scales = list(objectives), list(weights)
    if not isinstance(p.trunk_reg, float):
        targets.append(p.trunk_reg)
        scales.append(1.0)
    n = len(trunk_vars)
    if all(w == 1.0 for w in weights):  # one pass gives the heads' own gradients too
        grads = p.backward.gradient(targets, trunk_vars + flat_own)
        trunk, own_flat = grads[:n], grads[n:]
    else:
        trunk = p.backward.gradient(targets, trunk_vars, output_gradients=[
            tf.constant(w, t.dtype) for w, t in zip(scales, targets)])
        own_flat = p.backward.gradient(objectives, flat_own)
    trunk = _dense(trunk, trunk_vars)
    if p.loss_factors.objective is not None:  # e.g. the uncertainty log-variances
        trunk += _dense(p.backward.gradient(p.loss_factors.objective, extra_vars), extra_vars)
    else:
        trunk += [tf.zeros_like(v) for v in extra_vars]
    own, i = [], 0
    for vs in own_vars:
        own.append(list(own_flat[i:i + len(vs)]))
        i += len(vs)
    # A variable no objective reaches has no gradient (None) in either path: kept None.
    absent = [[g is None for g in gs] for gs in own]
    own_dense = [_dense(gs, vs) for gs, vs in zip(own, own_vars)]

    def fast() -> _Values:
        if weighting is not None:  # written only where the trunk update happens
            write_state(converted(weighting.update)(p.loss_factors.losses, None))
        return _Values(trunk, tf.constant(True), own_dense, [tf.constant(True) for _ in agg])

    conditions = [c for c in (p.is_due(h.name) for h in agg) if c is not None]
    if any(h.guarded for h in agg):
        losses = tf.add_n([p.losses[h.name] for h in agg])
        conditions.append(all_finite(losses, trunk + [g for gs in own_dense for g in gs]))
    if not conditions:
        values = fast()
    else:
        due = conditions[0] if len(conditions) == 1 else tf.reduce_all(tf.stack(conditions))
        # Lowered (Switch/Merge), as the per-head path's own conds: kept a function call, the
        # per-head branch would be optimised apart from the step and round otherwise than a
        # per-head trainer's step (measured: 2e-10 on a trunk bias under `mean`). Lowered, its
        # nodes are visited untaken on every step: ~0.2 ms at K = 4 (docs/performance.md).
        values = tf.cond(due, fast, lambda: _per_head_values(per_head(), agg, trunk_var_list))

    plans = [PlannedUpdate(trunk_optimizer, values.trunk, trunk_var_list,
                           due=values.trunk_applies if conditions else None)]
    for head, gs, none, finite in zip(agg, values.own, absent, values.finite):
        plans.append(PlannedUpdate(
            head.optimizer, [None if a else g for g, a in zip(gs, none)], head.var_list,
            head.name, head.guarded, p.losses[head.name], finite if head.guarded else None,
            due=p.is_due(head.name)))
    return plans


def _per_head_values(plans: list[PlannedUpdate], agg: Sequence[StepObjective],
                     trunk_var_list: Sequence[keras.Variable]) -> _Values:
    """The per-head path's plans (`one_pass_plans`' `per_head`) as tensors: the trunk's
    gradients are taken (with their writes: the aggregator's and the loss weighting's state)
    only where its update happens, as the applier would."""
    trunk_plan, head_plans = plans[0], plans[1:]
    assert [q.head for q in head_plans] == [h.name for h in agg], "one plan per head, in order"

    def gradients() -> list[tf.Tensor]:
        return _dense(take_gradients(trunk_plan), trunk_var_list)

    if trunk_plan.due is None:
        applies, trunk = tf.constant(True), gradients()
    else:
        applies = trunk_plan.due
        trunk = tf.cond(applies, gradients, lambda: [tf.zeros_like(v) for v in trunk_var_list])
    own = [_dense(q.gradients, h.var_list) for q, h in zip(head_plans, agg)]
    finite = [tf.constant(True) if q.finite is None else q.finite for q in head_plans]
    return _Values(list(trunk), applies, own, finite)
