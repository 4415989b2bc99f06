"""The aggregated trunk update: one trunk optimizer fed by a combination of the heads' gradients.

With the default `trunk="per_head"` each head's optimizer updates the trunk with
its own slots (`multihead.core.step.TrainStep`). With a `TrunkPolicy`:

* each head's optimizer is built on the head's own variables only;
* one trunk optimizer, built on the trunk variables (plus a loss-weighting
  scheme's trainable variables, e.g. uncertainty log-variances), applies
  `d = sum_k w_k g_k`, the aggregate of the heads' trunk gradients `g_k`
  (weights `w` from `multihead.aggregation.aggregators`), plus the gradient of the trunk's
  own regularisation losses (added once, not aggregated: it is no head's task).

Two ways to get the `g_k`:

* parameter space (default): one `tape.gradient` per head on trunk + head
  variables; the weights come from the Gramian summed over trunk variables.
* `rep_grad=True` (Sener & Koltun's MGDA-UB): each head's gradient is taken at
  the trunk output only (a head-sized backward pass), the weights come from the
  Gramian of those, they are combined there, and one trunk backward pass
  (`output_gradients=`) gives `d`. Valid where the weights stay meaningful:
  constant weights (identical result), `mgda` (the paper's upper bound),
  `imtl` (the paper works on shared features) and the loss weightings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import keras
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead.core import distribute, updates
from multihead.aggregation.aggregators import (
    AGGREGATORS,
    REP_GRAD_AGGREGATORS,
    Aggregator,
    get_aggregator,
)
from multihead.aggregation.loss_weighting import (
    LOSS_WEIGHTINGS,
    LossWeighting,
    check_loss_weighting_options,
    make_loss_weighting,
)
from multihead.core.model import MultiHeadModel
from multihead.monitoring.monitor import Monitor, write_scalar
from multihead.core.objectives import Objective, OptimizerSpec, resolve_optimizer
from multihead.core.step import HeadUpdate, TrainStep, _regularization

PER_HEAD = "per_head"

#: Up to this many heads the Gramian is summed from pairwise inner products and the
#: heads' gradients are combined by a direct weighted sum; above, from `K x n` stacks
#: (one matmul each). Measured (4 trunk variables, 82k parameters): K=2 30 vs 90 us,
#: K=3 70 vs 90 us, K=4 160 vs 150 us.
_PAIRWISE_MAX_HEADS = 3

#: Every name `TrunkPolicy(aggregator=...)` accepts.
TRUNK_AGGREGATORS = AGGREGATORS + LOSS_WEIGHTINGS


@dataclasses.dataclass(frozen=True)
class TrunkPolicy:
    """One trunk optimizer applying an aggregate of the heads' trunk gradients.

    Example:
        >>> import multihead as mh
        >>> policy = mh.TrunkPolicy(optimizer="adam", aggregator="pcgrad")
        >>> policy = mh.TrunkPolicy(aggregator="cagrad", options={"c": 0.5})
        >>> policy = mh.TrunkPolicy(aggregator="mgda", rep_grad=True)   # MGDA-UB

    Args:
        optimizer: the trunk optimizer (Keras object, name or serialization dict).
        aggregator: a gradient aggregator (`sum`, `mean`, `weights`, `pcgrad`,
            `mgda`, `cagrad`, `upgrad`, `imtl`) or a loss weighting
            (`uncertainty`, `gradnorm`, `dwa`, whose trunk aggregate is the sum
            of the weighted heads' gradients).
        options: the aggregator's options (`{"weights": [...]}`, `{"c": 0.4}`,
            `{"alpha": 1.5}`, ...).
        rep_grad: combine the heads' gradients at the trunk output (MGDA-UB).
        seed: seed of the PCGrad projection order (a generator owned by this
            trainer; no global random state).
    """

    optimizer: OptimizerSpec = "adam"
    aggregator: str = "sum"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rep_grad: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.aggregator not in TRUNK_AGGREGATORS:
            from difflib import get_close_matches

            close = get_close_matches(str(self.aggregator), TRUNK_AGGREGATORS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"trunk aggregator {self.aggregator!r} is unknown{hint}; choose one of "
                f"{list(TRUNK_AGGREGATORS)}"
            )
        if not isinstance(self.options, Mapping):
            raise TypeError(f"trunk options must be a mapping, got {self.options!r}")
        if not isinstance(self.rep_grad, bool):
            raise TypeError(f"trunk rep_grad must be True or False, got {self.rep_grad!r}")
        if self.is_loss_weighting:
            check_loss_weighting_options(self.aggregator, **self.options)
        else:
            agg = get_aggregator(self.aggregator, **self.options)
            if self.rep_grad and not agg.rep_grad:
                raise ValueError(
                    f"trunk aggregator {self.aggregator!r} cannot use rep_grad=True: it needs the "
                    "heads' gradients in parameter space (its guarantee is about the update of the "
                    "trunk's variables, not of its output); set rep_grad: false, or use one of "
                    f"{list(REP_GRAD_AGGREGATORS + LOSS_WEIGHTINGS)}"
                )

    @property
    def is_loss_weighting(self) -> bool:
        """True for `uncertainty`, `gradnorm`, `dwa`."""
        return self.aggregator in LOSS_WEIGHTINGS


def resolve_trunk(trunk: str | TrunkPolicy | Mapping[str, Any] | None) -> TrunkPolicy | None:
    """`"per_head"` (or None) -> None; a mapping -> `TrunkPolicy(**mapping)`; a policy as is."""
    if trunk is None or trunk == PER_HEAD:
        return None
    if isinstance(trunk, TrunkPolicy):
        return trunk
    if isinstance(trunk, Mapping):
        fields = {f.name for f in dataclasses.fields(TrunkPolicy)}
        unknown = [k for k in trunk if k not in fields]
        if unknown:
            raise ValueError(f"trunk has no key {unknown[0]!r}; its keys are {sorted(fields)}")
        return TrunkPolicy(**trunk)
    raise ValueError(
        f"trunk must be 'per_head', a multihead.TrunkPolicy or a dict of its fields, got {trunk!r}"
    )


class TrunkUpdate(tf.Module):
    """The state of the aggregated trunk update, for checkpoints: optimizer, loss weighting, RNG.

    Checkpointing it (`tf.train.Checkpoint(trunk_update=trainer.trunk_update)`,
    or the `trunk_update` part of `multihead.io.checkpoints`) saves the trunk
    optimizer (its slots, its iteration count and, as every Keras optimizer
    tracks them, the variables it was built on), the loss weighting's variables
    (e.g. the uncertainty log-variances) and PCGrad's generator state.

    Attributes:
        policy: the `TrunkPolicy`.
        optimizer: the trunk optimizer, built on `var_list`.
        aggregator: the validated gradient aggregator (`sum` under a loss weighting).
        weighting: the loss-weighting scheme, or None.
        heads: names of the aggregated heads (those that train the trunk), in order.
        rng: generator of PCGrad's projection orders.
        var_list: what the optimizer is built on (trunk + weighting variables).
    """

    _TF_MODULE_IGNORED_PROPERTIES = frozenset({"var_list", "policy"})

    def __init__(self, policy: TrunkPolicy, heads: Sequence[str],
                 optimizer: keras.optimizers.Optimizer) -> None:
        super().__init__(name="trunk_update")
        self.policy = policy
        self.heads = tuple(heads)
        self.optimizer = optimizer
        k = len(self.heads)
        if policy.is_loss_weighting:
            self.aggregator: Aggregator = get_aggregator("sum", num_heads=k)
            self.weighting: LossWeighting | None = make_loss_weighting(
                policy.aggregator, k, **policy.options)
        else:
            self.aggregator = get_aggregator(policy.aggregator, num_heads=k, **policy.options)
            self.weighting = None
        self.rng = tf.random.Generator.from_seed(policy.seed)
        # Not a dependency of this module itself (the optimizer already tracks its variables).
        self.var_list: tuple[keras.Variable, ...] = self._no_dependency(())

    @classmethod
    def create(cls, trunk: Any, objectives: Mapping[str, Objective], schedule: str,
               head_optimizers: Mapping[str, keras.optimizers.Optimizer]) -> TrunkUpdate | None:
        """Validates `trunk` against the heads (early, at construction); None for `per_head`."""
        policy = resolve_trunk(trunk)
        if policy is None:
            return None
        if schedule != "simultaneous":
            raise ValueError(
                f"trunk aggregation needs schedule='simultaneous' (all heads' gradients at the "
                f"same parameters), got schedule={schedule!r}"
            )
        heads = [h for h, o in objectives.items() if o.trains_trunk]
        if not heads:
            raise ValueError("trunk aggregation needs at least one head with trains_trunk=True")
        for head in heads:
            if objectives[head].every != 1:
                raise ValueError(
                    f"head {head!r} has every={objectives[head].every}: with trunk aggregation every "
                    "head that trains the trunk is aggregated on every step; set every=1, or "
                    "trains_trunk=False for a head updated less often"
                )
        optimizer = resolve_optimizer(policy.optimizer, "trunk")
        for head, opt in head_optimizers.items():
            if opt is optimizer:
                raise ValueError(
                    f"the trunk optimizer is head {head!r}'s optimizer object; give the trunk its own"
                )
        return cls(policy, heads, optimizer)

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


def _stack_rows(grads: Sequence[tf.Tensor | None], like: Any) -> tf.Tensor:
    """K gradients of one variable (None = no dependence) as a `K x n` matrix."""
    rows = [tf.reshape(g if g is not None else tf.zeros_like(like), [-1]) for g in grads]
    return tf.stack(rows)


class _Computed:
    """A stand-in tape for `TrainStep._apply` holding a head's already computed gradients.

    The trunk and head parts of a head's gradient come from one backward pass; this
    hands the head part to the base class's apply-and-monitor path without a second one.
    """

    def __init__(self, grads: Sequence[tf.Tensor | None]) -> None:
        self._grads = list(grads)

    def gradient(self, target: Any, sources: Sequence[Any]) -> list[tf.Tensor | None]:
        del target
        assert len(sources) == len(self._grads)
        return self._grads


def _weighted_sum(grads: Sequence[tf.Tensor | None], weights: Sequence[float | tf.Tensor],
                  like: Any) -> tf.Tensor:
    """`sum_k weights[k] grads[k]` (None = no dependence), without a `K x n` stack.

    `weights` are Python floats when known at trace time (a weight of 1 costs no
    multiply) or scalar tensors.
    """
    terms = [g if isinstance(w, float) and w == 1.0 else w * g
             for g, w in zip(grads, weights) if g is not None]
    return tf.add_n(terms) if terms else tf.zeros_like(like)


def _pairwise_gramian(per_head: Sequence[Sequence[tf.Tensor | None]]) -> tf.Tensor:
    """`G G^T` from the K(K+1)/2 inner products of the heads' gradients (no stacking)."""
    k = len(per_head)

    def dot(a: int, b: int) -> tf.Tensor:
        terms = [tf.reduce_sum(x * y) for x, y in zip(per_head[a], per_head[b])
                 if x is not None and y is not None]
        return tf.add_n(terms) if terms else tf.constant(0.0)

    upper = {(a, b): dot(a, b) for a in range(k) for b in range(a, k)}
    return tf.stack([tf.stack([upper[min(a, b), max(a, b)] for b in range(k)]) for a in range(k)])


def _gramian(stacked: Sequence[tf.Tensor]) -> tf.Tensor:
    """`G G^T` summed over the per-variable `K x n` blocks of G (no concatenation)."""
    return tf.add_n([tf.matmul(s, s, transpose_b=True) for s in stacked])


class AggregatedStep(TrainStep):
    """`TrainStep` whose trunk update is one optimizer applying the heads' aggregated gradient.

    Heads that do not train the trunk are updated exactly as in `TrainStep`.
    Monitoring: for each aggregated head, `monitor.head_update` receives the
    gradients of the head's *own* variables (its trunk part is empty: the
    trunk is updated once, by the trunk optimizer). The aggregation itself is
    logged as `agg_weight/<head>` (w_k), `agg_trunk_grad_norm/<head>` (|g_k|,
    in parameter space or, with `rep_grad`, at the trunk output),
    `agg_cosine/<a>__<b>` (cosine of g_a and g_b), `agg_projections` (PCGrad)
    and `agg_update_norm` (|d|), all on the monitor's logging steps only.
    """

    def __init__(self, model: MultiHeadModel, heads: Sequence[HeadUpdate], schedule: str,
                 step: tf.Variable, monitor: Monitor | None, jit_compile: bool,
                 trunk: TrunkUpdate, strategy: tf.distribute.Strategy | None = None) -> None:
        super().__init__(model, heads, schedule, step, monitor, jit_compile, strategy)
        if strategy is not None and (trunk.policy.rep_grad or trunk.weighting is not None):
            raise ValueError("trunk aggregation with rep_grad or a loss weighting is not "
                             "supported with a strategy; use a gradient aggregator")
        self._trunk = trunk
        if not trunk.var_list:
            raise ValueError("build the TrunkUpdate (trunk.build(...)) before the step")

    def _simultaneous(self, inputs: Any, targets: Any, step: tf.Tensor):
        model, trunk = self._model, self._trunk
        agg = [h for h in self._heads if h.trains_trunk]
        rest = [h for h in self._heads if not h.trains_trunk]
        trunk_vars = list(model.trunk_variables)
        weighting = trunk.weighting
        with tf.GradientTape(persistent=True) as tape:
            feats, losses = self._head_losses(inputs, targets)
            trunk_reg = _regularization(model.trunk)
            objectives = {}
            own = [h.weight * losses[h.name] for h in agg]
            task = tf.stack(own)
            loss_weights = weighting.weights(task) if weighting else None
            for i, head in enumerate(agg):
                # From the head's own loss, not `task[i]`: the gradient of a slice of a stack
                # reaches every stacked loss (as zeros), so each of the K backward passes would
                # go through all K heads (K^2 head backward passes, 1.3x the step at K=8).
                scaled = own[i] * loss_weights[i] if weighting else own[i]
                objectives[head.name] = scaled + _regularization(model.heads[head.name])
            for head in rest:
                objectives[head.name] = self._objective(head, losses[head.name], trunk_reg)
            weighting_objective = weighting.objective(task) if weighting else None

        trunk_grads, (weights, projections, gram), stacked, head_grads = self._aggregate(
            tape, agg, objectives, feats, trunk_vars)
        norms = None if gram is None else tf.sqrt(tf.maximum(tf.linalg.diag_part(gram), 0.0))
        if not isinstance(trunk_reg, float):
            reg_grads = tape.gradient(trunk_reg, trunk_vars)
            trunk_grads = [g if r is None else g + r for g, r in zip(trunk_grads, reg_grads)]
        extra_vars = trunk.var_list[len(trunk_vars):]
        extra_grads = (tape.gradient(weighting_objective, list(extra_vars))
                       if weighting_objective is not None else [])
        updates.apply_gradients(trunk.optimizer, list(trunk_grads) + list(extra_grads), trunk.var_list)
        if weighting is not None:
            unweighted = None
            if weighting.needs_grad_norms:  # the Gramian saw weighted gradients: unweight
                unweighted = tf.math.divide_no_nan(norms, loss_weights)
            weighting.update(task, unweighted)

        updated = {}
        for head in agg:  # head variables only: their var_list excludes the trunk
            self._apply(head, objectives[head.name], losses[head.name],
                        _Computed(head_grads[head.name]))
            updated[head.name] = tf.constant(True)
        updated.update(self._update_due(
            rest, step, lambda h: self._apply(h, objectives[h.name], losses[h.name], tape)))
        del tape
        if self._monitor:
            self._log_aggregation(agg, weights, loss_weights, gram, stacked, projections,
                                  trunk_grads)
        return losses, updated

    def _log_aggregation(self, agg: Sequence[HeadUpdate], weights: tf.Tensor,
                         loss_weights: tf.Tensor | None, gram: tf.Tensor | None,
                         stacked: Sequence[tf.Tensor], projections: tf.Tensor,
                         trunk_grads: Sequence[tf.Tensor]) -> None:
        trunk = self._trunk

        def log() -> None:
            # Constant weights need no Gramian to step: compute it on logging steps only.
            g = gram if gram is not None else _gramian(stacked)
            n = tf.sqrt(tf.maximum(tf.linalg.diag_part(g), 0.0))
            cos = tf.math.divide_no_nan(g, n[:, None] * n[None, :])
            for i, head in enumerate(agg):
                write_scalar(f"agg_weight/{head.name}", weights[i])
                if loss_weights is not None:
                    write_scalar(f"agg_loss_weight/{head.name}", loss_weights[i])
                write_scalar(f"agg_trunk_grad_norm/{head.name}", n[i])
            for i in range(len(agg)):
                for j in range(i + 1, len(agg)):
                    write_scalar(f"agg_cosine/{agg[i].name}__{agg[j].name}", cos[i, j])
            if trunk.aggregator.random_order:
                write_scalar("agg_projections", projections)
            write_scalar("agg_update_norm", tf.sqrt(tf.add_n(
                [tf.reduce_sum(tf.square(g)) for g in trunk_grads])))

        self._monitor.when_scalars(log)  # nothing at all in the step variant that does not log

    def _replicated_simultaneous(self, inputs: Any, targets: Any, step: tf.Tensor):
        """Under a strategy: every head's gradient all-reduced in replica context, then the
        aggregation (on the global gradients) and all updates in cross-replica context."""
        model, trunk, strategy = self._model, self._trunk, self._strategy
        agg = [h for h in self._heads if h.trains_trunk]
        rest = [h for h in self._heads if not h.trains_trunk]
        trunk_vars = list(model.trunk_variables)

        def gradients(inputs: Any, targets: Any) -> Any:
            scale = distribute.replica_scale(inputs)
            with tf.GradientTape(persistent=True) as tape:
                _, losses = self._head_losses(inputs, targets)
                trunk_reg = _regularization(model.trunk)
                has_reg = not isinstance(trunk_reg, float)
                objectives = {}
                for head in agg:
                    objectives[head.name] = (head.weight * losses[head.name]
                                             + _regularization(model.heads[head.name]))
                for head in rest:
                    objectives[head.name] = self._objective(head, losses[head.name], trunk_reg)
                objectives = {h: objective * scale for h, objective in objectives.items()}
                trunk_reg = trunk_reg * scale
            grads = {}
            for head in agg:  # trunk part and head part from one backward pass
                grads[head.name] = tape.gradient(objectives[head.name],
                                                 trunk_vars + list(head.var_list))
                if all(g is None for g in grads[head.name][: len(trunk_vars)]):
                    raise ValueError(
                        f"the loss of head {head.name!r} does not depend on the trunk: check that "
                        "the loss uses the head's output, or set trains_trunk=False for this head")
            for head in rest:
                grads[head.name] = self._gradients(head, objectives[head.name], tape)
            reg = tape.gradient(trunk_reg, trunk_vars) if has_reg else None
            del tape
            return distribute.all_reduce_sum(
                ({h: loss * scale for h, loss in losses.items()}, grads, reg))

        losses, grads, reg_grads = distribute.first_replica(
            strategy, strategy.run(gradients, (inputs, targets)))
        per_head = [grads[h.name][: len(trunk_vars)] for h in agg]
        trunk_grads, (weights, projections, gram), stacked = self._combine(agg, per_head, trunk_vars)
        if reg_grads is not None:
            trunk_grads = [g if r is None else g + r for g, r in zip(trunk_grads, reg_grads)]
        updates.apply_gradients(trunk.optimizer, list(trunk_grads), trunk.var_list)
        updated = {}
        for head in agg:  # head variables only: their var_list excludes the trunk
            self._apply_gradients(head, grads[head.name][len(trunk_vars):], losses[head.name])
            updated[head.name] = tf.constant(True)
        updated.update(self._update_due(
            rest, step, lambda h: self._apply_gradients(h, grads[h.name], losses[h.name])))
        if self._monitor:
            self._log_aggregation(agg, weights, None, gram, stacked, projections, trunk_grads)
        return losses, updated

    def _aggregate(self, tape: tf.GradientTape, agg: Sequence[HeadUpdate],
                   objectives: Mapping[str, tf.Tensor], feats: Any, trunk_vars: list[keras.Variable],
                   ) -> tuple[list[tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor | None],
                              list[tf.Tensor], dict[str, list[tf.Tensor | None]]]:
        """The aggregated trunk gradient; (weights, projections, Gramian of the heads'
        gradients or None when the aggregator needs none); the per-target `K x n` gradients;
        head -> gradients of its own variables."""
        trunk = self._trunk
        rep_grad = trunk.policy.rep_grad
        targets_k = tf.nest.flatten(feats) if rep_grad else trunk_vars
        per_head, head_grads = [], {}          # per head: grads of targets_k, and of its variables
        for head in agg:  # one backward pass per head gives both parts
            grads = tape.gradient(objectives[head.name], targets_k + list(head.var_list))
            if all(g is None for g in grads[: len(targets_k)]):
                raise ValueError(
                    f"the loss of head {head.name!r} does not depend on the trunk: check that the "
                    "loss uses the head's output, or set trains_trunk=False for this head"
                )
            per_head.append(grads[: len(targets_k)])
            head_grads[head.name] = grads[len(targets_k):]
        combined, result, stacked = self._combine(agg, per_head, targets_k)
        if rep_grad:
            trunk_grads = tape.gradient(tf.nest.flatten(feats), trunk_vars, output_gradients=combined)
            trunk_grads = [g if g is not None else tf.zeros_like(v)
                           for g, v in zip(trunk_grads, trunk_vars)]
        else:
            trunk_grads = combined
        return trunk_grads, result, stacked, head_grads

    def _combine(self, agg: Sequence[HeadUpdate], per_head: Sequence[Sequence[tf.Tensor | None]],
                 targets_k: Sequence[Any],
                 ) -> tuple[list[tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor | None],
                            list[tf.Tensor]]:
        """The heads' gradients of `targets_k` combined by the aggregator's weights;
        (weights, projections, Gramian or None); the per-target `K x n` gradients."""
        trunk = self._trunk
        k = len(agg)
        # Few heads: pairwise inner products and a direct weighted sum, no K x n copies.
        pairwise = k <= _PAIRWISE_MAX_HEADS
        stacked = [_stack_rows([g[j] for g in per_head], t) for j, t in enumerate(targets_k)]
        constant = trunk.aggregator.name in ("sum", "mean", "weights")
        needs_gram = not constant or (trunk.weighting is not None
                                      and trunk.weighting.needs_grad_norms)
        gram = None
        if needs_gram:
            gram = _pairwise_gramian(per_head) if pairwise else _gramian(stacked)
            extra = {}
            if trunk.aggregator.random_order:
                extra["order"] = tf.argsort(trunk.rng.uniform([k, k]), axis=1)
            result = trunk.aggregator(gram, **extra)
        else:
            result = trunk.aggregator(tf.zeros([k, k]))
        weights = result.weights
        static = tf.get_static_value(weights)
        if static is not None or pairwise:  # then `stacked` is only read on logging steps
            terms = static.tolist() if static is not None else tf.unstack(weights)
            combined = [_weighted_sum([g[j] for g in per_head], terms, t)
                        for j, t in enumerate(targets_k)]
        else:
            combined = [tf.reshape(tf.linalg.matvec(s, weights, transpose_a=True), tf.shape(t))
                        for s, t in zip(stacked, targets_k)]
        return combined, (weights, result.projections, gram), stacked
