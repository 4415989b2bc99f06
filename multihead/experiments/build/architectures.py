"""`model.trunk: {<architecture>: {...}}` -> a trunk that routes heads.

Example config (MMoE with 8 experts, each a 16-unit ReLU layer):

    model:
      trunk:
        mmoe: {experts: 8, expert: {mlp: {units: [16], activation: relu}}}

An architecture's keys are its class's constructor arguments
(`multihead.model.architectures.ARCHITECTURES`, `architecture_options`), but that the
arguments of an expert MLP, `expert_units` and `expert_activation`, are written
`expert: {mlp: {units: [...], activation: ...}}`. A key without a default is required. The
values are checked by the constructor; its messages name the key path here. The head names
come from `model.heads`. `architecture_table()` renders the keys for docs/architectures.md.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Mapping, Sequence

import keras

from multihead._checks import check_keys, suggest
from multihead.experiments.config.schema import ConfigError
from multihead.model.architectures import ARCHITECTURES, architecture_options

#: Constructor arguments with this prefix are one config key, `expert: {mlp: {...}}`.
_EXPERT = "expert_"


def is_architecture(spec: Any) -> bool:
    """Whether a `model.trunk` spec is meant as an architecture (`{mmoe: {...}}`, ...): a
    one-key mapping that is not a Keras layer or an `mlp` (an unknown name is reported
    by `build_architecture`, with a "did you mean")."""
    return isinstance(spec, Mapping) and len(spec) == 1 and next(iter(spec)) not in ("mlp", "class_name")


def architecture_names() -> list[str]:
    """The names `model.trunk` accepts as an architecture."""
    return list(ARCHITECTURES)


def config_keys(name: str) -> dict[str, Any]:
    """Architecture `name`'s config keys -> default (`inspect.Parameter.empty`: required)."""
    keys: dict[str, Any] = {}
    for option, param in architecture_options(ARCHITECTURES[name]).items():
        if option.startswith(_EXPERT):
            if param.default is inspect.Parameter.empty or "expert" not in keys:
                keys["expert"] = param.default
        else:
            keys[option] = param.default
    return keys


def architecture_table() -> str:
    """The Markdown table of every architecture's config keys and their defaults."""
    rows = ["| key | options |", "|---|---|"]
    for name in ARCHITECTURES:
        options = []
        for key, default in config_keys(name).items():
            shown = "" if default is inspect.Parameter.empty else f" (default {_yaml(default)})"
            options.append(f"`{key}`{shown}")
        rows.append(f"| `{name}` | {', '.join(options)} |")
    return "\n".join(rows)


def _yaml(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def _expert(spec: Any, path: str) -> dict[str, Any]:
    if not isinstance(spec, Mapping) or set(spec) != {"mlp"} or not isinstance(spec["mlp"], Mapping):
        raise ConfigError(f"{path}: expected {{mlp: {{units: [...], activation: ...}}}}, got {spec!r}")
    mlp = spec["mlp"]
    check_keys(mlp, ("units", "activation"), f"{path}.mlp", error=ConfigError)
    if "units" not in mlp:
        raise ConfigError(f"{path}.mlp.units: missing; the widths of each expert's layers")
    return {f"{_EXPERT}{key}": value for key, value in mlp.items()}


def _key_path(message: str, cls: type, where: str) -> str:
    """A constructor's message (`MMoE.expert_units[0]: ...`) with the config key path
    (`model.trunk.mmoe.expert.mlp.units[0]: ...`) in place of the argument."""
    def path(match: re.Match) -> str:
        option = match.group(1)
        if option.startswith(_EXPERT):
            return f"{where}.expert.mlp.{option[len(_EXPERT):]}"
        return f"{where}.{option}"

    names = "|".join(re.escape(c.__name__) for c in type.mro(cls) if c is not object)
    return re.sub(rf"\b(?:{names}|DSelectGate)\.(\w+)", path, message, count=1)


def build_architecture(spec: Mapping[str, Any], heads: Sequence[str], path: str = "model.trunk",
                       dtype: str | None = None) -> keras.layers.Layer:
    """The routing trunk `spec` (`{mmoe: {...}}`) describes, for `heads`, with the dtype
    policy `dtype` (None: Keras' default).

    Raises:
        ConfigError: naming the key path of an unknown key, a missing one or a bad value.
    """
    (name, options), = spec.items()
    where = f"{path}.{name}"
    if name not in ARCHITECTURES:
        raise ConfigError(f"{path}: unknown architecture {name!r}{suggest(name, ARCHITECTURES)}; a trunk "
                          f"is a Keras layer {{class_name: ...}}, a list of them, {{mlp: {{...}}}} or one "
                          f"of {list(ARCHITECTURES)}")
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: expected a mapping of its options, got {options!r}")
    keys = config_keys(name)
    check_keys(options, list(keys), where, error=ConfigError)
    required = [key for key, default in keys.items() if default is inspect.Parameter.empty]
    for key in required:
        if key not in options:
            raise ConfigError(f"{where}.{key}: missing; {name} needs {required}")
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        kwargs.update(_expert(value, f"{where}.expert") if key == "expert" else {key: value})
    cls = ARCHITECTURES[name]
    try:
        return cls(heads=list(heads), dtype=dtype, **kwargs)
    except (ValueError, TypeError) as err:
        raise ConfigError(_key_path(str(err).splitlines()[0], cls, where)) from None
