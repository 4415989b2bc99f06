"""`TrunkPolicy`: how the trunk is trained when it is not trained per head. One trunk
optimizer applies an aggregate of the heads' trunk gradients; the policy names the optimizer,
the aggregation method, its options and the loss weighting, and checks them when it is made.
`multihead.step.trunk_update.AggregatedRule` carries a policy out in the step."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from multihead._checks import check_choice, describe
from multihead.aggregation.base import Aggregator
from multihead.aggregation.loss_weighting import LossWeighting
from multihead.aggregation.registry import (
    AGGREGATORS,
    LOSS_WEIGHTINGS,
    REP_GRAD_AGGREGATORS,
    AggregatorSpec,
    LossWeightingSpec,
    from_registered,
    make_loss_weighting,
    resolve_aggregator,
)
from multihead.objectives.objective import OptimizerSpec
from multihead.settings import SettingError, setting

#: `trunk="per_head"`: every head's optimizer trains the trunk (the default; no policy).
PER_HEAD = "per_head"

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
        >>> policy = mh.TrunkPolicy(aggregator="pcgrad", loss_weighting="uncertainty")

    Args:
        optimizer: the trunk optimizer (Keras object, name or serialization dict).
        aggregator: the gradient aggregator: a name from `multihead.AGGREGATORS`, an
            instance of a `multihead.Aggregator` base (a user's method too), or
            `{"class_name": "package>Name", "config": {...}}` naming a class registered
            with `keras.saving.register_keras_serializable`. The name of a loss
            weighting (`aggregator="uncertainty"`) means that loss weighting with `sum`.
        options: a named aggregator's options (`{"weights": [...]}`, `{"c": 0.4}`, ...);
            with a loss weighting's name as `aggregator`, that weighting's options.
        rep_grad: combine the heads' gradients at the trunk output (MGDA-UB).
        seed: seed of the random draws of `pcgrad`, `gradvac`, `random`,
            `graddrop` and `rlw` (a generator owned by this trainer, checkpointed
            with it; no global random state).
        dtype: precision of the Gramian, the weights' solve and the aggregator's
            state: `"float32"` (default) or `"float64"`, for analysis (the
            combined gradient keeps the variables' dtype).
        loss_weighting: a loss weighting that scales the heads' losses before the
            aggregator combines their trunk gradients: a name from
            `multihead.LOSS_WEIGHTINGS`, a `multihead.LossWeighting` instance (used by
            one Trainer only: it holds that run's state), or a registered-class mapping.
        loss_weighting_options: a named loss weighting's options.
    """

    optimizer: OptimizerSpec = "adam"
    aggregator: AggregatorSpec = "sum"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rep_grad: bool = False
    seed: int = 0
    dtype: str = "float32"
    loss_weighting: LossWeightingSpec | None = None
    loss_weighting_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # Each check runs under the field it judges: an error names that field
        # (`SettingError.field`), which the config layer maps to its key path.
        with setting("trunk.options"):
            if not isinstance(self.options, Mapping):
                raise TypeError(f"TrunkPolicy.options: expected a mapping, got {describe(self.options)}")
        with setting("trunk.loss_weighting_options"):
            if not isinstance(self.loss_weighting_options, Mapping):
                raise TypeError("TrunkPolicy.loss_weighting_options: expected a mapping, got "
                                f"{describe(self.loss_weighting_options)}")
        with setting("trunk.aggregator"):
            if isinstance(self.aggregator, str) and self.aggregator in LOSS_WEIGHTINGS:
                # `aggregator: uncertainty` (the form configs have used): that weighting under `sum`.
                if self.loss_weighting is not None:
                    raise ValueError(f"TrunkPolicy.aggregator: {self.aggregator!r} is a loss "
                                     "weighting and loss_weighting is given too; name an "
                                     "aggregator there")
                object.__setattr__(self, "loss_weighting", self.aggregator)
                object.__setattr__(self, "loss_weighting_options", dict(self.options))
                object.__setattr__(self, "aggregator", "sum")
                object.__setattr__(self, "options", {})
            if isinstance(self.aggregator, str):
                check_choice(self.aggregator, "TrunkPolicy.aggregator", TRUNK_AGGREGATORS)
            elif not isinstance(self.aggregator, (Aggregator, Mapping)):
                raise TypeError("TrunkPolicy.aggregator: expected a name, a multihead.Aggregator "
                                f"instance or a registered-class mapping, got {describe(self.aggregator)}")
        check_choice(self.dtype, "TrunkPolicy.dtype", ("float32", "float64"),
                     error=functools.partial(SettingError, "trunk.dtype"))
        check_choice(self.rep_grad, "TrunkPolicy.rep_grad", (True, False),
                     error=functools.partial(SettingError, "trunk.rep_grad"))
        named = isinstance(self.aggregator, str)
        with setting("trunk.options" if named or self.options else "trunk.aggregator"):
            # a name's options go to its constructor; an instance or mapping takes none
            agg = resolve_aggregator(self.aggregator, self.options, what="TrunkPolicy.aggregator")
        object.__setattr__(self, "_method", agg)
        weighting = self.loss_weighting
        with setting("trunk.loss_weighting"):
            if isinstance(weighting, str):
                check_choice(weighting, "TrunkPolicy.loss_weighting", LOSS_WEIGHTINGS)
            elif isinstance(weighting, Mapping):
                from_registered(weighting, LossWeighting, "TrunkPolicy.loss_weighting")
            elif weighting is not None and not isinstance(weighting, LossWeighting):
                raise TypeError("TrunkPolicy.loss_weighting: expected a name, a "
                                "multihead.LossWeighting instance or a registered-class "
                                f"mapping, got {describe(weighting)}")
            if weighting is not None and agg.log_losses:
                raise ValueError(
                    f"trunk aggregator {agg.label!r} scales the losses itself (each head descends "
                    f"log(L + 1e-8)); it does not compose with the loss weighting {weighting!r}")
        with setting("trunk.loss_weighting_options"):
            if isinstance(weighting, str):
                make_loss_weighting(weighting, **self.loss_weighting_options)  # validates only
            elif weighting is not None and self.loss_weighting_options:
                raise ValueError("TrunkPolicy.loss_weighting_options: options go to the "
                                 "constructor of a loss weighting instance or in its mapping's config")
        if self.rep_grad and agg.buffers:
            raise SettingError("trunk.rep_grad",
                f"trunk aggregator {agg.label!r} cannot use rep_grad=True: it keeps a "
                "running copy of the heads' gradients of the trunk's variables (as LibMTL, "
                "which refuses it too); set rep_grad: false")
        if self.rep_grad and not agg.rep_grad:
            raise SettingError("trunk.rep_grad",
                f"trunk aggregator {agg.label!r} cannot use rep_grad=True: it needs the "
                "heads' gradients in parameter space (its guarantee is about the update of the "
                "trunk's variables, not of its output); set rep_grad: false, or use one of "
                f"{list(REP_GRAD_AGGREGATORS + LOSS_WEIGHTINGS)}"
            )

    @property
    def method(self) -> Aggregator:
        """The validated aggregator (shared by every trunk update of this policy: a method
        object holds options only; its state lives in each trunk update)."""
        return self._method  # type: ignore[attr-defined]

    @property
    def is_loss_weighting(self) -> bool:
        """True when a loss weighting scales the heads' losses."""
        return self.loss_weighting is not None

    @property
    def loss_weighting_label(self) -> str | None:
        """How messages name the loss weighting: its registered name, or its class name."""
        weighting = self.loss_weighting
        if weighting is None or isinstance(weighting, str):
            return weighting
        if isinstance(weighting, Mapping):
            return str(weighting.get("class_name"))
        return type(weighting).__name__

    def build_loss_weighting(self, num_heads: int) -> LossWeighting | None:
        """The loss weighting of one trunk update, built for `num_heads` heads (a fresh one
        for a name or mapping; the instance given, built now, otherwise)."""
        spec = self.loss_weighting
        if spec is None:
            return None
        if isinstance(spec, str):
            return make_loss_weighting(spec, num_heads, seed=self.seed, **self.loss_weighting_options)
        weighting = (from_registered(spec, LossWeighting, "TrunkPolicy.loss_weighting")
                     if isinstance(spec, Mapping) else spec)
        weighting.build(num_heads)
        return weighting


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
