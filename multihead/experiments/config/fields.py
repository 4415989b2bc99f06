"""Typed config sections from YAML: dataclass fields with choices and bounds, and the
conversion of raw YAML values into them, every error naming its key path."""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from typing import Any, Mapping, Sequence, Union

from multihead._checks import check_bounds, check_choice, check_float, check_int, check_keys, describe
from multihead.experiments.config.errors import ConfigError

#: Bound on a scale-like number (data.scale, noise_std, aggregator options): beyond it float32
#: losses and gradients overflow.
MAGNITUDE_MAX = 1e6


def field(default: Any = dataclasses.MISSING, *, choices: Sequence[Any] | None = None,
          minimum: float | None = None, maximum: float | None = None, doc: str = "",
          section: type | str | None = None, each: str = "") -> Any:
    """A config dataclass field: its default (a list, dict or section copied per instance),
    the strings it allows (`choices`), its numeric bounds and its documentation.

    For the key reference (`multihead.experiments.config.reference`): `section` is the
    dataclass (or the name of one in the same module) a field typed `Any` holds when it is a
    mapping, checked by hand; `each` names one entry of a mapping or list of sections in a key
    path (`<head>`, `[i]`)."""
    meta = {"choices": choices, "minimum": minimum, "maximum": maximum, "doc": doc,
            "section": section, "each": each}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        value = default
        return dataclasses.field(default_factory=lambda: copy.deepcopy(value), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


#: The largest integer a config holds (int32): beyond it TF or numpy overflow.
INT_LIMIT = 2**31 - 1


def join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def convert(tp: Any, value: Any, path: str) -> Any:
    """Checks `value` against type hint `tp`, returning the typed value."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [o for o in typing.get_args(tp) if o is not type(None)]
        if value is None and len(options) < len(typing.get_args(tp)):
            return None
        error: ConfigError | None = None
        for option in options:
            try:
                return convert(option, value, path)
            except ConfigError as err:
                error = error or err
        assert error is not None
        raise error
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {describe(value)}")
        (item,) = typing.get_args(tp)
        return [convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {describe(value)}")
        _, item = typing.get_args(tp)
        for k in value:
            if not isinstance(k, str):  # head names, columns, keyword arguments
                raise ConfigError(f"{join(path, k)}: keys are strings, got {describe(k)}; "
                                  f"quote it: '{k}'")
        return {k: convert(item, v, join(path, k)) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {describe(value)}")
        return value
    if tp is int:  # bounded: a number beyond int32 overflows somewhere in TF or numpy
        return check_int(value, path, minimum=-INT_LIMIT, maximum=INT_LIMIT, error=ConfigError)
    if tp is float:
        return check_float(value, path, error=ConfigError)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {describe(value)}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a schema bug, not user input


def build(cls: type, raw: Any, path: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {describe(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_keys(raw, list(fields), path, error=ConfigError)
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        where = join(path, name)
        if name not in raw:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where}: required key is missing")
            continue
        value = convert(hints[name], raw[name], where)
        choices, minimum = field.metadata.get("choices"), field.metadata.get("minimum")
        maximum = field.metadata.get("maximum")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # `choices` constrain strings, `minimum` numbers (a key may allow both, e.g. "auto" or 20)
        if choices is not None and not number and value is not None:
            check_choice(value, where, choices, error=ConfigError)
        if (minimum is not None or maximum is not None) and number:
            check_bounds(value, where, minimum=minimum, maximum=maximum, error=ConfigError)
        values[name] = value
    return cls(**values)
