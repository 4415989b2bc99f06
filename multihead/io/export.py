"""SavedModel export of a `MultiHeadModel`: one serving signature per head, plus all heads.

The exported directory loads with `tf.saved_model.load` in any TensorFlow
process, without multihead or the Python code of the model:

    loaded = tf.saved_model.load("export/")
    loaded.signatures["serving_default"](inputs=x)   # {"y1": ..., "y2": ...}
    loaded.signatures["y1"](inputs=x)                # {"y1": ...}
    loaded(x)                                        # {"y1": ..., "y2": ...}

The exported functions run the model with `training=False` (no dropout).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Sequence

import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._boundary import temp_dir
from multihead.model.network import head_input
from multihead.training.keras_model import MultiHeadModel
from multihead.model.taps import trunk_features

#: Name of the input of every serving signature.
INPUT_NAME = "inputs"


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What `export_saved_model` wrote.

    Attributes:
        path: the SavedModel directory.
        heads: the exported heads, in order.
        signatures: signature key -> the heads it returns (`serving_default`: all).
        input_spec: the input the signatures accept.
    """

    path: str
    heads: tuple[str, ...]
    signatures: dict[str, tuple[str, ...]]
    input_spec: tf.TensorSpec | dict[str, tf.TensorSpec]


class _Serving(tf.Module):
    """The exported object: the trunk, the chosen heads, and their serving functions."""

    def __init__(self, model: MultiHeadModel, heads: Sequence[str],
                 spec: tf.TensorSpec | dict[str, tf.TensorSpec]) -> None:
        super().__init__(name="multihead_serving")
        self.trunk = model.trunk
        self.preprocess = model.preprocess  # constants only (MultiHeadModel checks)
        self.heads = {h: model.heads[h] for h in heads}
        self.head_names = list(heads)
        self._taps = {h: i for h, i in model.tap_indices.items() if h in heads}
        self.serve_all = tf.function(self._outputs_of(tuple(heads)), input_signature=[spec])
        self.serve_head = {
            h: tf.function(self._outputs_of((h,)), input_signature=[spec]) for h in heads
        }
        # Saved as the loaded object's call: `tf.saved_model.load(path)(x)`.
        self.__call__ = self.serve_all

    def _outputs_of(self, heads: tuple[str, ...]):
        def serve(inputs: tf.Tensor | dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            if self.preprocess is not None:
                inputs = self.preprocess(inputs)
            feats = trunk_features(self.trunk, inputs, self._taps, training=False)
            return {h: self.heads[h](head_input(self.trunk, feats, h, self._taps), training=False)
                    for h in heads}

        return serve


def named_inputs(model: MultiHeadModel) -> dict[str, tf.TensorSpec] | None:
    """The named inputs of a model whose (functional) trunk takes a dict, as specs keyed
    by name; None for a trunk that takes one tensor."""
    try:
        inputs = model.trunk.input
    except (AttributeError, ValueError):  # a layer, or a Sequential built without Input
        return None
    if not isinstance(inputs, dict):
        return None
    return {name: tf.TensorSpec(tensor.shape, tensor.dtype, name=name)
            for name, tensor in sorted(inputs.items())}


def default_input_spec(model: MultiHeadModel) -> tf.TensorSpec | dict[str, tf.TensorSpec]:
    """The input spec of a built model: its named inputs (a dict name -> spec), or its build
    shape with a free batch dimension.

    Raises:
        ValueError: the model records no single-tensor build shape; pass
            `input_spec=tf.TensorSpec([None, ...])` to `export_saved_model`.
    """
    named = named_inputs(model)
    if named is not None:
        return named
    shapes = internals.build_shapes(model)
    shape = shapes.get("input_shape") if len(shapes) == 1 else None
    if shape is None or not isinstance(shape, (tuple, list)) or not all(
            d is None or isinstance(d, int) for d in shape) or len(shape) < 1:
        raise ValueError(
            f"cannot tell the model's input shape (recorded: {shapes or None}); pass "
            "input_spec=tf.TensorSpec([None, <feature dims>], tf.float32)"
        )
    return tf.TensorSpec([None, *shape[1:]], tf.float32, name=INPUT_NAME)


def export_saved_model(model: MultiHeadModel, path: str | os.PathLike[str],
                       heads: Sequence[str] | None = None,
                       input_spec: tf.TensorSpec | dict[str, tf.TensorSpec] | None = None,
                       ) -> ExportResult:
    """Writes `model` (trunk and the chosen heads) as a SavedModel for serving.

    Signatures: `serving_default` returns every exported head's output
    (`{head: tensor}`), and one signature per head, keyed by the head's name,
    returns that head's output only. The directory is written under a temporary
    name and renamed when complete, so a failed export leaves nothing at `path`.

    Example:
        >>> mh.export_saved_model(model, "export/", heads=["y1"])           # doctest: +SKIP
        >>> tf.saved_model.load("export/").signatures["y1"](inputs=x)["y1"]  # doctest: +SKIP

    Args:
        model: a built model.
        path: the SavedModel directory; it must not exist or be empty.
        heads: heads to export, in order; None exports every head.
        input_spec: the input accepted: a single tensor's spec, or for a trunk on
            named inputs a dict name -> spec (each signature then takes one keyword
            argument per name); default: the model's named inputs, else its build
            shape with a free batch dimension.

    Returns:
        The heads and signatures written.

    Raises:
        ValueError: unbuilt model, unknown or repeated head, `path` not empty,
            unknown input shape.
    """
    if not isinstance(model, MultiHeadModel):
        raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
    if not model.built or not model.trunk.built:
        raise ValueError("the model has no variables yet: call model.build(input_shape) first")
    if isinstance(heads, str):
        raise TypeError(f"heads must be a list of head names, got the string {heads!r}; "
                        f"write heads=[{heads!r}]")
    chosen = list(model.head_names) if heads is None else list(heads)
    if not chosen:
        raise ValueError("heads is empty; name at least one head or pass None for all")
    model.check_heads(chosen, "heads")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"heads names a head twice: {chosen}")
    if "serving_default" in chosen:
        raise ValueError("a head named 'serving_default' clashes with the all-heads signature; rename it")
    spec = input_spec if input_spec is not None else default_input_spec(model)
    if isinstance(spec, dict) and spec and all(isinstance(s, tf.TensorSpec) for s in spec.values()):
        spec = {name: tf.TensorSpec(s.shape, s.dtype, name=name) for name, s in spec.items()}
    elif isinstance(spec, tf.TensorSpec):
        spec = tf.TensorSpec(spec.shape, spec.dtype, name=INPUT_NAME)
    else:
        raise TypeError(f"input_spec must be a tf.TensorSpec or a dict name -> tf.TensorSpec, "
                        f"got {type(spec).__name__}")
    out = os.path.abspath(os.fspath(path))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"export path {os.fspath(path)!r} exists and is not an empty directory; "
                         "choose another path")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    serving = _Serving(model, chosen, spec)
    signatures = {"serving_default": serving.serve_all.get_concrete_function()}
    signatures.update({h: serving.serve_head[h].get_concrete_function() for h in chosen})
    tmp = temp_dir(parent, prefix=f".{os.path.basename(out)}.tmp-")
    try:
        tf.saved_model.save(serving, tmp, signatures=signatures)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return ExportResult(
        path=out,
        heads=tuple(chosen),
        signatures={"serving_default": tuple(chosen), **{h: (h,) for h in chosen}},
        input_spec=spec,
    )

