"""`model.trunk: {<architecture>: {...}}` -> a trunk that routes heads.

Example config (MMoE with 8 experts, each a 16-unit ReLU layer):

    model:
      trunk:
        mmoe: {experts: 8, expert: {mlp: {units: [16], activation: relu}}}

The architectures and their keys:

| key            | keys                                                             |
|----------------|------------------------------------------------------------------|
| `mmoe`, `omoe` | `experts`, `expert`                                              |
| `cgc`          | `shared_experts`, `task_experts`, `expert`                       |
| `ple`          | `shared_experts`, `task_experts`, `levels`, `expert`             |
| `dselect_k`    | `experts` (a power of two), `k`, `gamma`, `entropy_reg`, `expert`|
| `cross_stitch` | `units`, `activation`, `self_weight`                             |
| `mtan`         | `channels`, `batch_norm`                                         |

`expert` is `{mlp: {units: [...], activation: ...}}`, the widths of each expert MLP.
The head names come from `model.heads`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import keras

from multihead._checks import check_float, check_int, check_keys, suggest
from multihead.model.architectures import ARCHITECTURES
from multihead.experiments.config.schema import ConfigError

_EXPERT = ("experts", "expert")
_KEYS: dict[str, tuple[str, ...]] = {
    "mmoe": _EXPERT,
    "omoe": _EXPERT,
    "cgc": ("shared_experts", "task_experts", "expert"),
    "ple": ("shared_experts", "task_experts", "levels", "expert"),
    "dselect_k": ("experts", "k", "gamma", "entropy_reg", "expert"),
    "cross_stitch": ("units", "activation", "self_weight"),
    "mtan": ("channels", "batch_norm"),
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "mmoe": _EXPERT, "omoe": _EXPERT, "cgc": ("shared_experts", "task_experts", "expert"),
    "ple": ("shared_experts", "task_experts", "expert"), "dselect_k": ("experts", "k", "expert"),
    "cross_stitch": ("units",), "mtan": ("channels",),
}
_INTS = ("experts", "shared_experts", "task_experts", "levels", "k")


def is_architecture(spec: Any) -> bool:
    """Whether a `model.trunk` spec is meant as an architecture (`{mmoe: {...}}`, ...): a
    one-key mapping that is not a Keras layer or an `mlp` (an unknown name is reported
    by `build_architecture`, with a "did you mean")."""
    return isinstance(spec, Mapping) and len(spec) == 1 and next(iter(spec)) not in ("mlp", "class_name")


def _units(value: Any, path: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{path}: expected a non-empty list of positive integers, got {value!r}")
    return [check_int(u, f"{path}[{i}]", minimum=1, error=ConfigError) for i, u in enumerate(value)]


def _expert(spec: Any, path: str) -> dict[str, Any]:
    if not isinstance(spec, Mapping) or set(spec) != {"mlp"} or not isinstance(spec["mlp"], Mapping):
        raise ConfigError(f"{path}: expected {{mlp: {{units: [...], activation: ...}}}}, got {spec!r}")
    mlp = spec["mlp"]
    check_keys(mlp, ("units", "activation"), f"{path}.mlp", error=ConfigError)
    if "units" not in mlp:
        raise ConfigError(f"{path}.mlp.units: missing; the widths of each expert's layers")
    out = {"expert_units": _units(mlp["units"], f"{path}.mlp.units")}
    if "activation" in mlp:
        out["expert_activation"] = mlp["activation"]
    return out


def architecture_names() -> list[str]:
    """The names `model.trunk` accepts as an architecture."""
    return list(_KEYS)


def build_architecture(spec: Mapping[str, Any], heads: Sequence[str], path: str = "model.trunk",
                       dtype: str | None = None) -> keras.layers.Layer:
    """The routing trunk `spec` (`{mmoe: {...}}`) describes, for `heads`, with the dtype
    policy `dtype` (None: Keras' default).

    Raises:
        ConfigError: naming the key path of an unknown key, a missing one or a bad value.
    """
    (name, options), = spec.items()
    where = f"{path}.{name}"
    if name not in _KEYS:
        raise ConfigError(f"{path}: unknown architecture {name!r}{suggest(name, _KEYS)}; a trunk is a "
                          f"Keras layer {{class_name: ...}}, a list of them, {{mlp: {{...}}}} or one of "
                          f"{list(_KEYS)}")
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: expected a mapping of its options, got {options!r}")
    check_keys(options, _KEYS[name], where, error=ConfigError)
    for key in _REQUIRED[name]:
        if key not in options:
            raise ConfigError(f"{where}.{key}: missing; {name} needs {list(_REQUIRED[name])}")
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        if key in _INTS:
            kwargs[key] = check_int(value, f"{where}.{key}", minimum=1, error=ConfigError)
        elif key == "expert":
            kwargs.update(_expert(value, f"{where}.expert"))
        elif key in ("units", "channels"):
            kwargs[key] = _units(value, f"{where}.{key}")
        elif key in ("gamma", "self_weight"):
            kwargs[key] = check_float(value, f"{where}.{key}", error=ConfigError)
        elif key == "entropy_reg":
            kwargs[key] = check_float(value, f"{where}.{key}", minimum=0, error=ConfigError)
        elif key == "batch_norm":
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
            kwargs[key] = value
        else:
            kwargs[key] = value
    try:
        return ARCHITECTURES[name](heads=list(heads), dtype=dtype, **kwargs)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where}: {str(err).splitlines()[0]}") from None
