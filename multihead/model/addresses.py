"""Stable addresses of a model's variables: `trunk/0/kernel`, `heads/a/bias`.

An address is the part (`trunk`, `heads/<name>`), then the index of each sublayer
on the way down, then the variable's own name. It depends only on the model's
structure, never on Keras' auto-generated layer names (`dense_16`), so two builds
of the same architecture, in one process or two, give the same addresses: TF1
import mappings, TensorBoard tags and reports use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras

from multihead import _keras_internals as internals

if TYPE_CHECKING:
    from multihead.model.model_view import HeadsModel


def _sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    if isinstance(layer, keras.Model):
        layers = layer.layers
    else:
        layers = internals.direct_sublayers(layer)
    return [sub for sub in layers if not isinstance(sub, keras.layers.InputLayer)]


def _walk(layer: keras.layers.Layer, prefix: str, found: dict[str, Any]) -> None:
    for var in internals.own_variables(layer):
        found.setdefault(f"{prefix}/{var.name}", var)
    for i, sub in enumerate(_sublayers(layer)):
        _walk(sub, f"{prefix}/{i}", found)


def variable_addresses(model: HeadsModel) -> dict[str, Any]:
    """Address -> variable for every weight of the model's trunk and heads.

    Example:
        >>> list(variable_addresses(model))                                   # doctest: +SKIP
        ['trunk/0/kernel', 'trunk/0/bias', 'heads/a/kernel', 'heads/a/bias']
    """
    if not model.built or not model.trunk.built:
        raise ValueError("the model has no variables yet: call model.build(input_shape) first")
    found: dict[str, Any] = {}
    for part, layer in model.part_layers().items():
        own: dict[str, Any] = {}
        _walk(layer, part, own)
        covered = {id(v) for v in own.values()}
        for i, var in enumerate(layer.weights):  # anything the walk missed, by position
            if id(var) not in covered:
                own[f"{part}/weights/{i}"] = var
        found.update(own)
    return found
