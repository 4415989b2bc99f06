"""`data.kind: python`: a function of the user's module gives the data (imported only as
`data.function: module:function` names it, and only with `--allow-import`, checked by the
config rules)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from multihead.datasets.multitask import MultiTaskData
from multihead.experiments.build.file_readers import numeric
from multihead.experiments.config.data_section import DataConfig
from multihead.experiments.config.schema import ConfigError


def from_function(data: DataConfig) -> tuple[Any, Any]:
    """`data.kind: python`: the train and eval splits (eval None: a holdout follows) of
    `data.function(**data.options)`, imported from the working directory or the path."""
    module_name, _, name = str(data.function).partition(":")
    added = os.getcwd() not in sys.path
    if added:  # a module beside the config, as `python -m` would find it
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"data.function: cannot import {module_name!r} ({err})") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError(f"data.function: module {module_name!r} has no function {name!r}")
    try:
        result = function(**data.options)
    except TypeError as err:
        raise ConfigError(f"data.options: {data.function} does not take them: "
                          f"{str(err).splitlines()[0]}") from None
    if isinstance(result, MultiTaskData):
        return result.train, result.eval
    if isinstance(result, Mapping) and "train" in result:
        unknown = [k for k in result if k not in ("train", "eval")]
        if unknown:
            raise ConfigError(f"data.function: returned a mapping with key {unknown[0]!r}; "
                              "return {train: ..., eval: ...}")
        train = _pair(result["train"], "data.function (train)")
        return train, None if result.get("eval") is None else _pair(result["eval"], "data.function (eval)")
    return _pair(result, "data.function"), None


def _pair(value: Any, where: str) -> tuple[Any, dict]:
    """`(inputs, {head: labels})` as arrays, from arrays or a batched `tf.data.Dataset`."""
    if isinstance(value, tf.data.Dataset):
        batches = [tf.nest.map_structure(lambda t: t.numpy(), b) for b in value]
        if not batches:
            raise ConfigError(f"{where}: the dataset is empty")
        value = tf.nest.map_structure(lambda *parts: np.concatenate(parts), *batches)
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], Mapping)):
        raise ConfigError(f"{where}: expected (inputs, {{head: labels}}), a MultiTaskData, a batched "
                          f"tf.data.Dataset of such pairs or {{train: ..., eval: ...}}, got "
                          f"{type(value).__name__}")
    inputs, targets = value
    if isinstance(inputs, Mapping):
        x: Any = {str(k): numeric(v, f"{where}: input {k!r}", False) for k, v in inputs.items()}
    else:
        x = numeric(inputs, f"{where}: inputs", False)
    return x, {str(h): numeric(v, f"{where}: labels of {h!r}", True) for h, v in targets.items()}
