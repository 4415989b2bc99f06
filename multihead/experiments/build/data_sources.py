"""The `data:` section -> a `MultiTaskData`: the embedded generators, MultiDigits, and your own
files (`npz`, `csv`, `tfrecord`) or Python function (`python`).

Every source is read into arrays once and then checked by the same code, so a config and a
script read data identically and equal data gives bitwise-equal training whatever the file
format. The checks name the config key and the file: a missing file, array or column, a wrong
dtype (text, complex numbers, integer labels beyond int32, floats beyond float32), no rows,
rows of different lengths, a head without a target or a target without a head, and NaN or inf
under `data.on_nonfinite` (`error`, `drop` the rows, or `keep` them; `on_nan` is its former
name). Sizes are checked before anything is allocated: an `.npz` array's header, a tfrecord's
`data.shapes`.

Example:
    >>> import multihead as mh
    >>> data = mh.load_data({"kind": "npz", "train": "train.npz", "features": "x"},
    ...                     heads=["y1", "y2"])  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from multihead._checks import suggest
from multihead.datasets.multitask import CLASSIFICATION, REGRESSION, MultiTaskData, mmoe_synthetic
from multihead.experiments.config.value_checks import check_data_function
from multihead.experiments.build.file_readers import (
    check_file,
    csv_header,
    numeric,
    read_csv,
    read_npz,
    read_tfds,
    read_tfrecord,
    tfrecord_features,
)
from multihead.experiments.build.python_source import from_function
from multihead.experiments.config.data_section import DataConfig, data_from_dict, missing_label_of
from multihead.experiments.config.schema import ConfigError, ExperimentConfig, objective_configs

#: `data.features: all`: every column but the targets and sample weights.
ALL_FEATURES = "all"

#: The default `data.features` of file sources.
DEFAULT_FEATURES = "x"



def load_data(section: Mapping[str, Any] | DataConfig, heads: Sequence[str],
              seed: int = 0, *, allow_import: Sequence[str] = ()
              ) -> MultiTaskData | dict[str, MultiTaskData]:
    """Reads the data a config's `data:` section describes, checked against `heads`.

    Args:
        section: the `data:` mapping of a config (e.g. `{"kind": "csv", "train": "t.csv",
            "features": ["a", "b"], "targets": {"y": "label"}}`), or a `DataConfig`.
        heads: the model's head names; each needs exactly one target.
        seed: used when the section has no `seed` (the holdout split, generators).
        allow_import: modules a `kind: python` section may import and call (its
            `function: module:function`); any other module is refused before it is imported.

    Returns:
        The train and eval splits; inputs are float32 arrays (or a dict of them for named
        inputs), labels float32 or int32 arrays of shape `(n, ...)`. With `per_head`, a dict
        head -> that head's own splits (one task each).

    Raises:
        ConfigError: one line naming the `data.` key at fault.
    """
    data = section if isinstance(section, DataConfig) else data_from_dict(dict(section), heads)
    check_data_function(data, allow_import, "data", ConfigError)
    return _load(data, list(heads), seed if data.seed is None else data.seed)


def build_data(config: ExperimentConfig) -> MultiTaskData | dict[str, MultiTaskData]:
    """The data of an experiment config, one task per head (a dict head -> data with
    `data.per_head`)."""
    seed = config.seed if config.data.seed is None else config.data.seed
    return _load(config.data, list(objective_configs(config)), seed)


def input_spec(data: MultiTaskData | Mapping[str, MultiTaskData]) -> Any:
    """The model's input shape from the data: `(None, ...)`, or a dict of them.

    Raises:
        ConfigError: per-head data whose heads' inputs differ in shape or names.
    """
    if isinstance(data, Mapping):
        specs = {head: input_spec(d) for head, d in data.items()}
        first = next(iter(specs))
        for head, spec in specs.items():
            if spec != specs[first]:
                raise ConfigError(f"data.per_head.{head}: inputs of shape {spec} differ from "
                                  f"data.per_head.{first}'s {specs[first]}; the heads share the "
                                  "trunk, so they need the same input")
        return specs[first]
    return tf.nest.map_structure(lambda a: (None,) + tuple(a.shape[1:]), _inputs_tree(data.x_train))


def _inputs_tree(x: Any) -> Any:
    return dict(x) if isinstance(x, Mapping) else x


def _load(data: DataConfig, heads: list[str], seed: int,
          markers: Mapping[str, float | None] | None = None,
          allowed: Sequence[str] = ()) -> MultiTaskData | dict[str, MultiTaskData]:
    """The data of `data`, every head with a labelled row in each split (unless `allowed`,
    `data.allow_empty_heads`). `markers`: head -> the missing-label marker its objective
    uses (default: `data.missing_label`)."""
    if markers is None:
        markers = {h: missing_label_of(data, h) for h in heads}
    allowed = [*allowed, *data.allow_empty_heads]
    if data.per_head:
        return {h: _load(data.per_head[h], [h], seed if data.per_head[h].seed is None
                         else data.per_head[h].seed,
                         {h: markers[h] if markers[h] is not None
                          else missing_label_of(data.per_head[h], h)}, allowed)
                for h in heads}
    result = _read(data, heads, seed)
    _check_labelled(result, markers, allowed, held_out=data.eval is None)
    return result


def _check_labelled(data: MultiTaskData, markers: Mapping[str, float | None],
                    allowed: Sequence[str], held_out: bool) -> None:
    """Each head not `allowed` has, in each split, a row with a present label (not its
    missing-label marker) and a sample weight > 0. Without one the head trains nothing and
    its evaluation reads as a NaN loss, or as 0, a perfect fit it never made.

    Raises:
        ConfigError: naming the head, the key and the split.
    """
    fix = "give it rows with labels, or list the head in data.allow_empty_heads to run anyway"
    splits = (("data.train", data.y_train, data.w_train),
              ("the eval split (held out of data.train)" if held_out else "data.eval",
               data.y_eval, data.w_eval))
    for where, labels, weights in splits:
        for head, y in labels.items():
            if head in allowed:
                continue
            rows = len(y)
            present = np.ones(rows, bool)
            marker = markers.get(head)
            if marker is not None:
                flat = np.asarray(y).reshape(rows, -1)
                marked = np.isnan(flat) if math.isnan(marker) else flat == marker
                present = ~marked.any(axis=1)
                if not present.any():
                    raise ConfigError(
                        f"data.missing_label.{head}: every label of head {head!r} in {where} is "
                        f"missing (all {rows} rows are {marker}); the head would train nothing "
                        f"and evaluate to NaN; {fix}")
            weight = weights.get(head)
            if weight is not None and not (weight[present] > 0).any():
                labelled = " of the rows with a label" if marker is not None else ""
                raise ConfigError(
                    f"data.sample_weights.{head}: every sample weight{labelled} of head {head!r} "
                    f"in {where} is 0; the head would train nothing and evaluate to a loss of 0 "
                    f"(a perfect fit it never made); {fix}")


def _read(data: DataConfig, heads: list[str], seed: int) -> MultiTaskData:
    kind = data.kind
    if kind in ("mmoe", "mixed"):
        return _synthetic(data, heads, seed)
    if kind == "multidigits":
        from multihead.datasets.multidigits import TASKS, multidigits

        for head in heads:  # a subset of the tasks trains single-task baselines
            if head not in TASKS:
                raise ConfigError(f"model.heads.{head}: data kind multidigits has no task {head!r} "
                                  f"(its tasks: {list(TASKS)})")
        full = _generated(multidigits, data, seed)
        return MultiTaskData(x_train=full.x_train, y_train={h: full.y_train[h] for h in heads},
                             x_eval=full.x_eval, y_eval={h: full.y_eval[h] for h in heads},
                             kinds={h: full.kinds[h] for h in heads}, task_correlation=math.nan)
    if kind == "esmm":
        return _impressions(data, heads, seed)
    if kind == "python":
        train, evaluation = from_function(data)
    else:
        if data.features == ALL_FEATURES:
            data.features = _all_features(data, data.train or "train", heads)
        train = _read_split(data, data.train or "train", "data.train", heads)
        evaluation = None if data.eval is None else _read_split(data, data.eval, "data.eval", heads)
    policy = data.on_nonfinite or data.on_nan or "error"
    # NaN marks a missing label of these heads: not a non-finite value to refuse or drop
    markers = {h: missing_label_of(data, h) for h in heads}
    masked = [h for h, marker in markers.items() if marker is not None and math.isnan(marker)]
    train = _checked(train, heads, policy, "data.train", masked)
    if evaluation is None:
        train, evaluation = _holdout(train, data.holdout, seed)
    else:
        evaluation = _checked(evaluation, heads, policy, "data.eval", masked)
        _check_same_shapes(train, evaluation)
    for split, where in ((train, "data.train"), (evaluation, "data.eval")):
        if _rows(split) == 0:
            raise ConfigError(f"{where}: no rows left (after data.on_nonfinite: {policy}); give "
                              "more data")
    kinds = {h: CLASSIFICATION if np.issubdtype(train[1][h].dtype, np.integer) else REGRESSION
             for h in heads}
    return MultiTaskData(x_train=train[0], y_train=train[1], x_eval=evaluation[0],
                         y_eval=evaluation[1], kinds=kinds, task_correlation=math.nan,
                         w_train=_weights_of(train), w_eval=_weights_of(evaluation))


# -- the embedded generator --------------------------------------------------------------


def _synthetic(data: DataConfig, heads: list[str], seed: int) -> MultiTaskData:
    tasks = data.tasks if data.tasks is not None else heads
    # Tasks without a head are generated and dropped: a single-task baseline (`train
    # --only-head`) keeps the multi-task run's task list, so its head sees the same data.
    for head in heads:
        if head not in tasks:
            raise ConfigError(f"model.heads.{head}: the data has no task {head!r} (tasks: {tasks})")
    classification = data.classification
    if classification is None:
        classification = tasks[:1] if data.kind == "mixed" else []
    try:
        full = mmoe_synthetic(
            tasks=tasks, correlation=data.correlation, train_size=data.train_size,
            eval_size=data.eval_size, input_dim=data.input_dim, num_sinusoids=data.num_sinusoids,
            scale=data.scale, noise_std=data.noise_std, classification=classification, seed=seed,
            clusters=data.clusters,
        )
    except ValueError as err:
        raise ConfigError(f"data: {err}") from None
    if list(tasks) == list(heads):
        return full
    return dataclasses.replace(full, y_train={h: full.y_train[h] for h in heads},
                               y_eval={h: full.y_eval[h] for h in heads},
                               kinds={h: full.kinds[h] for h in heads})


def _impressions(data: DataConfig, heads: list[str], seed: int) -> MultiTaskData:
    """`kind: esmm`: the impression -> click -> conversion generator, the labels of `heads`."""
    from multihead.datasets.impressions import TASKS, impressions

    for head in heads:
        if head not in TASKS:
            raise ConfigError(f"model.heads.{head}: data kind esmm has no task {head!r} (its "
                              f"tasks: {list(TASKS)})")
    marker = missing_label_of(data, "cvr") if "cvr" in heads else math.nan
    if marker is None or not math.isnan(marker):
        raise ConfigError("data.missing_label.cvr: the cvr labels are NaN on impressions without "
                          "a click (a conversion is only seen after one); set data.missing_label: "
                          "{cvr: nan}")
    return _generated(impressions, data, seed).multitask(heads)


def _generated(generator: Any, data: DataConfig, seed: int) -> Any:
    """`generator(seed=seed, **data.options)`, its errors as one `data.options` line."""
    try:
        return generator(**{"seed": seed, **data.options})
    except TypeError as err:
        raise ConfigError(f"data.options: {str(err).splitlines()[0]}") from None
    except ValueError as err:  # the option's own check names it ("size: ..."); numpy does not
        line = str(err).splitlines()[0]
        named = line.split(":", 1)[0] in data.options
        raise ConfigError(f"data.options.{line}" if named else f"data.options: {line}") from None


# -- files -----------------------------------------------------------------------------


def _names(spec: Any) -> list[str]:
    """Column/array names a features or target spec reads."""
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, list):
        return list(spec)
    return [n for v in spec.values() for n in _names(v)]


def _spec_error(spec: Any, where: str) -> None:
    ok = isinstance(spec, str) or (isinstance(spec, list) and spec
                                   and all(isinstance(s, str) for s in spec))
    if not ok:
        raise ConfigError(f"{where}: expected a column/array name or a non-empty list of them, "
                          f"got {spec!r}")


def _specs(data: DataConfig, heads: list[str]) -> tuple[Any, dict[str, Any]]:
    features = DEFAULT_FEATURES if data.features is None else data.features
    if isinstance(features, Mapping):
        if not features:
            raise ConfigError("data.features: the mapping of named inputs is empty")
        for name, spec in features.items():
            _spec_error(spec, f"data.features.{name}")
        features = {str(k): v for k, v in features.items()}
    else:
        _spec_error(features, "data.features")
    # a head that data.targets does not map reads the column named as the head
    targets = {**{h: h for h in heads}, **dict(data.targets or {})}
    for head, spec in targets.items():
        _spec_error(spec, f"data.targets.{head}")
    return features, targets


def _all_features(data: DataConfig, path: str, heads: list[str]) -> list[str]:
    """`data.features: all`: every column (array, feature) of the training file that is not
    a head's target or a sample weight, in the file's order. Resolved once, from the training
    file: the run's config.yaml then lists them, so `predict` reads the same columns."""
    targets = {**{h: h for h in heads}, **dict(data.targets or {})}
    taken = set(_names(targets)) | set(data.sample_weights.values())
    if data.kind != "tfds":
        check_file(path, "data.train")
    if data.kind == "csv":
        names = csv_header(path, "data.train")
    elif data.kind == "tfrecord":
        names = tfrecord_features(path) or []
    elif data.kind == "npz":
        names = list(read_npz(path, "data.train"))
    else:
        names = list(read_tfds(data, path, "data.train"))
    features = [n for n in names if n not in taken]
    if not features:
        raise ConfigError(f"data.features: all: {path!r} has no column but the targets and sample "
                          f"weights ({sorted(taken)})")
    return features


def _read_split(data: DataConfig, path: str, where: str, heads: list[str]) -> tuple[Any, ...]:
    """One file -> `(inputs, {head: labels})`, with `{head: sample weights}` third when
    `data.sample_weights` names columns."""
    features, targets = _specs(data, heads)
    if data.kind != "tfds":
        check_file(path, where)
    what = _WHAT.get(data.kind, "feature")
    weights = dict(data.sample_weights)
    _check_weight_names(weights, features, targets, what)
    needed = list(dict.fromkeys(_names(features) + _names(targets) + list(weights.values())))
    source = f"{where} ({path})"
    keyed = [(f"data.features.{n}", s) for n, s in features.items()] \
        if isinstance(features, Mapping) else [("data.features", features)]
    keyed += [(f"data.targets.{h}", targets[h]) for h in heads]
    keyed += [(f"data.sample_weights.{h}", name) for h, name in weights.items()]
    if data.kind in ("tfds", "npz"):
        table = read_tfds(data, path, where) if data.kind == "tfds" else read_npz(path, where)
        _check_names(keyed, sorted(table), source, what)
    else:  # checked from the header (first record) before the file is parsed
        _check_names(keyed, csv_header(path, where) if data.kind == "csv"
                     else tfrecord_features(path), source, what)
        table = (read_csv(path, where, needed, data.dtypes) if data.kind == "csv" else
                 read_tfrecord(path, where, needed, data.dtypes, data.shapes))
    for name in needed:
        if name in table and np.ndim(table[name]) > 0 and len(table[name]) == 0:
            raise ConfigError(f"{where}: {path!r} has no rows ({what} {name!r} is empty); give a "
                              "file with examples")

    def select(spec: Any, key: str, label: bool) -> np.ndarray:
        columns = []
        for name in _names(spec):
            columns.append(numeric(table[name], f"{key} ({name!r} in {source})", label))
        if len(columns) == 1:
            return columns[0]
        _check_rows({n: c for n, c in zip(_names(spec), columns)}, key, source)
        if len({c.dtype for c in columns}) > 1:
            raise ConfigError(f"{key}: the columns {_names(spec)} have different dtypes "
                              f"{[str(c.dtype) for c in columns]}; give them one dtype")
        return np.concatenate([c.reshape(len(c), -1) for c in columns], axis=-1)

    if isinstance(features, Mapping):
        x: Any = {n: select(s, f"data.features.{n}", False) for n, s in features.items()}
    else:
        x = select(features, "data.features", False)
    y = {h: select(targets[h], f"data.targets.{h}", True) for h in heads}
    if not weights:
        return x, y
    return x, y, {h: _sample_weights(table[name], f"data.sample_weights.{h}", what, name, path)
                  for h, name in weights.items()}


def _check_weight_names(weights: Mapping[str, str], features: Any, targets: Mapping[str, Any],
                        what: str) -> None:
    """A sample-weight column is neither a feature nor a target."""
    for head, name in weights.items():
        used = {**{n: "data.features" for n in _names(features)},
                **{n: f"data.targets.{h}" for h, spec in targets.items() for n in _names(spec)}}
        if name in used:
            raise ConfigError(f"data.sample_weights.{head}: {what} {name!r} is also read by "
                              f"{used[name]}; a weight {what} must be neither a feature nor a "
                              "target")


def _sample_weights(column: np.ndarray, key: str, what: str, name: str, path: str) -> np.ndarray:
    """One finite, non-negative float32 weight per example, shape `(n,)`."""
    array = numeric(column, f"{key} ({what} {name!r} of {path!r})", False)
    if array.shape[1:] != (1,):
        raise ConfigError(f"{key}: {what} {name!r} of {path!r} has shape {array.shape[1:]} per "
                          "example; give one weight per example")
    array = array[:, 0]
    bad = ~np.isfinite(array) | (array < 0)
    if bad.any():
        first = int(np.argmax(bad))
        raise ConfigError(f"{key}: {what} {name!r} of {path!r} has {array[first]} at row {first} "
                          f"({int(bad.sum())} of {len(array)} rows bad); sample weights must be "
                          "finite and >= 0")
    return array


def _weights_of(split: tuple[Any, ...]) -> dict[str, np.ndarray]:
    """The `{head: sample weights}` of a split (empty without)."""
    return dict(split[2]) if len(split) > 2 else {}


def read_inputs(data: DataConfig, path: str, where: str = "--data",
                input_names: Sequence[str] | None = None) -> Any:
    """Only the inputs of a file laid out as a run's data (`multihead predict`): an `.npz`,
    `.csv` or `.tfrecord` read with the run's `data.features` (a `.npz` of a run on generated
    data holds its input as array `x`, or one array per named input). No labels are needed.
    With `data.per_head`, the file is read as the first head's data of the file's kind: a
    run whose heads read an `.npz` and a `.csv` predicts from either.

    Raises:
        ConfigError: naming `where`, for a missing file, array or column, or a wrong dtype.
    """
    ext = os.path.splitext(path)[1].lower()
    kinds = {".npz": "npz", ".csv": "csv", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord"}
    if ext not in kinds:
        raise ConfigError(f"{where}: {path!r} is not .npz, .csv or .tfrecord")
    kind = kinds[ext]
    data = _section_of_kind(data, kind)
    if kind != "npz" and data.kind != kind:
        raise ConfigError(f"{where}: a {kind} file needs a run trained on kind {kind} (its columns "
                          f"are data.features); this run's data kind is {data.kind!r}: give an .npz")
    check_file(path, where)
    if data.kind == kind and data.features is not None:  # laid out as the training files
        features: Any = data.features
    elif input_names is not None:
        features = {n: n for n in input_names}  # one array per named input
    else:
        features = DEFAULT_FEATURES
    source = f"{path!r} (the run's inputs are {_names(features)})"
    if kind == "npz":
        table = read_npz(path, where)
        _check_names([(where, features)], sorted(table), source, _WHAT[kind])
    else:
        _check_names([(where, features)], csv_header(path, where) if kind == "csv"
                     else tfrecord_features(path), source, _WHAT.get(kind, "feature"))
        table = (read_csv(path, where, _names(features), data.dtypes) if kind == "csv" else
                 read_tfrecord(path, where, _names(features), data.dtypes, data.shapes))

    def select(spec: Any) -> np.ndarray:
        columns = []
        for name in _names(spec):
            columns.append(numeric(table[name], f"{where} ({name!r})", False))
        return columns[0] if len(columns) == 1 else np.concatenate(columns, axis=-1)

    if isinstance(features, Mapping):
        return {n: select(s) for n, s in features.items()}
    return select(features)


#: What a name in `data.features` / `data.targets` names, by file kind.
_WHAT = {"npz": "array", "csv": "column"}
#: Names of a file an error lists at most.
_LISTED = 20


def _check_names(keyed: Sequence[tuple[str, Any]], available: list[str] | None, source: str,
                 what: str) -> None:
    """Every name of each `(key, spec)` is one of the file's `available` names (`None`: not
    known before parsing; the parser reports it). The error lists the file's names, at most
    `_LISTED` of them, and suggests the closest."""
    if available is None:
        return
    for key, spec in keyed:
        for name in _names(spec):
            if name not in available:
                listed = f"{available[:_LISTED]}" + (f" ... and {len(available) - _LISTED} more"
                                                     if len(available) > _LISTED else "")
                raise ConfigError(f"{key}: {source} has no {what} {name!r}"
                                  f"{suggest(name, available)}; it has {len(available)} "
                                  f"{what}s: {listed}")


def _section_of_kind(data: DataConfig, kind: str) -> DataConfig:
    """The data section a file of `kind` is laid out as: `data`, or with `data.per_head` the
    first head's section of that kind (every head's input has the same layout, checked at
    training, so any head of the file's kind names its columns), else the first head's."""
    if not data.per_head:
        return data
    sections = list(data.per_head.values())
    return next((s for s in sections if s.kind == kind), sections[0])


# -- checks shared by every source ---------------------------------------------------------


def _rows(split: tuple[Any, dict]) -> int:
    return len(tf.nest.flatten(_inputs_tree(split[0]))[0])


def _check_rows(arrays: Mapping[str, np.ndarray], where: str, source: str) -> None:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError(f"{where}: {source} has arrays of different lengths (ragged): "
                          + ", ".join(f"{n}: {k}" for n, k in lengths.items()))


def _checked(split: tuple[Any, ...], heads: list[str], policy: str, where: str,
             masked: Sequence[str] = ()) -> tuple[Any, ...]:
    """Heads vs targets, equal row counts, and the non-finite policy (NaN, +inf, -inf);
    NaN in the labels of the `masked` heads marks a missing label and is kept. Sample
    weights (a third element, checked when read) keep the rows the labels keep."""
    x, y = split[:2]
    weights = _weights_of(split)
    for head in y:
        if head not in heads:
            raise ConfigError(f"{where}: the data has a target {head!r} but the model has no head "
                              f"{head!r} (heads: {heads}); add the head or remove the target")
    for head in heads:
        if head not in y:
            raise ConfigError(f"model.heads.{head}: {where} has no target for this head "
                              f"(targets: {sorted(y)})")
    inputs = {"inputs": x} if not isinstance(x, Mapping) else {f"inputs {k!r}": v for k, v in x.items()}
    named = {**inputs, **{f"labels of {h!r}": y[h] for h in heads}}
    _check_rows({**named, **{f"sample weights of {h!r}": w for h, w in weights.items()}}, where,
                "the data")
    bad = np.zeros(len(next(iter(named.values()))), bool)
    for name, array in named.items():
        if np.issubdtype(array.dtype, np.floating):
            flat = array.reshape(len(array), -1)
            if name in {f"labels of {h!r}" for h in masked}:
                flat = np.where(np.isnan(flat), 0.0, flat)
            rows = ~np.isfinite(flat).all(axis=1)
            if rows.any() and policy == "error":
                first = int(np.argmax(rows))
                what = "NaN" if np.isnan(array[first]).any() else "inf"
                raise ConfigError(f"data.on_nonfinite: {where} has NaN or inf in the {name} "
                                  f"({int(rows.sum())} rows, first row {first}: {what}); clean "
                                  "the data or set data.on_nonfinite: drop (or keep)")
            bad |= rows
    if policy == "drop" and bad.any():
        keep = ~bad
        x = tf.nest.map_structure(lambda a: a[keep], _inputs_tree(x))
        y = {h: y[h][keep] for h in heads}
        weights = {h: w[keep] for h, w in weights.items()}
    return (x, {h: y[h] for h in heads}) + ((weights,) if weights else ())


def _check_same_shapes(train: tuple[Any, dict], evaluation: tuple[Any, dict]) -> None:
    for name, a, b in (("inputs", train[0], evaluation[0]),) + tuple(
            (f"labels of {h!r}", train[1][h], evaluation[1][h]) for h in train[1]):
        sa = tf.nest.map_structure(lambda t: t.shape[1:], _inputs_tree(a))
        sb = tf.nest.map_structure(lambda t: t.shape[1:], _inputs_tree(b))
        if sa != sb:
            raise ConfigError(f"data.eval: the {name} have shape {sb} per example, but in data.train "
                              f"{sa}; give both splits the same columns")


def _holdout(split: tuple[Any, dict], fraction: float, seed: int) -> tuple[tuple, tuple]:
    """A seeded random `fraction` of the rows as the eval split; both keep the file's order."""
    n = _rows(split)
    n_eval = min(n - 1, max(1, round(n * fraction)))
    if n < 2:
        raise ConfigError(f"data.holdout: data.train has {n} row(s), too few to hold out an eval "
                          "split; give data.eval or more rows")
    order = np.random.default_rng(seed).permutation(n)
    parts = []
    for idx in (np.sort(order[n_eval:]), np.sort(order[:n_eval])):
        parts.append(tuple([tf.nest.map_structure(lambda a: a[idx], _inputs_tree(split[0]))]
                           + [{h: v[idx] for h, v in d.items()} for d in split[1:]]))
    return parts[0], parts[1]
