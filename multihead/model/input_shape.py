"""The input a built model takes, checked against data before it reaches a traced function.

A model built on inputs of width 4 called on width 3 fails deep inside Keras ("Exception
encountered when calling Sequential.call()", or "in user code:" from a `tf.function`);
`check_input_width` says it in one line first, naming the input and both widths. Only the
last axis (the features) is compared: other axes may vary between batches (sequence
lengths, image sizes) for models built to take that.
"""

from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from multihead import _keras_internals as internals


def built_input_shape(model: Any) -> Any:
    """The input shape the model was built with (a tuple, or a dict name -> tuple), or None
    when the model is not built or records none."""
    if not getattr(model, "built", False):
        return None
    shape = internals.build_shapes(model).get("input_shape")
    if isinstance(shape, Mapping) or (isinstance(shape, (tuple, list)) and
                                      all(d is None or isinstance(d, int) for d in shape)):
        return shape
    return None


def _shape(leaf: Any) -> tuple[Any, ...] | None:
    """The shape of an array, tensor or spec; None when it has none or its rank is unknown."""
    shape = getattr(leaf, "shape", None)
    if shape is None:
        return None
    shape = tf.TensorShape(shape)
    return None if shape.rank is None else tuple(shape.as_list())


def check_input_width(model: Any, inputs: Any, where: str) -> None:
    """Raises unless every input has the width (size of the last axis) the model was built
    with. `inputs`: arrays, tensors or `tf.TensorSpec`s, one or a dict of them as the model
    takes. Does nothing for a model not built yet, or whose inputs are laid out otherwise
    (the model's own call names those).

    Raises:
        ValueError: `<where>: the model takes inputs of width 4 (shape (None, 4) per batch),
            got width 3 (shape (None, 3))`, naming the input for named inputs.
    """
    expected = built_input_shape(model)
    if expected is None:
        return
    if isinstance(expected, Mapping):
        if not isinstance(inputs, Mapping):
            return
        pairs = [(f"{where}[{name!r}]", tuple(expected[name]), inputs[name])
                 for name in expected if name in inputs and isinstance(expected[name], (tuple, list))]
    else:
        if isinstance(inputs, Mapping):
            return
        pairs = [(where, tuple(expected), inputs)]
    for name, want, leaf in pairs:
        got = _shape(leaf)
        if got is None or len(got) != len(want) or len(want) < 2:
            continue
        if want[-1] is not None and got[-1] is not None and want[-1] != got[-1]:
            shown = (None, *want[1:])
            raise ValueError(f"{name}: the model takes inputs of width {want[-1]} (shape {shown}),"
                             f" got width {got[-1]} (shape {(None, *got[1:])}); give the "
                             "features the model was built on, in the same columns")
