"""The objectives of a config: `model.heads.<head>` (a head's own objective) and `objectives:`
(those not named for a head), their fields, their key paths and their checks."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Union

from multihead._checks import check_name, suggest
from multihead.experiments.config.errors import ConfigError
from multihead.experiments.config.fields import field as _field

#: The schema's `ExperimentConfig` (not imported: the schema imports this module).
ExperimentConfig = Any


@dataclasses.dataclass
class ObjectiveConfig:
    """`objectives.<name>:` an objective that stands on its own (see `multihead.Objective`):
    its loss reads several heads (or the trunk's output) and trains the parts it names.
    Its labels are the data's target `<name>`."""

    loss: Any = _field("mse", doc="Keras loss name or serialization dict")
    optimizer: Any = _field("adam", doc="Keras optimizer name or serialization dict")
    weight: Any = _field(1.0, doc="factor on the loss: a number >= 0, or a Keras "
                                  "LearningRateSchedule dict {class_name: ..., config: {...}} "
                                  "evaluated at each step")
    every: int = _field(1, minimum=1)
    trains_trunk: bool = _field(True)
    metrics: list[Any] = _field([], doc="Keras metric names or dicts, reported by evaluation")
    on_nonfinite: str = _field("skip", choices=("skip", "raise", "apply"),
                               doc="a step where this loss or its gradient is NaN/Inf: skip "
                                   "drops its update, raise stops the run, apply applies it")
    reads: Union[list[str], None] = _field(None, doc="the outputs the loss reads: head names, "
                                                    "trunk or trunk/<block> (a tap); default: "
                                                    "the head of that name")
    combine: Union[str, None] = _field(None, choices=("product", "sum", "mean", None),
                                       doc="how several reads make one prediction, element-wise")
    trains: Union[list[str], None] = _field(
        None, doc="parts its optimizer trains: trunk, heads/<name>, trunk/<index>; default: "
                  "the trunk and the heads it reads")
    trunk_scale: Any = _field(1.0, doc="factor on its gradient into the trunk (negative: "
                                       "gradient reversal): a number, or a Keras "
                                       "LearningRateSchedule dict evaluated at each step")


@dataclasses.dataclass
class HeadConfig(ObjectiveConfig):
    """`model.heads.<name>:` one head, and its own objective: loss, optimizer, ... (`loss:
    null`: none; then an objective under `objectives:` trains it)."""

    layers: Any = _field({"class_name": "Dense", "config": {"units": 1}},
                         doc="Keras layer dict, list of them, or {mlp: {...}}")



def objective_configs(config: ExperimentConfig) -> dict[str, ObjectiveConfig]:
    """Objective name -> its config: each head with a loss (`model.heads.<head>`), then each
    of `objectives:`."""
    named = {n: h for n, h in config.model.heads.items() if h.loss is not None}
    return {**named, **config.objectives}


def objective_path(config: ExperimentConfig, name: str) -> str:
    """The key path of objective `name`'s settings."""
    return f"model.heads.{name}" if name in config.model.heads else f"objectives.{name}"


def trains_trunk(spec: ObjectiveConfig) -> bool:
    """Whether an objective's config trains the trunk, by its declaration."""
    if spec.trains is not None:
        return any(p == "trunk" or p.startswith("trunk/") for p in spec.trains)
    return spec.trains_trunk and spec.trunk_scale != 0


def check_only_heads(only: list[str] | None, heads: list[str]) -> None:
    """`train.only_heads`: null, or distinct heads of the model."""
    if only is None:
        return
    if not only:
        raise ConfigError("train.only_heads: give at least one head, or null for every head")
    for head in only:
        if head not in heads:
            raise ConfigError(f"train.only_heads: the model has no head {head!r}"
                              f"{suggest(str(head), heads)}; its heads are {heads}")
    if len(set(only)) != len(only):
        raise ConfigError(f"train.only_heads: a head is named twice in {only}")


def check_objectives(config: ExperimentConfig) -> None:
    """The heads' and objectives' names (the rule `Trainer` applies), the standalone
    objectives' reads; every head is trained by some objective."""
    heads = list(config.model.heads)
    for head in heads:
        check_name(head, "head", where="model.heads", error=ConfigError)
    for name in config.objectives:
        check_name(name, "objective", where="objectives", error=ConfigError)
    for name, spec in config.objectives.items():
        path = f"objectives.{name}"
        if name in heads:
            raise ConfigError(f"{path}: {name!r} is a head: set its objective under "
                              f"model.heads.{name}")
        if spec.loss is None:
            raise ConfigError(f"{path}.loss: an objective needs a loss")
        if not spec.reads:
            raise ConfigError(f"{path}.reads: missing; list the outputs its loss reads "
                              f"(heads {heads} or trunk)")
    for name, spec in objective_configs(config).items():
        path = objective_path(config, name)
        for i, read in enumerate(spec.reads or ()):
            if not (read == "trunk" or read.startswith("trunk/") or read in heads):
                raise ConfigError(f"{path}.reads[{i}]: the model has no head {read!r}"
                                  f"{suggest(read, heads)}; its heads are {heads}")
        if spec.reads and len(spec.reads) > 1 and spec.combine is None:
            raise ConfigError(f"{path}.combine: missing; {list(spec.reads)} make one prediction "
                              "through combine: product, sum or mean")
        for i, part in enumerate(spec.trains or ()):
            if not (part == "trunk" or re.fullmatch(r"trunk(/\d+)+", part)
                    or part.removeprefix("heads/") in heads):
                raise ConfigError(f"{path}.trains[{i}]: unknown part {part!r}; the parts are "
                                  f"trunk, trunk/<index>, {', '.join('heads/' + h for h in heads)}")
    trained = {h for n, s in objective_configs(config).items()
               for h in ([p.removeprefix("heads/") for p in s.trains if p.startswith("heads/")]
                         if s.trains is not None else
                         [r for r in (s.reads or [n]) if r in heads])}
    for head in heads:
        if head not in trained:
            raise ConfigError(f"model.heads.{head}.loss: null, and no objective trains the head; "
                              f"give it a loss, or add heads/{head} to an objective's trains")
