"""The built-in methods, by config name, derived from their classes; and the resolution of a
method given by name, as an instance, or as a Keras-registered user class.

Every list of names (errors, docs, `TrunkPolicy`, configs) is generated from the two class
tuples below: a new built-in method is one class, added to its tuple.
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any, Mapping, Union

import keras

from multihead.aggregation.aligned_mtl import AlignedMTL
from multihead.aggregation.bargaining import FairGrad, NashMTL
from multihead.aggregation.base import Aggregator, constructor_options
from multihead.aggregation.buffered import DBMTL, ExcessMTL, MoCo
from multihead.aggregation.cagrad import CAGrad
from multihead.aggregation.conflict_free import ConFIG
from multihead.aggregation.constant import FixedWeights, Mean, RandomWeights, Sum
from multihead.aggregation.coordinatewise import GradDrop, TrimmedMean
from multihead.aggregation.gradvac import GradVac
from multihead.aggregation.imtl import IMTLG
from multihead.aggregation.krum import Krum
from multihead.aggregation.loss_weighting import (
    DWAWeighting,
    FAMOWeighting,
    GLSWeighting,
    GradNormWeighting,
    IMTLLWeighting,
    LossWeighting,
    RLWWeighting,
    STCHWeighting,
    UncertaintyWeighting,
)
from multihead.aggregation.mgda import EPO, MGDA
from multihead.aggregation.pcgrad import PCGrad
from multihead.aggregation.sdmgrad import SDMGrad
from multihead.aggregation.upgrad import DualProj, UPGrad

#: The built-in gradient aggregators, in the order their names are listed.
AGGREGATOR_CLASSES: tuple[type[Aggregator], ...] = (
    Sum, Mean, FixedWeights, PCGrad, MGDA, CAGrad, UPGrad, DualProj, IMTLG, AlignedMTL, ConFIG,
    Krum, NashMTL, GradVac, FairGrad, SDMGrad, MoCo, DBMTL, ExcessMTL, RandomWeights, GradDrop,
    TrimmedMean, EPO,
)
#: The built-in loss weightings.
LOSS_WEIGHTING_CLASSES: tuple[type[LossWeighting], ...] = (
    UncertaintyWeighting, GradNormWeighting, DWAWeighting, GLSWeighting, STCHWeighting,
    IMTLLWeighting, FAMOWeighting, RLWWeighting,
)

_AGGREGATORS: dict[str, type[Aggregator]] = {c.name: c for c in AGGREGATOR_CLASSES}  # type: ignore[misc]
_LOSS_WEIGHTINGS: dict[str, type[LossWeighting]] = {c.name: c for c in LOSS_WEIGHTING_CLASSES}  # type: ignore[attr-defined]

#: Names accepted by `get_aggregator`.
AGGREGATORS: tuple[str, ...] = tuple(_AGGREGATORS)
#: Aggregators valid with `rep_grad` (combining at the trunk output).
REP_GRAD_AGGREGATORS: tuple[str, ...] = tuple(c.name for c in AGGREGATOR_CLASSES if c.rep_grad)  # type: ignore[misc]
#: Aggregators that keep state from step to step (checkpointed with the trunk update).
STATEFUL_AGGREGATORS: tuple[str, ...] = tuple(
    n for n, c in _AGGREGATORS.items() if c.buffers or c.state_spec is not Aggregator.state_spec)
#: Names accepted by `make_loss_weighting`.
LOSS_WEIGHTINGS: tuple[str, ...] = tuple(_LOSS_WEIGHTINGS)

#: What `TrunkPolicy(aggregator=...)` and `loss_weighting=` accept besides names: an
#: instance, or `{"class_name": "package>Name", "config": {...}}` of a registered class.
AggregatorSpec = Union[str, Aggregator, Mapping[str, Any]]
LossWeightingSpec = Union[str, LossWeighting, Mapping[str, Any]]


def _unknown(kind: str, name: Any, names: tuple[str, ...]) -> ValueError:
    close = get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown {kind} {name!r}{hint}; choose one of {list(names)}")


def _check_options(kind: str, name: str, cls: type, options: Mapping[str, Any]) -> None:
    known = [k for k in constructor_options(cls) if k != "num_heads"]
    for key in options:
        if key not in known:
            raise ValueError(f"{kind} {name!r} has no option {key!r}; its options are "
                             f"{sorted(known) or 'none'}")


def get_aggregator(name: str, num_heads: int | None = None, **options: Any) -> Aggregator:
    """The built-in aggregator `name` with `options`, validated once, outside traced code.

    Args:
        name: one of `AGGREGATORS`.
        num_heads: the number of heads it will combine, when known (checks
            `weights`' length, `upgrad`'s limit, `trimmed_mean`'s trim).
        **options: the aggregator's constructor options (see its class).

    Raises:
        ValueError: unknown name or option, or a bad option value.
    """
    cls = _AGGREGATORS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise _unknown("aggregator", name, AGGREGATORS)
    _check_options("aggregator", name, cls, options)
    aggregator = cls(**options)
    if num_heads is not None:
        aggregator.check_heads(num_heads)
    return aggregator


def make_loss_weighting(name: str, num_heads: int | None = None, seed: int = 0,
                        **options: Any) -> LossWeighting:
    """A fresh loss weighting `name` (built for `num_heads` heads when given).

    Args:
        name: one of `LOSS_WEIGHTINGS`.
        num_heads: the number of heads it weights (None: built later).
        seed: the seed of `rlw`'s generator, unless `options` holds one.
        **options: the weighting's constructor options (see its class).
    """
    cls = _LOSS_WEIGHTINGS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise _unknown("loss weighting", name, LOSS_WEIGHTINGS)
    _check_options("loss weighting", name, cls, options)
    if "seed" in constructor_options(cls):
        options = {"seed": seed, **options}
    return cls(num_heads=num_heads, **options)


def check_loss_weighting_options(name: str, **options: Any) -> dict[str, Any]:
    """Validates a weighting's name and options; returns the options with defaults filled in."""
    return make_loss_weighting(name, **options).get_config()


def from_registered(spec: Mapping[str, Any], base: type, what: str) -> Any:
    """An instance of a Keras-registered subclass of `base` from
    `{"class_name": "package>Name", "config": {...}}`; nothing is imported.

    Raises:
        ValueError: bad keys, a class that is not registered or not a `base`, or options
            its constructor refuses.
    """
    extra = sorted(set(spec) - {"class_name", "config"})
    if extra or "class_name" not in spec:
        raise ValueError(f"{what}: a user method is {{class_name: 'package>Name', config: {{...}}}}, "
                         f"got keys {sorted(spec)}")
    class_name, config = spec["class_name"], spec.get("config") or {}
    if not isinstance(config, Mapping):
        raise ValueError(f"{what}.config: expected a mapping of options, got {config!r}")
    cls = keras.saving.get_registered_object(class_name) if isinstance(class_name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(
            f"{what}: {class_name!r} is not a registered {base.__name__} subclass; decorate the "
            "class with @keras.saving.register_keras_serializable(package='pkg'), import it "
            "before the config is loaded (multihead --import MODULE), and name it 'pkg>ClassName'")
    try:
        return cls.from_config(dict(config))
    except TypeError as err:
        raise ValueError(f"{what}.config: {class_name}: {err}") from None


def resolve_aggregator(spec: AggregatorSpec, options: Mapping[str, Any] | None = None,
                       num_heads: int | None = None, what: str = "aggregator") -> Aggregator:
    """An aggregator from a name (+ options), an instance, or a registered-class mapping."""
    options = dict(options or {})
    if isinstance(spec, Aggregator):
        aggregator = spec
    elif isinstance(spec, Mapping):
        aggregator = from_registered(spec, Aggregator, what)
    else:
        return get_aggregator(spec, num_heads=num_heads, **options)
    if options:
        raise ValueError(f"{what}: options go to the constructor of {aggregator.label!r}, "
                         f"not in options ({sorted(options)})")
    if num_heads is not None:
        aggregator.check_heads(num_heads)
    return aggregator
