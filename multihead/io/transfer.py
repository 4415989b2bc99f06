"""Weight transfer between two independent model instances, part by part.

Parts use the checkpoint names and hold what the checkpoint parts hold: `"trunk"`
is the trunk layer, `"heads/<name>"` the head layer and, for a trunk that routes
heads, the layers the trunk owns for that head (its gate, attention module or
column; `multihead.model.architectures`). A part is copied only if the destination's
part has the same structure (same number of weights, same shapes, in the same
order), so two versions of one network can exchange weights without a checkpoint
file.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import keras

from multihead._checks import variable_label
from multihead.training.keras_model import MultiHeadModel


def _layer(model: MultiHeadModel, part: str, role: str) -> keras.layers.Layer:
    layers = model.part_layers()
    if part not in layers:
        raise ValueError(f"copy_weights: the {role} model has no part {part!r}; its parts are {list(layers)}")
    return layers[part]


def _part_weights(model: MultiHeadModel, part: str, role: str) -> list[keras.Variable]:
    """The weights of `part`: its layer's, then, for `heads/<name>` on a trunk that routes
    heads, those of the layers the trunk owns for that head (as checkpoints save it)."""
    weights = list(_layer(model, part, role).weights)
    kind, _, name = part.partition("/")
    if kind == "heads" and model.routes_heads:
        weights += [w for layer in model.trunk.head_owned_layers().get(name, ()) for w in layer.weights]
    return weights


def copy_weights(
    src: MultiHeadModel,
    dst: MultiHeadModel,
    parts: Sequence[str] | Mapping[str, str] | None = None,
) -> list[str]:
    """Copies the weights of some parts of `src` into `dst` (an exact copy).

    Every part is checked before anything is assigned, so on error `dst` is
    unchanged.

    Example:
        >>> mh.copy_weights(old_model, new_model, parts=["trunk"])          # doctest: +SKIP
        >>> mh.copy_weights(a, b, parts={"heads/q": "heads/q_old"})           # doctest: +SKIP

    Args:
        src: the model to copy from (built).
        dst: the model to copy into (built, another instance).
        parts: part names (`"trunk"`, `"heads/<name>"`; the latter includes the
            gate, attention module or column a routing trunk owns for the head, as in
            a checkpoint) present in both models, or a mapping `src part -> dst part`
            to copy into a differently named head; None copies every part of `dst`
            (all must exist in `src`).

    Returns:
        The destination parts that were written.

    Raises:
        ValueError: a model is unbuilt, `src` is `dst`, a part is missing, or the
            structure or shapes of a part differ (the message names the part and
            both shapes).
    """
    for role, model in (("src", src), ("dst", dst)):
        if not isinstance(model, MultiHeadModel):
            raise TypeError(f"copy_weights: {role} must be a MultiHeadModel, got {type(model).__name__}")
        if not model.built or not model.trunk.built:
            raise ValueError(f"copy_weights: the {role} model is not built; call build(input_shape) first")
    if src is dst:
        raise ValueError("copy_weights: src and dst are the same model; pass two model instances")
    if parts is None:
        mapping = {p: p for p in dst.part_layers()}
    elif isinstance(parts, Mapping):
        mapping = dict(parts)
    elif isinstance(parts, str):
        raise TypeError(f"copy_weights: parts must be a list of part names, got the string {parts!r}; "
                        f"write parts=[{parts!r}]")
    else:
        mapping = {p: p for p in parts}
    if not mapping:
        raise ValueError("copy_weights: parts is empty; name at least one part or pass None for all")
    pairs = []
    for src_part, dst_part in mapping.items():
        s_w, d_w = _part_weights(src, src_part, "src"), _part_weights(dst, dst_part, "dst")
        where = src_part if src_part == dst_part else f"{src_part} -> {dst_part}"
        if len(s_w) != len(d_w):
            raise ValueError(
                f"copy_weights: part {where}: src has {len(s_w)} weights, dst {len(d_w)}; "
                "the parts do not have the same structure"
            )
        for s, d in zip(s_w, d_w):
            if s is d:
                raise ValueError(
                    f"copy_weights: part {where}: variable {variable_label(s)!r} is shared by both "
                    "models (same object), there is nothing to copy"
                )
            if tuple(s.shape) != tuple(d.shape) or s.dtype != d.dtype:
                raise ValueError(
                    f"copy_weights: part {where}: src variable {variable_label(s)!r} has shape "
                    f"{tuple(s.shape)} {s.dtype}, dst {variable_label(d)!r} has "
                    f"{tuple(d.shape)} {d.dtype}"
                )
        pairs.extend(zip(s_w, d_w))
    for s, d in pairs:
        d.assign(s)
    return list(mapping.values())
