"""`RUN_DIR/inputs.json`: the model's input as a run records it (shape, dtype and, with
`data.normalize`, the training split's statistics), so a finished run's model is rebuilt
(`load_run`, `predict`, `export`) without reading or building its data again."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from multihead._boundary import BoundaryError, read_json, write_atomic
from multihead.datasets.multitask import MultiTaskData
from multihead.experiments.config.schema import ConfigError, ExperimentConfig
from multihead.model.standardize import Standardization, standard_stats

#: Where a run records its model's input (written before training starts).
INPUTS_FILE = "inputs.json"

#: The largest `inputs.json` read: shapes, and with data.normalize two floats per input element.
INPUTS_MAX_BYTES = 1 << 26


def input_standardization(config: ExperimentConfig, data: Any) -> Any:
    """With `data.normalize`, the statistics of the training split's inputs (one input's
    `Standardization`, or a dict input name -> those); None without."""
    if not config.data.normalize:
        return None
    x = _tree(data.x_train)  # data.per_head is refused with normalize: one MultiTaskData
    if isinstance(x, dict):
        return {k: standard_stats(v) for k, v in x.items()}
    return standard_stats(x)


def write_inputs(run_dir: str, data: MultiTaskData | dict[str, MultiTaskData],
                 standardization: Any = None) -> None:
    """`RUN_DIR/inputs.json`: the model's input, so a finished run is rebuilt (load_run, export,
    predict) without reading its data again: `{"shape": [null, ...], "dtype": ...}` or a mapping
    input name -> that; with `data.normalize`, each input's `"normalize": {"mean": ...,
    "scale": ...}` (the training split's, see `multihead.model.standardize`)."""
    def spec(a: Any, stats: Standardization | None) -> dict[str, Any]:
        out = {"shape": [None] + [int(d) for d in a.shape[1:]], "dtype": str(a.dtype)}
        if stats is not None:
            out["normalize"] = stats.to_json()
        return out

    if isinstance(data, dict):  # every head's input has the same layout (input_spec checks)
        data = next(iter(data.values()))
    x = _tree(data.x_train)
    if isinstance(x, dict):
        tree = {k: spec(v, (standardization or {}).get(k)) for k, v in x.items()}
    else:
        tree = spec(x, standardization)
    os.makedirs(run_dir, exist_ok=True)
    # Atomic: a full disk leaves no inputs.json rather than an empty one.
    write_atomic(os.path.join(run_dir, INPUTS_FILE), json.dumps(tree, indent=2))


def run_input_shape(run_dir: str, config: ExperimentConfig | None = None) -> Any:
    """The model input shape of a run, from its `inputs.json` (the run's data is never read
    or built again: a config's data source may be code).

    Args:
        run_dir: the run directory.
        config: unused; kept so existing callers keep working.

    Raises:
        ConfigError: `inputs.json` is missing, not a regular file in the run, or not a
            shape record (one line naming the file).
    """
    path = os.path.join(run_dir, INPUTS_FILE)
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: missing; the run's input shape is read from it (runs written "
                          "by `multihead train` have it): copy it from the run that wrote the "
                          "checkpoints")
    try:
        tree = read_json(run_dir, INPUTS_FILE, limit=INPUTS_MAX_BYTES)
        if "shape" in tree and not isinstance(tree["shape"], dict):
            return _shape(tree, path)
        if not tree:
            raise BoundaryError(f"{path}: holds no input")
        return {str(name): _shape(spec, f"{path}: {name}") for name, spec in tree.items()}
    except BoundaryError as err:
        raise ConfigError(str(err)) from None


def run_standardization(run_dir: str) -> Any:
    """The input statistics `data.normalize` recorded in the run's `inputs.json`: one input's
    `Standardization`, a dict input name -> those, or None (a run without normalize).

    Raises:
        ConfigError: the record is not statistics of the input's shape (one line naming the file).
    """
    shape = run_input_shape(run_dir)  # checks the file and the shapes
    path = os.path.join(run_dir, INPUTS_FILE)
    try:
        tree = read_json(run_dir, INPUTS_FILE, limit=INPUTS_MAX_BYTES)
        if not isinstance(shape, dict):
            record = tree.get("normalize")
            return None if record is None else Standardization.from_json(
                record, tuple(shape[1:]), f"{path}: normalize")
        records = {name: spec.get("normalize") for name, spec in tree.items()}
        if all(r is None for r in records.values()):
            return None
        return {name: Standardization.from_json(r, tuple(shape[name][1:]), f"{path}: {name}.normalize")
                for name, r in records.items()}
    except (BoundaryError, ValueError) as err:
        raise ConfigError(str(err)) from None


def _shape(spec: Any, where: str) -> tuple[int | None, ...]:
    shape = spec.get("shape") if isinstance(spec, dict) else None
    if not isinstance(shape, list) or not shape or len(shape) > 16 or any(
            d is not None and (isinstance(d, bool) or not isinstance(d, int) or not 0 < d < 2**31)
            for d in shape):
        raise BoundaryError(f"{where}: shape must be a list [null, d1, ...] of positive "
                            f"dimensions, got {shape!r}")
    return tuple(shape)


def check_same_standardization(run_dir: str, standardization: Any) -> None:
    """A resumed run standardizes as it started: the training split's statistics, computed
    again from the data, equal those its inputs.json recorded."""
    recorded = run_standardization(run_dir)
    now = standardization if isinstance(standardization, dict) else {"": standardization}
    then = recorded if isinstance(recorded, dict) else {"": recorded}
    same = now.keys() == then.keys() and all(
        then[k] is not None and np.array_equal(now[k].mean, then[k].mean)
        and np.array_equal(now[k].scale, then[k].scale) for k in now)
    if not same:
        raise ConfigError(f"--resume: data.normalize: the training split's statistics differ from "
                          f"those {os.path.join(run_dir, INPUTS_FILE)} recorded when the run "
                          "started; the data changed: train a new run")


def _tree(x: Any) -> Any:
    return dict(x) if isinstance(x, dict) else x
