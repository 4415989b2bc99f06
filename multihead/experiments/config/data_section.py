"""The `data:` section of an experiment config: where the examples come from, and the checks of
its keys against the data kind and the heads (the files themselves are read by
`multihead.experiments.build.data_sources`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence, Union

from multihead._checks import (
    check_bounds,
    check_choice,
    check_int,
    check_missing_label,
    describe,
    suggest,
)
from multihead.experiments.config.errors import ConfigError
from multihead.experiments.config.fields import MAGNITUDE_MAX
from multihead.experiments.config.fields import build as _build
from multihead.experiments.config.fields import field as _field

DATA_KINDS = ("mmoe", "mixed", "npz", "csv", "tfrecord", "tfds", "python", "multidigits", "esmm")
FILE_KINDS = ("npz", "csv", "tfrecord")
#: Kinds whose examples are a table of named columns/arrays, read with features and targets.
TABLE_KINDS = FILE_KINDS + ("tfds",)
#: `data.normalize: standard`: per-feature (x - mean) / std of the training split.
NORMALIZE_STANDARD = "standard"
#: `data.on_nonfinite`: what a non-finite value in the data does.
NONFINITE_POLICIES = ("error", "drop", "keep")


@dataclasses.dataclass
class DataConfig:
    """`data:` where the examples come from: the embedded synthetic data (`mmoe`, `mixed`), the
    shipped MultiDigits images, or your own (`npz`, `csv`, `tfrecord`, `python`; docs/data.md)."""

    kind: str = _field("mmoe", choices=DATA_KINDS,
                       doc="mmoe: all regression; mixed: first task binary classification; "
                           "multidigits: two overlaid handwritten digits (heads left, right); "
                           "esmm: impressions, clicks and conversions (tasks ctr, cvr, ctcvr); "
                           "npz, csv, tfrecord: files; tfds: a prepared tensorflow_datasets "
                           "dataset; python: module:function")
    tasks: Union[list[str], None] = _field(None, doc="task names; default: the model's heads")
    correlation: float = _field(0.5, doc="cosine similarity of the task weight vectors (within "
                                         "a cluster, with data.clusters)")
    clusters: Union[list[list[str]], None] = _field(
        None, doc="mmoe/mixed: groups of tasks, correlated within a group (data.correlation), "
                  "orthogonal across (cosine 0); default: one group of all tasks")
    train_size: int = _field(20000, minimum=1)
    eval_size: int = _field(2000, minimum=1)
    input_dim: int = _field(100, minimum=1, doc="mmoe/mixed only; other kinds take it from the data")
    num_sinusoids: int = _field(10, minimum=0)
    scale: float = _field(1.0, minimum=-MAGNITUDE_MAX, maximum=MAGNITUDE_MAX,
                          doc="c, the norm of every task weight vector")
    noise_std: float = _field(0.1, minimum=0, maximum=MAGNITUDE_MAX)
    classification: Union[list[str], None] = _field(None, doc="tasks binarised (mixed variant)")
    seed: Union[int, None] = _field(None, doc="data seed (generators, holdout split); default: "
                                              "the top-level seed")
    train: Union[str, None] = _field(None, doc="npz/csv/tfrecord: the training file; tfds: the "
                                               "training split (default train)")
    eval: Union[str, None] = _field(None, doc="the evaluation file (tfds: split); default: a "
                                              "holdout of train")
    name: Union[str, None] = _field(None, doc="tfds: the dataset name, e.g. my_data or my_data:1.0.0")
    data_dir: Union[str, None] = _field(None, doc="tfds: the directory it was prepared in "
                                                  "(nothing is downloaded); default: tfds' own")
    holdout: float = _field(0.2, doc="fraction of train held out for evaluation when eval is "
                                     "not given, in (0, 1); split with data.seed")
    features: Any = _field(None, doc="the input: a column/array name, a list of them "
                                     "(concatenated), a mapping input name -> those (named "
                                     "inputs), or all (every column but the targets and sample "
                                     "weights, listed in the run's config.yaml); default: x")
    targets: Any = _field(None, doc="head -> column/array name or list of them; a head not "
                                    "given reads the column/array of its own name")
    normalize: Union[bool, str, None] = _field(
        None, doc="standard (or true): standardize each input feature, (x - mean) / std with the "
                  "mean and std of the training split only (a constant feature: scale 1, as "
                  "sklearn's StandardScaler); stored with the run (inputs.json) and in the model, "
                  "so predict, export, load_run and .keras files apply it (docs/data.md)")
    dtypes: dict[str, str] = _field({}, doc="csv/tfrecord: column or feature -> float32, float64, "
                                            "int32 or int64 (default float32)")
    shapes: dict[str, list[int]] = _field({}, doc="tfrecord: feature -> shape of one example "
                                                  "(default [], a scalar)")
    function: Union[str, None] = _field(None, doc="python: module:function returning (inputs, "
                                                  "{head: labels}), a MultiTaskData or a batched "
                                                  "tf.data.Dataset; or {train: ..., eval: ...}")
    options: dict[str, Any] = _field({}, doc="python: keyword arguments of the function; "
                                             "multidigits, esmm: their options (docs/data.md, "
                                             "docs/esmm.md)")
    on_nonfinite: Union[str, None] = _field(
        None, choices=NONFINITE_POLICIES,
        doc="NaN or +-inf in features or labels: error (default), drop the rows, or keep them")
    on_nan: Union[str, None] = _field(None, choices=NONFINITE_POLICIES,
                                      doc="the former name of on_nonfinite (same values, same "
                                          "meaning: inf counts too)")
    per_head: dict[str, Any] = _field({}, doc="head -> a data section of its own (one dataset "
                                              "per head); then the source keys above are unused",
                                      section="DataConfig", each="<head>")
    sampling: str = _field("all", choices=("all", "uniform", "proportional", "temperature"),
                           doc="with per_head: every head a batch each step (all), or one head "
                               "drawn per step (docs/data.md)")
    temperature: float = _field(2.0, doc="temperature sampling: p_k proportional to n_k^(1/T)")
    missing_label: dict[str, Any] = _field(
        {}, doc="head -> the label value that marks a row without a label for that head: nan "
                "(NaN labels, opt-in) or a number (e.g. -1); such rows give the head nothing "
                "(docs/data.md)")
    sample_weights: dict[str, str] = _field(
        {}, doc="npz/csv/tfrecord: head -> the array/column/float feature of the same files "
                "holding that head's per-example weights (Keras' sample_weight: weighted loss "
                "and eval metrics; docs/data.md)")
    sampling_weights: dict[str, float] = _field({}, doc="head -> sampling weight (default: its "
                                                        "number of training examples)")
    allow_empty_heads: list[str] = _field(
        [], doc="heads that may have no labelled row in a split: every label missing "
                "(missing_label) or every sample weight 0. Refused by default: such a head "
                "trains nothing and its eval loss is NaN or 0 (docs/data.md)")


_DTYPES = ("float32", "float64", "int32", "int64")
#: Values in one example of a tfrecord feature (`data.shapes`): the reader allocates them per
#: record before it can check the file.
EXAMPLE_ELEMENTS_MAX = 1 << 28


def data_from_dict(raw: Any, heads: Sequence[str]) -> DataConfig:
    """A validated `data:` section on its own (what `mh.load_data` reads), for `heads`."""
    data = _build(DataConfig, raw, "data")
    check_data(data, list(heads))
    return data


#: `data:` keys that apply to all per-head sources, not to one source.
_SAMPLING_KEYS = ("per_head", "sampling", "temperature", "sampling_weights", "seed")


def check_data(data: DataConfig, heads: list[str], subset: bool = False) -> None:
    """`data` keys against its kind and the heads (with `subset`, some heads of the generated
    tasks: `train.only_heads`); the files themselves are read by the builder.
    With `data.per_head`, each head's section is checked on its own and replaces the raw
    mapping in `data.per_head`. `on_nan` (the former name) and `on_nonfinite` end equal."""
    if data.on_nan is not None and data.on_nonfinite is not None and data.on_nan != data.on_nonfinite:
        raise ConfigError(f"data.on_nan: {data.on_nan!r} differs from data.on_nonfinite "
                          f"{data.on_nonfinite!r}; on_nan is its former name: give only on_nonfinite")
    data.on_nonfinite = data.on_nan = data.on_nonfinite or data.on_nan or "error"
    data.normalize = _normalize(data.normalize, data.per_head)
    _check_sampling(data, heads)
    if data.per_head:
        return
    kind = data.kind
    if kind in FILE_KINDS and data.train is None:
        raise ConfigError(f"data.train: required for kind {kind}; give the path of the training file")
    if kind == "python" and data.function is None:
        raise ConfigError("data.function: required for kind python; give module:function")
    if data.function is not None:
        if kind != "python":
            raise ConfigError(f"data.function: only used with kind python, but kind is {kind!r}")
        module, sep, name = data.function.partition(":")
        if not sep or not module or not name:
            raise ConfigError(f"data.function: expected module:function, got {data.function!r}")
    for key in ("train", "eval", "features", "targets"):
        if getattr(data, key) is not None and kind not in TABLE_KINDS:
            raise ConfigError(f"data.{key}: only used with kind npz, csv, tfrecord or tfds, but "
                              f"kind is {kind!r}; remove it")
    if kind == "tfds" and data.name is None:
        raise ConfigError("data.name: required for kind tfds; give the dataset name")
    for key in ("name", "data_dir"):
        if getattr(data, key) is not None and kind != "tfds":
            raise ConfigError(f"data.{key}: only used with kind tfds, but kind is {kind!r}; remove it")
    for key in ("dtypes", "shapes"):
        if getattr(data, key) and kind not in ("csv", "tfrecord"):
            raise ConfigError(f"data.{key}: only used with kind csv or tfrecord, but kind is "
                              f"{kind!r}; remove it")
    if data.tasks is not None and kind in ("mmoe", "mixed"):
        _check_tasks(data.tasks, heads, subset)
    if data.clusters is not None:
        _check_clusters(data, heads, kind)
    if data.options and kind not in ("python", "multidigits", "esmm"):
        raise ConfigError(f"data.options: only used with kind python, multidigits or esmm, but kind is "
                          f"{kind!r}; remove it")
    check_bounds(data.holdout, "data.holdout", minimum=0, maximum=1, min_open=True, max_open=True,
                 error=ConfigError, hint="e.g. 0.2 evaluates on a fifth of data.train")
    for column, dtype in data.dtypes.items():
        check_choice(dtype, f"data.dtypes.{column}", _DTYPES, error=ConfigError)
    for feature, shape in data.shapes.items():
        for i, dim in enumerate(shape):
            check_int(dim, f"data.shapes.{feature}[{i}]", minimum=1, error=ConfigError)
        if math.prod(shape) > EXAMPLE_ELEMENTS_MAX:
            raise ConfigError(f"data.shapes.{feature}: {shape} is {math.prod(shape):.3g} values per "
                              f"example, more than {EXAMPLE_ELEMENTS_MAX} (1 GiB of float32); "
                              "give the shape of one example")
    if data.targets is not None:
        if not isinstance(data.targets, Mapping):
            raise ConfigError(f"data.targets: expected a mapping head -> column(s), got "
                              f"{describe(data.targets)}")
        _check_head_keys(data.targets, "data.targets", heads)  # other heads read their own name


def _normalize(value: Any, per_head: Any) -> str | None:
    """`data.normalize` as `"standard"` or None (`true` is `standard`, `false` none)."""
    if value is True:
        value = NORMALIZE_STANDARD
    if value is False:
        value = None
    if value is not None:
        check_choice(value, "data.normalize", (NORMALIZE_STANDARD,), error=ConfigError)
        if per_head:
            raise ConfigError("data.normalize: not supported with data.per_head (the heads share "
                              "one input path but have their own training splits); standardize "
                              "each head's data before, or use one dataset for all heads")
    return value


def _check_tasks(tasks: list[str], heads: list[str], subset: bool = False) -> None:
    """Every generated task has a head, except in a single-task baseline or a group of heads
    (trained on the multi-task run's data, `train --only-head`, `train.only_heads`), where
    the others are generated and dropped so the kept heads see the same data."""
    for i, task in enumerate(tasks):
        if task in tasks[:i]:
            raise ConfigError(f"data.tasks[{i}]: task {task!r} is listed twice")
    if len(heads) > 1 and not subset:
        for i, task in enumerate(tasks):
            if task not in heads:
                raise ConfigError(f"data.tasks[{i}]: task {task!r} has no head (heads: {heads}); "
                                  "add the head or remove the task (only a one-head baseline "
                                  "may generate tasks it does not train)")


def _check_clusters(data: DataConfig, heads: list[str], kind: str) -> None:
    """`data.clusters`: groups of the generated tasks, each task in exactly one."""
    if kind not in ("mmoe", "mixed"):
        raise ConfigError(f"data.clusters: only used with kind mmoe or mixed, but kind is "
                          f"{kind!r}; remove it")
    tasks = data.tasks if data.tasks is not None else heads
    seen = [t for cluster in data.clusters for t in cluster]
    for task in seen:
        if task not in tasks:
            raise ConfigError(f"data.clusters: {task!r} is not a task (tasks: {tasks})")
        if seen.count(task) > 1:
            raise ConfigError(f"data.clusters: task {task!r} is in two clusters")
    missing = [t for t in tasks if t not in seen]
    if missing:
        raise ConfigError(f"data.clusters: tasks {missing} are in no cluster; put each task in "
                          "one (a cluster of one task is [name])")


def missing_label_of(data: DataConfig, head: str) -> float | None:
    """`data.missing_label` of `head` as `Objective(missing_label=...)` takes it: NaN for
    `nan`, a float for a number, None when the head has none.

    Raises:
        ConfigError: the value is neither `nan` nor a number a float32 label can hold.
    """
    value = data.missing_label.get(head)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("nan", ".nan"):
        return float("nan")
    return check_missing_label(value, f"data.missing_label.{head}", error=ConfigError)


def _check_head_keys(keys: Any, where: str, heads: list[str]) -> None:
    """Every key of the mapping at `where` names a head of the model."""
    for head in keys:
        if head not in heads:
            raise ConfigError(f"{where}.{head}: the model has no head {head!r}"
                              f"{suggest(str(head), heads)}; its heads are {heads}")


def _check_sample_weights(data: DataConfig, heads: list[str]) -> None:
    """`data.sample_weights`: head -> the name of a column/array of the data files."""
    _check_head_keys(data.sample_weights, "data.sample_weights", heads)
    if not data.sample_weights:
        return
    if data.per_head:
        raise ConfigError("data.sample_weights: sample weights with one dataset per head "
                          "(data.per_head) are not supported; use one dataset for all heads")
    if data.kind not in FILE_KINDS:
        raise ConfigError(f"data.sample_weights: read from the data files (kind npz, csv or "
                          f"tfrecord), but data.kind is {data.kind!r}; pass sample_weight to "
                          "Trainer.fit instead")
    for head, name in data.sample_weights.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"data.sample_weights.{head}: expected the name of a column/array "
                              f"of the data files, got {name!r}")


def _check_sampling(data: DataConfig, heads: list[str]) -> None:
    """`data.per_head` (one source per head) and how its heads are drawn."""
    check_bounds(data.temperature, "data.temperature", minimum=0, min_open=True, error=ConfigError)
    _check_head_keys(data.sampling_weights, "data.sampling_weights", heads)
    _check_head_keys(data.missing_label, "data.missing_label", heads)
    for i, head in enumerate(data.allow_empty_heads):
        if head not in heads:
            raise ConfigError(f"data.allow_empty_heads[{i}]: the model has no head {head!r}"
                              f"{suggest(str(head), heads)}; its heads are {heads}")
    for head in data.missing_label:
        missing_label_of(data, head)
    _check_sample_weights(data, heads)
    for head, weight in data.sampling_weights.items():
        check_bounds(weight, f"data.sampling_weights.{head}", minimum=0, min_open=True,
                     error=ConfigError)
    if not data.per_head:
        if data.sampling != "all":
            raise ConfigError(f"data.sampling: {data.sampling} draws one head's dataset per step; "
                              "it needs data.per_head (a data section per head)")
        return
    defaults = DataConfig()
    for field in dataclasses.fields(DataConfig):
        if field.name not in _SAMPLING_KEYS + ("on_nan", "on_nonfinite", "missing_label", "normalize",
                                               "allow_empty_heads") and \
                getattr(data, field.name) != getattr(defaults, field.name):
            raise ConfigError(f"data.{field.name}: not used with data.per_head (each head's "
                              f"source is data.per_head.<head>.{field.name}); move or remove it")
    _check_head_keys(data.per_head, "data.per_head", heads)
    sections = {}
    for head in heads:
        where = f"data.per_head.{head}"
        raw = data.per_head.get(head)
        if raw is None:
            raise ConfigError(f"{where}: missing; with data.per_head every head needs a data "
                              "section of its own")
        if isinstance(raw, DataConfig):  # checked already (a config validated twice)
            sections[head] = raw
            continue
        if isinstance(raw, Mapping):
            for key in _SAMPLING_KEYS[:-1]:  # a written config holds them at their defaults
                if key in raw and raw[key] != getattr(defaults, key):
                    raise ConfigError(f"{where}.{key}: set it once in data, not per head")
            if "on_nan" not in raw and "on_nonfinite" not in raw:
                raw = {"on_nonfinite": data.on_nonfinite, **raw}
        section = _build(DataConfig, raw, where)
        if section.normalize not in (None, False):
            raise ConfigError(f"{where}.normalize: not supported with data.per_head (the heads "
                              "share one input path but have their own training splits); "
                              "standardize each head's data before")
        if section.sample_weights:
            raise ConfigError(f"{where}.sample_weights: sample weights with one dataset per head "
                              "(data.per_head) are not supported; use one dataset for all heads")
        try:
            check_data(section, [head])
        except ConfigError as err:  # the messages name data.<key>: point them at this head
            message = str(err)
            raise ConfigError(where + message[4:] if message.startswith("data.") else message) \
                from None
        sections[head] = section
    data.per_head = sections
