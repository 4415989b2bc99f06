"""The aggregated trunk rule: one trunk optimizer fed an aggregate of the heads' trunk gradients.

`AggregatedRule` implements `multihead.step.trunk_rule.TrunkRule` (the default rule,
`PerHeadRule`, lives there): it returns planned updates, which the step's applier
applies.

* `AggregatedRule` (a `TrunkPolicy`): each head's optimizer is built on the head's
  own variables only; one trunk optimizer, built on the trunk variables (plus a
  loss weighting's trainable variables, e.g. uncertainty log-variances), applies
  `d = sum_k w_k g_k`, the aggregate of the heads' trunk gradients `g_k`
  (weights `w` from a `multihead.aggregation` method), plus the gradient of
  the trunk's own regularisation losses (added once, not aggregated).

Two ways to get the `g_k` of an aggregate:

* parameter space (default): one `tape.gradient` per head on trunk + head
  variables; the weights come from the Gramian summed over trunk variables.
* `rep_grad=True` (Sener & Koltun's MGDA-UB): each head's gradient is taken at
  the trunk output only (a head-sized backward pass), the weights come from the
  Gramian of those, they are combined there, and one trunk backward pass
  (`output_gradients=`) gives `d`. Valid where the weights stay meaningful:
  constant weights (identical result), `mgda` (the paper's upper bound),
  `imtl` (the paper works on shared features) and the loss weightings.

Where the combination is linear in the `g_k` (constant weights, under a loss weighting
that reads no gradient), a step that needs no per-head trunk gradient takes none: one
backward pass of the weighted loss gives `d` (`multihead.step.one_pass`, on by default:
`StepOptions.one_pass_backward`; not with `rep_grad`, which keeps its own way); a step whose
result fails its check (a non-finite gradient, a head that is not due) redoes it per head,
as below.

Dropped heads: a guarded head whose loss or gradient is not finite drops out of
the step, and so does a head that is not due in it (`HeadsPass.due`:
frozen, or without a present label in its batch). Its own update is skipped;
under aggregation the trunk aggregate of that step is taken over the other heads
(exactly as a partial step without it), and with two or more such heads, or
under a loss weighting, the trunk is not updated that step. The compiled step holds two
aggregations, not one per head: that of every head, and that of all heads but one whose
position is a tensor (its rows gathered, then aggregated exactly as a step of the others);
the aggregator's state is written once, after the step chose between them.

Frozen heads are known on the host, so they need not wait for that in-graph rule
(`step_heads`): with at most one frozen aggregated head the step drops it in the
graph (freezing does not retrace); with two or more (and no loss weighting) the
step runs the variant compiled for the heads that are not frozen, a partial step
whose trunk moves exactly as without them: one trace per distinct such frozen
set, and unfreezing returns to the variant of every head. Under a loss weighting
every frozen set is dropped in the graph: the trunk does not move while any
aggregated head is frozen (a weighting weighs all its heads or none).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import keras
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._autograph import converted
from multihead.aggregation.base import (
    Aggregator,
    BufferedAggregator,
    CoordinatewiseAggregator,
    log_loss_factor,
)
from multihead.aggregation.dispatch import run as run_aggregator, step_draws
from multihead.aggregation.loss_weighting import LossWeighting
from multihead.objectives.objective import Objective, resolve_optimizer
from multihead.settings import PYTHON, check_trunk_aggregation
from multihead.monitoring import tags
from multihead.monitoring import step_stats
from multihead.monitoring.step_stats import StepStats
from multihead.step import one_pass
from multihead.step.aggregator_state import AggregatorState
from multihead.step.applier import PlannedUpdate, WithState, all_finite
from multihead.step.gradient_rows import (
    all_but,
    gramian,
    pairwise_gramian,
    split_rows,
    stack_rows,
    weighted_sum,
)
from multihead.step.options import StepOptions
from multihead.step.trunk_policy import TrunkPolicy, resolve_trunk
from multihead.step.trunk_rule import Backward, StepObjective, HeadsPass, LossFactors, head_plans

#: Up to this many heads the Gramian is summed from pairwise inner products and the
#: heads' gradients are combined by a direct weighted sum; above, from `K x n` stacks
#: (one matmul each), which is the faster of the two from 4 heads on.
_PAIRWISE_MAX_HEADS = 3

def _both(a: tf.Tensor | None, b: tf.Tensor | None) -> tf.Tensor | None:
    """`a and b` of two optional bool scalars (None: true)."""
    if a is None or b is None:
        return b if a is None else a
    return tf.logical_and(a, b)


def _add(grads: Sequence[tf.Tensor], more: Sequence[tf.Tensor | None] | None) -> list[tf.Tensor]:
    if more is None:
        return list(grads)
    return [g if r is None else g + r for g, r in zip(grads, more)]


class _Aggregated:
    """The aggregated rule's methods, mixed into `AggregatedRule` (which holds its state)."""

    heads: tuple[str, ...]
    policy: TrunkPolicy
    optimizer: keras.optimizers.Optimizer
    aggregator: Aggregator
    weighting: LossWeighting | None
    rng: tf.random.Generator
    var_list: tuple[keras.Variable, ...]
    aggregator_for: Callable[[tuple[str, ...]], Aggregator]

    def weigh(self, weighted: Mapping[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], Any]:
        """Under a loss weighting: each aggregated head's factor, and (the stacked weighted
        losses, the factors, the weighting's own objective) for `apply`."""
        if self.weighting is None:
            if self.aggregator.log_losses:  # every aggregated head descends log(L + 1e-8)
                return {h: log_loss_factor(weighted[h]) for h in self.heads if h in weighted}, None
            return {}, None
        names = tuple(h for h in self.heads if h in weighted)
        if names != self.heads:
            self.aggregator_for(names)  # raises: a loss weighting weighs all heads
        task = tf.stack([weighted[h] for h in self.heads])
        factors = converted(self.weighting.weights)(task)
        return ({h: factors[i] for i, h in enumerate(self.heads)},
                (task, factors, converted(self.weighting.objective)(task)))

    def loss_factors(self, weighted: Mapping[str, tf.Tensor]) -> LossFactors:
        """Inside the forward pass: `weigh`'s factors, and under a loss weighting what it
        saw and computed (the stacked weighted losses, its factors, its own objective)."""
        factors, seen = self.weigh(weighted)
        if seen is None:
            return LossFactors(factors)
        return LossFactors(factors, *seen)

    def replica_gradients(self, heads: Sequence[StepObjective], backward: Backward,
                          trunk_reg: tf.Tensor | float, trunk_variables: Sequence[keras.Variable],
                          ) -> tuple[dict[str, list[Any]], Any]:
        """Under a strategy: every head's gradient (aggregated heads: on trunk + own
        variables, from one backward pass) and the trunk regularization's."""
        trunk_vars = list(trunk_variables)
        grads = {}
        for head in heads:
            if head.trains_trunk:
                grads[head.name] = backward.head(head, trunk_vars + list(head.var_list), len(trunk_vars))
            else:
                grads[head.name] = backward.head(head, head.var_list)
        reg = None if isinstance(trunk_reg, float) else backward.gradient(trunk_reg, trunk_vars)
        return grads, reg

    def plan(self, heads_pass: HeadsPass) -> list[PlannedUpdate]:
        """The trunk optimizer applies the aggregate of the heads' trunk gradients; each
        aggregated head's optimizer its own variables; the other heads as per head. A linear
        combination on a step that needs no per-head trunk gradient takes one backward pass
        (`multihead.step.one_pass`), else one per head."""
        p = heads_pass
        agg = [h for h in p.heads if h.trains_trunk]
        rest = [h for h in p.heads if not h.trains_trunk]
        replica_grads = p.given[0] if p.given is not None else None
        weights = (one_pass.linear_weights(self.aggregator_for(tuple(h.name for h in agg)),
                                           self.weighting, len(agg))
                   if self.one_pass and not self.policy.rep_grad
                   and one_pass.takes_one_pass(p, agg) else None)
        if weights is None:
            plans = self._per_head_plans(p, agg)
        else:
            plans = one_pass.one_pass_plans(p, agg, weights, self.optimizer, self.var_list,
                                            self.weighting, lambda: self._per_head_plans(p, agg))
        return plans + head_plans(rest, p._replace(given=replica_grads))

    def _per_head_plans(self, p: HeadsPass, agg: Sequence[StepObjective]) -> list[PlannedUpdate]:
        """The trunk's plan, then each head of `agg`'s, from one backward pass per head."""
        trunk_vars = list(p.trunk_variables)
        replica_grads, reg_grads = p.given if p.given is not None else (None, None)
        rep_grad = self.policy.rep_grad and replica_grads is None
        sources = tf.nest.flatten(p.features) if rep_grad else trunk_vars
        n = len(sources)
        trunk_parts, own, finite = [], {}, {}
        for head in agg:  # one backward pass per head gives both parts
            g = (replica_grads[head.name] if replica_grads is not None
                 else p.backward.head(head, sources + list(head.var_list), n))
            trunk_parts.append(g[:n])
            own[head.name] = g[n:]
            finite[head.name] = all_finite(p.losses[head.name], g) if head.guarded else None
        if reg_grads is None and p.backward is not None and not isinstance(p.trunk_reg, float):
            reg_grads = p.backward.gradient(p.trunk_reg, trunk_vars)

        losses = None
        if self.aggregator.needs_losses and not self.aggregator.log_losses:
            # The loss whose gradient each head's trunk gradient is: weight x loss (x the
            # loss weighting's factor, held constant, under one).
            losses = [h.weight(p.step) * p.losses[h.name] for h in agg]
            if self.weighting is not None:
                factors = p.loss_factors.weights
                losses = [loss * factors[self.heads.index(h.name)] for loss, h in zip(losses, agg)]

        def trunk_gradients(members: Sequence[int], without: tf.Tensor | None = None,
                            ) -> _TrunkStep:
            return self._trunk_gradients(
                p, [agg[i] for i in members], [trunk_parts[i] for i in members], sources,
                trunk_vars, reg_grads, rep_grad,
                None if losses is None else tf.stack([losses[i] for i in members]), without,
                everyone=tuple(h.name for h in agg))

        due = {h.name: _both(finite[h.name], p.is_due(h.name)) for h in agg}
        plans = [self._trunk_plan(agg, due, trunk_gradients, p.stats)] if agg else []
        for head in agg:  # head variables only: their var_list excludes the trunk
            plans.append(PlannedUpdate(head.optimizer, own[head.name], head.var_list, head.name,
                                       head.guarded, p.losses[head.name], finite[head.name],
                                       due=p.is_due(head.name)))
        return plans

    def _trunk_plan(self, agg: Sequence[StepObjective], due: Mapping[str, tf.Tensor | None],
                    trunk_gradients: Callable[..., _TrunkStep],
                    stats: StepStats | None = None) -> PlannedUpdate:
        """The trunk update over the heads that are due with a finite loss and gradient
        (`due`, None: always): all of them; all but one (the aggregate of the others, as a
        step without it); else none.

        The graph holds two aggregations, not one per head: that of every head, and that of
        all but one head whose position is a tensor (`_combine`'s `without`). The
        aggregator's state is written once, after the choice."""
        k = len(agg)
        everyone = list(range(k))
        plan = PlannedUpdate(self.optimizer, lambda: self._commit(trunk_gradients(everyone)),
                             self.var_list)
        if all(due[h.name] is None for h in agg):
            return plan
        due_flags = tf.stack([tf.constant(True) if due[h.name] is None else due[h.name] for h in agg])
        bad = k - tf.reduce_sum(tf.cast(due_flags, tf.int32))
        if k == 1 or self.weighting is not None:  # a loss weighting weighs all heads or none
            return plan._replace(due=tf.equal(bad, 0))
        names = tuple(h.name for h in agg)

        def chosen() -> list[tf.Tensor]:
            first_bad = tf.argmin(tf.cast(due_flags, tf.int32), output_type=tf.int32)
            if self._without_one(names) is not None:
                # Lowered, as the Case below: kept functional, its branches would be optimised
                # apart from the step, and the update of a finite step rounded otherwise.
                return self._commit(step_stats.cond(
                    stats, tf.equal(bad, 0), lambda: trunk_gradients(everyone),
                    lambda: trunk_gradients(everyone, first_bad)))
            # Per-head options (fixed weights): one traced step per subset (`_without_one`).
            # 0: every head; 1 + i: all but head i, the one non-finite head
            index = tf.where(tf.equal(bad, 0), 0, 1 + first_bad)
            branches = [lambda: trunk_gradients(everyone)] + [
                lambda i=i: trunk_gradients([j for j in range(k) if j != i]) for i in range(k)]
            if stats is None:
                return self._commit(tf.switch_case(index, branches))
            return self._commit(stats.switch_case(index, branches))

        return plan._replace(gradients=chosen, due=tf.less_equal(bad, 1))

    def _commit(self, step: _TrunkStep) -> WithState:
        """The trunk optimizer's gradients of `step`, with the aggregator's and the loss
        weighting's new state, which the applier writes."""
        writes = self.aggregator_state.writes(step.state) if step.state else []
        return WithState(step.gradients, writes + list(step.weighting))

    def _without_one(self, names: tuple[str, ...]) -> Aggregator | None:
        """The aggregator of a step of `names` less one head whose position is known only
        in the graph: the method itself, when it has no per-head options; None when it has
        (`for_heads` overridden, e.g. fixed weights): then each subset's step is traced,
        its options numbers in the graph as in a trainer of those heads alone, which the
        graph's optimisations round alike (a weight chosen by a tensor rounds otherwise)."""
        method = self.aggregator_for(names)
        return method if type(method).for_heads is Aggregator.for_heads else None

    def _trunk_gradients(self, p: HeadsPass, agg: Sequence[StepObjective],
                         trunk_parts: Sequence[Sequence[tf.Tensor | None]], sources: Sequence[Any],
                         trunk_vars: list[keras.Variable],
                         reg_grads: Sequence[tf.Tensor | None] | None, rep_grad: bool,
                         losses: tf.Tensor | None = None,
                         without: tf.Tensor | None = None,
                         everyone: tuple[str, ...] = ()) -> _TrunkStep:
        """The trunk optimizer's gradients (on `var_list`) from the aggregate of `agg`
        (less the head at position `without`, a tensor, unless None) and the aggregator's
        new state, and the loss weighting's; logs the aggregation."""
        names = tuple(h.name for h in agg)
        c = self._combine(names, trunk_parts, sources, losses, without)
        combined, weights, projections, gram, stacked = (c.directions, c.weights, c.projections,
                                                         c.gram, c.stacked)
        if rep_grad:
            trunk_grads = p.backward.gradient(tf.nest.flatten(p.features), trunk_vars,
                                              output_gradients=combined)
            trunk_grads = [g if g is not None else tf.zeros_like(v)
                           for g, v in zip(trunk_grads, trunk_vars)]
        else:
            trunk_grads = combined
        trunk_grads = _add(trunk_grads, reg_grads)
        extra_grads: list[Any] = []
        factors, weighting_writes = None, ()
        if self.weighting is not None:
            task, factors = p.loss_factors.losses, p.loss_factors.weights
            if p.loss_factors.objective is not None:
                extra_grads = p.backward.gradient(p.loss_factors.objective,
                                                  list(self.var_list[len(trunk_vars):]))
            unweighted = None
            if self.weighting.needs_grad_norms:  # the Gramian saw weighted gradients: unweight
                norms = tf.sqrt(tf.maximum(tf.linalg.diag_part(gram), 0.0))
                unweighted = tf.math.divide_no_nan(norms, factors)
            # The weighting's state is not among the variables the trunk optimizer writes.
            weighting_writes = converted(self.weighting.update)(task, unweighted) or ()
        if p.stats is not None:
            self._log_aggregation(p.stats, everyone or names, names, weights, factors, gram,
                                  stacked, projections, trunk_grads, c.keep)
        return _TrunkStep(list(trunk_grads) + list(extra_grads), c.state, tuple(weighting_writes))

    def summary_tags(self) -> list[str]:
        """The tags `_log_aggregation` writes on logging steps (all heads in the step)."""
        names = self.heads
        written = [tags.AGG_UPDATE_NORM]
        if not isinstance(self.aggregator, CoordinatewiseAggregator):  # no row weights
            written += [tags.agg_weight(h) for h in names]
        if self.weighting is not None:
            written += [tags.agg_loss_weight(h) for h in names]
        written += [tags.agg_trunk_grad_norm(h) for h in names]
        written += [tags.agg_cosine(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        if self.aggregator.counts_projections:
            written.append(tags.AGG_PROJECTIONS)
        return written

    def _log_aggregation(self, stats: StepStats, everyone: Sequence[str], names: Sequence[str],
                         weights: tf.Tensor | None, factors: tf.Tensor | None,
                         gram: tf.Tensor | None, stacked: Sequence[tf.Tensor],
                         projections: tf.Tensor, trunk_grads: Sequence[tf.Tensor],
                         keep: tf.Tensor | None = None) -> None:
        """Measures the aggregation of `names`, or of its heads at positions `keep` (a tensor:
        the heads of the step are known only in the graph), on scalar logging steps. Each
        branch of the step's choice of heads records the tags of `everyone`, a head it left
        out as not present."""
        total = len(everyone)
        position = [everyone.index(h) for h in names]
        index = None  # the positions in `everyone` of the aggregated rows; None: all, in order
        if keep is not None:
            index = tf.gather(tf.constant(position, tf.int32), keep)
        elif position != list(range(total)):
            index = tf.constant(position, tf.int32)

        def full(values: tf.Tensor) -> tf.Tensor:  # rows of the aggregated heads -> of everyone
            return values if index is None else tf.scatter_nd(index[:, None], values, [total])

        def log() -> None:
            # Constant weights need no Gramian to step: compute it on logging steps only.
            g = gram if gram is not None else gramian(stacked)
            n = tf.sqrt(tf.maximum(tf.linalg.diag_part(g), 0.0))
            cos = tf.math.divide_no_nan(g, n[:, None] * n[None, :])
            if index is None:
                present = [True] * total
            else:
                cos = tf.scatter_nd(tf.stack(tf.meshgrid(index, index, indexing="ij"), -1), cos,
                                    [total, total])
                present = tf.unstack(full(tf.ones_like(index)) > 0, num=total)
            head_rows = [(tags.agg_trunk_grad_norm, n)]
            if weights is not None:  # coordinate-wise aggregators have no row weights
                head_rows.append((tags.agg_weight, weights))
            if factors is not None:
                head_rows.append((tags.agg_loss_weight, factors))
            for tag, values in head_rows:
                values = tf.unstack(full(tf.cast(values, tf.float32)), num=total)
                for i, head in enumerate(everyone):
                    stats.record(tag(head), values[i], present[i])
            for i, a in enumerate(everyone):
                for j in range(i + 1, total):
                    both = (True if index is None
                            else tf.logical_and(present[i], present[j]))
                    stats.record(tags.agg_cosine(a, everyone[j]), cos[i, j], both)
            if self.aggregator.counts_projections:
                stats.record(tags.AGG_PROJECTIONS, projections)
            stats.record(tags.AGG_UPDATE_NORM, tf.sqrt(tf.add_n(
                [tf.reduce_sum(tf.square(g)) for g in trunk_grads])))

        stats.gated(stats.scalars_due, log)  # nothing at all in the step that does not log

    def _combine(self, names: tuple[str, ...], per_head: Sequence[Sequence[tf.Tensor | None]],
                 sources: Sequence[Any], losses: tf.Tensor | None = None,
                 without: tf.Tensor | None = None) -> _Combined:
        """The heads' gradients of `sources` combined by the aggregator's weights, with what
        the step logs and the aggregator's new state (`_Combined`). `losses`: the heads'
        losses, for an aggregator that reads them (`needs_losses`). `without`: the position
        in `names` of a head left out (an int32 scalar tensor), or None.

        Without a head, the other heads' rows are gathered into `K - 1` rows and aggregated
        exactly as a step of those heads alone: the same shapes, hence the same ops."""
        keep = None
        positions: Any = self._indices(names)
        aggregator = self.aggregator_for(names)
        if without is not None:
            assert self._without_one(names) is not None, "_trunk_plan traces each subset for it"
            keep = all_but(len(names), without)
            positions = tf.gather(positions, keep)
        k = len(names) - (without is not None)
        # Few heads: pairwise inner products and a direct weighted sum, no K x n copies.
        pairwise = k <= _PAIRWISE_MAX_HEADS
        stacked = [stack_rows([g[j] for g in per_head], t) for j, t in enumerate(sources)]
        if keep is not None:
            stacked = [tf.gather(s, keep) for s in stacked]
            per_head = split_rows(stacked, per_head, sources, k)
            if losses is not None:
                losses = tf.gather(losses, keep)
        dtype = tf.as_dtype(self.policy.dtype)
        state = self.aggregator_state if aggregator.stateful else None
        buffered = isinstance(aggregator, BufferedAggregator)
        result = converted(run_aggregator)(
            aggregator, stacked, dtype,
            gram=lambda: (pairwise_gramian(per_head, dtype) if pairwise
                          else gramian(stacked, dtype)),
            draws=step_draws(aggregator, self.rng, k),
            block_noise=self.rng.uniform,
            state=state.read(positions) if state is not None else None,
            buffers=state.read_buffers(positions) if buffered else None,
            losses=losses,
            want_gram=self.weighting is not None and self.weighting.needs_grad_norms)
        new_state: dict[str, Any] = {}
        if state is not None:
            if result.state is not None:
                new_state.update(state.updated(positions, result.state))
            if buffered:
                new_state.update(state.updated_buffers(positions, result.buffers))
        if result.directions is not None:  # coordinate-wise and buffered methods: per block
            combined = [tf.reshape(tf.cast(d, s.dtype), tf.shape(t))
                        for d, s, t in zip(result.directions, stacked, sources)]
            weights = None if result.weights is None else tf.cast(result.weights, tf.float32)
            return _Combined(combined, weights, result.projections, None, stacked, new_state, keep)
        gram = result.gram
        weights = result.weights
        if weights.dtype != tf.float32:  # float64 analysis: combine in the variables' dtype
            weights = tf.cast(weights, stacked[0].dtype if stacked else tf.float32)
        static = tf.get_static_value(weights)
        if static is not None or pairwise:  # then `stacked` is only read on logging steps
            terms = static.tolist() if static is not None else tf.unstack(weights, num=k)
            combined = [weighted_sum([g[j] for g in per_head], terms, t)
                        for j, t in enumerate(sources)]
        else:
            combined = [tf.reshape(tf.linalg.matvec(s, weights, transpose_a=True), tf.shape(t))
                        for s, t in zip(stacked, sources)]
        return _Combined(combined, weights, result.projections, gram, stacked, new_state, keep)


class _TrunkStep(NamedTuple):
    """The trunk optimizer's gradients of a step, the aggregator's new state (entry -> its
    whole new value, a list for a buffer; empty: stateless), written after the step chose
    among its aggregations, and the loss weighting's (`StateWrites`; only in a step that
    has one aggregation: a weighting weighs all heads or none)."""

    gradients: list[Any]
    state: dict[str, Any]
    weighting: tuple[Any, ...] = ()


class _Combined(NamedTuple):
    """What `_combine` gives: the combined gradient per source; the weights (None for
    coordinate-wise methods), projections and Gramian (None: not computed) the step logs;
    the `K x n` stacks; the aggregator's new state (as `_TrunkStep.state`); the positions
    of the heads aggregated when one was left out, else None."""

    directions: list[tf.Tensor]
    weights: tf.Tensor | None
    projections: tf.Tensor
    gram: tf.Tensor | None
    stacked: list[tf.Tensor]
    state: dict[str, Any]
    keep: tf.Tensor | None


class AggregatedRule(_Aggregated, tf.Module):
    """The state of the aggregated trunk update, for checkpoints: optimizer, loss weighting, RNG.

    Checkpointing it (`tf.train.Checkpoint(trunk_update=trainer.trunk_update)`,
    or the `trunk_update` part of `multihead.io.checkpoints`) saves the trunk
    optimizer (its slots, its iteration count and, as every Keras optimizer
    tracks them, the variables it was built on), the loss weighting's variables
    (e.g. the uncertainty log-variances), a stateful aggregator's state
    (`aggregator_state`: a method's declared state, and a `BufferedAggregator`'s `K x D`
    buffers, one variable per trunk variable, keyed `<buffer>/<index in
    model.trunk_variables>`) and the generator of the random methods.

    Attributes:
        policy: the `TrunkPolicy`.
        optimizer: the trunk optimizer, built on `var_list`.
        aggregator: the gradient aggregator (the policy's method object).
        weighting: the loss weighting (this run's, with its variables), or None.
        heads: names of the aggregated heads (those that train the trunk), in order.
        rng: generator of PCGrad's projection orders.
        var_list: what the optimizer is built on (trunk + weighting variables).
        one_pass: a linear combination takes one backward pass on steps that need no
            per-head trunk gradient (`StepOptions.one_pass_backward`).
    """

    _TF_MODULE_IGNORED_PROPERTIES = frozenset({"var_list", "policy", "_subsets"})

    def __init__(self, policy: TrunkPolicy, heads: Sequence[str],
                 optimizer: keras.optimizers.Optimizer, one_pass: bool = True) -> None:
        super().__init__(name="trunk_update")
        self.policy = policy
        self.one_pass = one_pass
        self.heads = tuple(heads)
        self.optimizer = optimizer
        k = len(self.heads)
        self.aggregator: Aggregator = policy.method
        self.aggregator.check_heads(k)
        self.weighting: LossWeighting | None = policy.build_loss_weighting(k)
        self.rng = tf.random.Generator.from_seed(policy.seed)
        if self.aggregator.stateful:  # only then: stateless runs keep their checkpoint keys
            self.aggregator_state = AggregatorState(self.aggregator, k, policy.dtype)
        # Not a dependency of this module itself (the optimizer already tracks its variables).
        self.var_list: tuple[keras.Variable, ...] = self._no_dependency(())
        # Aggregated head names -> the aggregator of that subset (partial steps, a head
        # dropped as non-finite): built at trace time, one per subset.
        self._subsets: dict[tuple[str, ...], Aggregator] = self._no_dependency({})

    heads_update_trunk = False

    def _indices(self, names: tuple[str, ...]) -> list[int]:
        return [self.heads.index(h) for h in names]

    def aggregator_for(self, names: tuple[str, ...]) -> Aggregator:
        """The aggregator of the subset `names` of the aggregated heads (the policy's
        aggregator and options; fixed `weights` restricted to the subset)."""
        if names == self.heads:
            return self.aggregator
        if names not in self._subsets:
            if self.weighting is not None:
                raise ValueError(
                    f"a step of some heads only ({list(names)}) cannot use the loss weighting "
                    f"{self.weighting.label!r}: it weighs all {list(self.heads)} together")
            self._subsets[names] = self.aggregator.for_heads(self._indices(names))
        return self._subsets[names]

    def step_heads(self, heads: tuple[str, ...], frozen: Sequence[str]) -> tuple[str, ...]:
        """The heads a step of `heads` is compiled for while `frozen` are frozen (known on
        the host, unlike a non-finite drop): `heads` while `plan` drops them in the graph
        (at most one frozen aggregated head; any under a loss weighting, which weighs all
        heads or none, so the trunk is not updated then); else, with two or more frozen
        aggregated heads, `heads` less the frozen ones: a step of that subset, compiled
        once per such set, whose trunk moves exactly as without those heads."""
        dropped = [h for h in heads if h in frozen]
        if (self.weighting is not None or len(dropped) == len(heads)
                or sum(h in self.heads for h in dropped) < 2):
            return heads
        return tuple(h for h in heads if h not in frozen)

    @classmethod
    def create(cls, trunk: Any, objectives: Mapping[str, Objective], options: StepOptions,
               head_optimizers: Mapping[str, keras.optimizers.Optimizer]) -> AggregatedRule | None:
        """Validates `trunk` against the heads and the step's options (early, at
        construction); None for `per_head`."""
        policy = resolve_trunk(trunk)
        if policy is None:
            return None
        check_trunk_aggregation(options.schedule,
                                {h: (o.trains_trunk, o.every) for h, o in objectives.items()}, PYTHON)
        heads = [h for h, o in objectives.items() if o.trains_trunk]
        optimizer = resolve_optimizer(policy.optimizer, "trunk")
        for head, opt in head_optimizers.items():
            if opt is optimizer:
                raise ValueError(
                    f"the trunk optimizer is head {head!r}'s optimizer object; give the trunk its own"
                )
        return cls(policy, heads, optimizer, options.one_pass_backward)

    def build(self, trunk_variables: Sequence[keras.Variable]) -> None:
        """Builds the optimizer eagerly on the trunk variables + the weighting's trainable ones."""
        extra = list(self.weighting.trainable_variables) if self.weighting else []
        var_list = list(trunk_variables) + extra
        if self.optimizer.built:
            built_on = [id(v) for v in internals.built_variables(self.optimizer)]
            if built_on != [id(v) for v in var_list]:
                raise ValueError(
                    "the trunk optimizer was already built on other variables; pass a fresh optimizer"
                )
        else:
            self.optimizer.build(var_list)
        self.var_list = self._no_dependency(tuple(var_list))
        if self.aggregator.buffers:
            self.aggregator_state.build_buffers(list(trunk_variables))
