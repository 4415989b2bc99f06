"""How big a config's model is, estimated before anything is allocated, and how much memory
the machine has.

A layer of 10^7 units behind one of 128 asks TensorFlow for 5 GB of weights and, with
gradients and Adam's two slots, four times that: `validate` must refuse it with a line
naming the key, not die in `ResourceExhaustedError`. The estimate is analytic, from the layer
specs alone (no Keras import): `Dense`, the `mlp` shorthand, `ConvND`, `Embedding`, with the
feature width carried from layer to layer. Layers it does not know count for nothing and keep
the width, so it is a lower bound: what it refuses cannot fit, whatever the rest.

Example:
    >>> estimate_parameters({"mlp": {"units": [128, 10_000_000]}}, input_width=100)[0]
    1290012938
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

#: Layer specs (`class_name` mappings and `mlp` widths) a model config may hold: building each
#: is a Python call, and a few lines of YAML aliases nest into millions of them.
MAX_LAYERS = 2000
#: Bytes a float32 parameter needs while training: the weight, its gradient and an
#: optimizer's two slots (Adam).
TRAINING_BYTES_PER_PARAMETER = 16
_FALLBACK_MEMORY = 16 << 30


def memory_bytes() -> int:
    """This machine's memory (the cgroup limit when one is set), or 16 GiB when unknown."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = _FALLBACK_MEMORY
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as fh:
            limit = fh.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def _int(value: Any, default: int = 0) -> int:
    """A positive integer field of a spec, else `default` (the builder names a bad value)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0:
        return int(value)
    return default


def _kernel(value: Any, rank: int) -> int:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return math.prod(_int(v, 1) for v in value)
    return _int(value, 1) ** rank


class _Count:
    """Running totals of a walk over layer specs."""

    def __init__(self) -> None:
        self.parameters = 0
        self.layers = 0
        self.largest = (0, "")  # (parameters, key path) of the largest layer

    def add(self, parameters: int, path: str) -> None:
        self.parameters += parameters
        self.largest = max(self.largest, (parameters, path))


def _walk(spec: Any, width: int | None, path: str, count: _Count) -> int | None:
    """Adds the parameters of `spec` fed `width` features; returns the output width."""
    if count.layers > MAX_LAYERS:
        return width
    if isinstance(spec, list):
        for i, item in enumerate(spec):
            width = _walk(item, width, f"{path}[{i}]", count)
        return width
    if not isinstance(spec, Mapping):
        return width
    if set(spec) == {"mlp"} and isinstance(spec["mlp"], Mapping):
        units = spec["mlp"].get("units")
        for i, n in enumerate(units if isinstance(units, list) else []):
            count.layers += 1
            n = _int(n)
            count.add(((width or 1) + 1) * n, f"{path}.mlp.units[{i}]")
            width = n or width
        return width
    name = spec.get("class_name")
    if not isinstance(name, str):
        return width
    count.layers += 1
    config = spec.get("config") if isinstance(spec.get("config"), Mapping) else {}
    name = name.rsplit(">", 1)[-1]
    if name == "Dense":
        units = _int(config.get("units"))
        count.add(((width or 1) + 1) * units, f"{path}.config.units")
        return units or width
    if name in ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
                "Conv3DTranspose"):
        filters = _int(config.get("filters"))
        rank = int(name[4])
        count.add((_kernel(config.get("kernel_size"), rank) * (width or 1) + 1) * filters,
                  f"{path}.config.filters")
        return filters or width
    if name == "Embedding":
        size = _int(config.get("input_dim")) * _int(config.get("output_dim"))
        count.add(size, f"{path}.config.input_dim")
        return _int(config.get("output_dim")) or width
    if name in ("Flatten", "Reshape", "Concatenate", "GlobalAveragePooling2D"):
        return None  # the width depends on shapes the spec does not state
    for value in config.values():  # a wrapper (Bidirectional, TimeDistributed) holds its layer
        if isinstance(value, (Mapping, list)):
            _walk(value, width, path, count)
    return width


def estimate_parameters(trunk: Any, heads: Mapping[str, Any] | None = None,
                        input_width: int | None = None) -> tuple[int, int, str]:
    """A lower bound on the trainable parameters of a model config.

    Args:
        trunk: the `model.trunk` spec.
        heads: head name -> its `layers` spec, each fed the trunk's output.
        input_width: the input's feature count when the config states it (synthetic data).

    Returns:
        `(parameters, layer specs, key path of the largest layer)`; the layer count stops
        just past `MAX_LAYERS`.
    """
    count = _Count()
    width = _walk(trunk, input_width, "model.trunk", count)
    for name, layers in (heads or {}).items():
        _walk(layers, width, f"model.heads.{name}.layers", count)
    return count.parameters, count.layers, count.largest[1]


def check_model_size(trunk: Any, heads: Mapping[str, Any], input_width: int | None,
                     error: type[Exception]) -> None:
    """Refuses a model config with more than `MAX_LAYERS` layer specs, or whose parameters
    cannot train in half this machine's memory (the rest is for data and TensorFlow).

    Raises:
        error: one line naming the largest layer's key path.
    """
    parameters, layers, largest = estimate_parameters(trunk, heads, input_width)
    if layers > MAX_LAYERS:
        raise error(f"model: more than {MAX_LAYERS} layers (nested lists or YAML aliases "
                    "multiply them); build large models in Python")
    needed = parameters * TRAINING_BYTES_PER_PARAMETER
    budget = memory_bytes() // 2
    if needed > budget:
        raise error(f"{largest}: the model would have at least {parameters:.3g} parameters, "
                    f"{needed / 2**30:.1f} GiB to train (weights, gradients, Adam slots; "
                    f"{TRAINING_BYTES_PER_PARAMETER} bytes each), more than half this machine's "
                    f"{memory_bytes() / 2**30:.1f} GiB; use fewer units")
