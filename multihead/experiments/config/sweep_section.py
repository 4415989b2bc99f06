"""The `sweep:` section of a config: its axes (grid, zip, random draws), validated.

The config schema checks this section when it loads a config; `multihead.experiments.sweep`
expands it into trials. See `multihead.experiments.sweep.sweep` for the YAML.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from multihead._checks import describe, suggest
from multihead.experiments.config.errors import ConfigError

DISTRIBUTIONS = ("choice", "uniform", "loguniform", "int")


@dataclasses.dataclass(frozen=True)
class Distribution:
    """One random axis: `choice` (values), or `uniform` / `loguniform` / `int` (low, high)."""

    kind: str
    values: tuple[Any, ...]

    def sample(self, rng: Any) -> Any:
        if self.kind == "choice":
            return self.values[int(rng.integers(len(self.values)))]
        low, high = self.values
        if self.kind == "uniform":
            return float(rng.uniform(low, high))
        if self.kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(low), math.log(high))))
        return int(rng.integers(low, high + 1))


@dataclasses.dataclass
class SweepSpec:
    """The axes of a sweep: `grid` (product), `zip` (stepped together), `random` draws."""

    grid: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    zip: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    random: dict[str, Distribution] = dataclasses.field(default_factory=dict)
    count: int = 0
    seed: int = 0

    def keys(self) -> list[str]:
        return list(dict.fromkeys([*self.grid, *self.zip, *self.random]))


def distribution(raw: Any, path: str) -> Distribution:
    if isinstance(raw, list):
        raw = {"choice": raw}
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise ConfigError(f"{path}: expected a list of values or one of {{choice: [...]}}, "
                          f"{{uniform: [low, high]}}, {{loguniform: [low, high]}}, {{int: [low, high]}}; "
                          f"got {describe(raw)}")
    (kind, values), = raw.items()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{path}: unknown distribution {kind!r}{suggest(kind, DISTRIBUTIONS)}; "
                          f"use one of {', '.join(DISTRIBUTIONS)}")
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{path}.{kind}: expected a non-empty list, got {describe(values)}")
    if kind != "choice":
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if len(values) != 2 or not numbers or not values[0] < values[1]:
            raise ConfigError(f"{path}.{kind}: expected [low, high] numbers with low < high, "
                              f"got {values!r}")
        if kind == "loguniform" and values[0] <= 0:
            raise ConfigError(f"{path}.loguniform: low must be > 0, got {values[0]!r}")
        if kind == "int" and not all(isinstance(v, int) for v in values):
            raise ConfigError(f"{path}.int: expected integers [low, high], got {values!r}")
    return Distribution(kind, tuple(values))


def _axis_values(raw: Any, path: str) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path}: expected a non-empty list of values, got {describe(raw)}")
    return list(raw)


def sweep_spec(raw: Any, path: str = "sweep") -> SweepSpec:
    """The validated `sweep:` section of a config (see the module docstring)."""
    if raw is None:
        return SweepSpec()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: expected a mapping with grid, zip and/or random, got {describe(raw)}")
    known = ("grid", "zip", "random")
    for key in raw:
        if key not in known:
            raise ConfigError(f"{path}.{key}: unknown key{suggest(str(key), known)}; use grid, zip or random")
    spec = SweepSpec()
    for section in ("grid", "zip"):
        axes = raw.get(section) or {}
        if not isinstance(axes, Mapping):
            raise ConfigError(f"{path}.{section}: expected a mapping KEY.PATH -> [values], got {describe(axes)}")
        getattr(spec, section).update({str(k): _axis_values(v, f"{path}.{section}.{k}") for k, v in axes.items()})
    lengths = {k: len(v) for k, v in spec.zip.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError(f"{path}.zip: paired axes need equal lengths, got {lengths}")
    random = raw.get("random")
    if random is not None:
        where = f"{path}.random"
        if not isinstance(random, Mapping):
            raise ConfigError(f"{where}: expected {{count: N, seed: S, axes: {{...}}}}, got {describe(random)}")
        for key in random:
            if key not in ("count", "seed", "axes"):
                raise ConfigError(f"{where}.{key}: unknown key{suggest(str(key), ('count', 'seed', 'axes'))}")
        count, seed = random.get("count"), random.get("seed", 0)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ConfigError(f"{where}.count: expected an integer >= 1, got {describe(count)}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"{where}.seed: expected an integer, got {describe(seed)}")
        axes = random.get("axes")
        if not isinstance(axes, Mapping) or not axes:
            raise ConfigError(f"{where}.axes: expected a mapping KEY.PATH -> distribution, got {describe(axes)}")
        spec.random = {str(k): distribution(v, f"{where}.axes.{k}") for k, v in axes.items()}
        spec.count, spec.seed = count, seed
    seen: dict[str, str] = {}
    for section in ("grid", "zip", "random"):
        for key in getattr(spec, section):
            if key in seen:
                raise ConfigError(f"{path}.{section}.{key}: already an axis in {path}.{seen[key]}; "
                                  "give each key once")
            seen[key] = section
    return spec
