"""`HostState`: numpy and Python state of an RL run inside a `tf.train.Checkpoint`.

The replay buffer, the numpy generators, the environments and the episode bookkeeping live on
the host, not in variables. A `HostState` is a trackable whose `save()` returns name -> numpy
array or JSON text; a checkpoint writes the arrays through DLPack, so the tensor it saves IS
the array's memory (a replay buffer of several hundred MB is written without a copy), and
`load()` receives the restored arrays. The names and dtypes `save()` returns must not depend
on the state (a restore asks the live object for them); the shapes may.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf

Saved = Mapping[str, "np.ndarray | str"]


def _tensor(value: np.ndarray | str) -> tf.Tensor:
    if isinstance(value, str):
        return tf.constant(value, tf.string)
    value = np.asarray(value)
    if value.size and value.flags.c_contiguous and value.flags.writeable:
        try:
            return tf.experimental.dlpack.from_dlpack(value.__dlpack__())  # no copy
        except (BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):
            pass  # a dtype DLPack does not carry: copied below
    return tf.convert_to_tensor(value)


def _value(tensor: tf.Tensor) -> np.ndarray | str:
    if tensor.dtype == tf.string:
        return tensor.numpy().decode("utf-8")
    if tensor.shape.num_elements():
        return np.from_dlpack(tensor)  # a read-only view of the restored tensor, no copy
    return tensor.numpy()


class HostState(tf.__internal__.tracking.Trackable):
    """Host-side state saved and restored with a checkpoint.

    Args:
        save: returns name -> numpy array (written without a copy when C-contiguous) or
            text (e.g. `to_json`); the same names and dtypes every time.
        load: receives name -> the restored array (read-only: copy what it keeps) or text.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> state = HostState(lambda: {"rng": to_json(rng.bit_generator.state)},
        ...                   lambda saved: setattr(rng.bit_generator, "state", from_json(saved["rng"])))
        >>> tf.train.Checkpoint(rng=state)  # doctest: +ELLIPSIS
        <...Checkpoint object at ...>
    """

    def __init__(self, save: Callable[[], Saved], load: Callable[[Mapping[str, Any]], None]) -> None:
        self._save = save
        self._load = load

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        return {name: _tensor(value) for name, value in self._save().items()}

    def _restore_from_tensors(self, restored_tensors: Mapping[str, tf.Tensor]) -> None:
        self._load({name: _value(t) for name, t in restored_tensors.items()})


# -- JSON with numpy arrays -----------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return {"__scalar__": value.dtype.str, "data": value.item()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.array(value["data"], dtype=value["__ndarray__"]).reshape(value["shape"])
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        if "__scalar__" in value:
            return np.dtype(value["__scalar__"]).type(value["data"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def to_json(tree: Any) -> str:
    """`tree` (dicts, lists, tuples, numbers, numpy arrays and scalars) as JSON text that
    `from_json` turns back into equal values, dtypes and floats bitwise (floats are written
    as their shortest round-trip repr)."""
    return json.dumps(_encode(tree), allow_nan=True)


def from_json(text: str) -> Any:
    """The tree `to_json` wrote."""
    return _decode(json.loads(text))


def generator_state(rng: np.random.Generator) -> dict[str, Any]:
    """The state of a numpy `Generator` (its bit generator's), for `set_generator_state`."""
    return rng.bit_generator.state


def set_generator_state(rng: np.random.Generator, state: Mapping[str, Any]) -> None:
    """Puts `rng` in `state`; raises `ValueError` if it is another bit generator's."""
    if state.get("bit_generator") != rng.bit_generator.state["bit_generator"]:
        raise ValueError(f"a {state.get('bit_generator')} state cannot restore a "
                         f"{rng.bit_generator.state['bit_generator']} generator")
    rng.bit_generator.state = dict(state)
