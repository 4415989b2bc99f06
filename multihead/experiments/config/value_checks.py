"""Rules on the free-form parts of a config (Keras layer, loss, optimizer and metric specs,
seeds, `env.id`) that the typed schema in `multihead.experiments.config.schema` cannot state.

Each rule names the key path, shows the bad value and says what to do instead; `check_rules`
runs them all on a config freshly built from YAML, before anything is built from it, so
`validate` refuses what `train` would fail on (or, worse, run with: a negative learning
rate ascends the gradient).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from multihead.settings import REFUSED_OPTIMIZERS
from multihead.experiments.config.sizes import check_model_size

#: Seeds go to numpy (at most 2**32 - 1) and TF; bounded as every config integer is (int32).
SEED_MAX = 2**31 - 1
#: Integers inside Keras specs (units, filters, ...): beyond int32 they overflow in TF.
INT_LIMIT = 2**31 - 1
#: Floating dtypes a trainable layer may compute in (or a mixed-precision policy name).
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64", "mixed_float16", "mixed_bfloat16")
#: Optimizer arguments that clip gradients: a bound, so > 0 (0 or less zeroes every update).
_CLIPS = ("clipnorm", "clipvalue", "global_clipnorm")
#: Bound on the magnitude of a trunk aggregator's numeric options (a step size, a decay, a
#: weight): beyond it float32 updates overflow.
OPTION_MAGNITUDE_MAX = 1e6


def _walk(tree: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(key path, value) of every node of a plain-data tree, the root first."""
    stack = [(path, tree)]
    while stack:
        where, node = stack.pop()
        yield where, node
        if isinstance(node, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(node))))


def _check_numbers(tree: Any, path: str, error: type[Exception]) -> None:
    for where, value in _walk(tree, path):
        if isinstance(value, bool):
            continue
        if isinstance(value, numbers.Integral) and abs(value) > INT_LIMIT:
            raise error(f"{where}: {value} is beyond the integer range (|n| <= {INT_LIMIT})")
        if isinstance(value, numbers.Real) and not math.isfinite(value):
            raise error(f"{where}: must be a finite number, got {value!r}")


def _check_magnitudes(tree: Any, path: str, error: type[Exception]) -> None:
    for where, value in _walk(tree, path):
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and \
                abs(value) > OPTION_MAGNITUDE_MAX:
            raise error(f"{where}: |{value!r}| is beyond {OPTION_MAGNITUDE_MAX:g}; aggregator "
                        "options are step sizes, decays and weights of order 1")


def _class_name(spec: Any) -> str | None:
    if isinstance(spec, Mapping) and isinstance(spec.get("class_name"), str):
        return spec["class_name"].rsplit(">", 1)[-1]  # "keras.layers>Dense" -> "Dense"
    return None


def _check_layers(tree: Any, path: str, error: type[Exception]) -> None:
    for where, node in _walk(tree, path):
        name = _class_name(node)
        if name == "Lambda":
            raise error(f"{where}: Lambda layers are refused: their Python code cannot be "
                        "saved in a config or checkpoint, and loading it would run arbitrary "
                        "code; write a layer class registered with "
                        "keras.saving.register_keras_serializable")
        if name in ("Layer", "InputSpec", "Model"):
            raise error(f"{where}: class_name {name!r} is Keras' abstract base class, which "
                        "computes nothing; name a concrete layer such as Dense (or a list "
                        "of layers)")
        if name is not None and isinstance(node.get("config"), Mapping):
            dtype = node["config"].get("dtype")
            if isinstance(dtype, Mapping):  # a DTypePolicy dict
                dtype = (dtype.get("config") or {}).get("name", dtype.get("class_name"))
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise error(f"{where}.config.dtype: {dtype!r} cannot be trained (no gradient "
                            f"flows through it); use one of {list(FLOAT_DTYPES)}")


#: Optimizer hyperparameters that are plain numbers (Keras checks none of their types).
_NUMBERS = ("epsilon", "beta_1", "beta_2", "momentum", "rho", "weight_decay", "ema_momentum",
            "initial_accumulator_value", "learning_rate_power", "l1_regularization_strength",
            "l2_regularization_strength")


def _check_optimizer(spec: Any, path: str, error: type[Exception]) -> None:
    if isinstance(spec, str) or spec is None:
        return
    if not isinstance(spec, Mapping):
        return  # the builder names the type
    name = _class_name(spec)
    if name is None:
        raise error(f"{path}: an optimizer mapping needs class_name, e.g. "
                    "{class_name: Adam, config: {learning_rate: 0.001}}; got keys "
                    f"{sorted(map(str, spec))}")
    if name in REFUSED_OPTIMIZERS:  # the rule the Python API applies to the object
        raise error(f"{path}.class_name: {name} is refused: {REFUSED_OPTIMIZERS[name]}")
    config = spec.get("config")
    if isinstance(config, Mapping):
        rate = config.get("learning_rate")
        if isinstance(rate, numbers.Real) and not isinstance(rate, bool) and \
                not (math.isfinite(rate) and rate > 0):
            raise error(f"{path}.config.learning_rate: must be a finite number > 0, got {rate!r}"
                        " (a negative rate ascends the gradient)")
        for key in _CLIPS:
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not (math.isfinite(value) and value > 0)):
                raise error(f"{path}.config.{key}: must be a finite number > 0, got {value!r} "
                            "(gradients are clipped to it); remove it to clip nothing")
        for key in ("beta_1", "beta_2"):
            value = config.get(key)
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and \
                    not 0 <= value < 1:
                raise error(f"{path}.config.{key}: must be in [0, 1), got {value!r}")
        for key in _NUMBERS:  # Keras takes any value here and fails inside the compiled step
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not math.isfinite(value)):
                raise error(f"{path}.config.{key}: must be a finite number, got {value!r}")


def _check_loss(spec: Any, path: str, error: type[Exception]) -> None:
    if not isinstance(spec, Mapping):
        return
    name = _class_name(spec)
    if name is None:
        raise error(f"{path}: a loss mapping needs class_name, e.g. "
                    "{class_name: Huber, config: {delta: 1.0}}")
    config = spec.get("config")
    if name.lower() == "huber" and isinstance(config, Mapping) and "delta" in config:
        delta = config["delta"]
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not delta > 0:
            raise error(f"{path}.config.delta: the Huber delta must be a number > 0, got {delta!r}")


def _check_metrics(metrics: Sequence[Any], path: str, error: type[Exception]) -> None:
    for i, metric in enumerate(metrics):
        if not isinstance(metric, (str, Mapping)):
            raise error(f"{path}[{i}]: expected a metric name (e.g. mae) or "
                        f"{{class_name: ..., config: ...}}, got {metric!r}")
        if isinstance(metric, Mapping) and _class_name(metric) is None:
            raise error(f"{path}[{i}]: a metric mapping needs class_name")


def _check_seed(value: Any, path: str, error: type[Exception]) -> None:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and \
            not 0 <= value <= SEED_MAX:
        raise error(f"{path}: a seed must be in [0, {SEED_MAX}], got {value}")


#: Sinusoids per label of the MMoE synthetic data.
MAX_SINUSOIDS = 10_000
#: The synthetic data a config generates must fit in this many bytes (float32 inputs).
SYNTHETIC_BYTES_MAX = 4 << 30


def _check_synthetic_size(data: Any, error: type[Exception]) -> None:
    """The generated inputs (mmoe, mixed, multidigits, esmm) fit in `SYNTHETIC_BYTES_MAX`."""
    if data.kind in ("mmoe", "mixed"):
        if data.num_sinusoids > MAX_SINUSOIDS:  # generation time grows with it, per example
            raise error(f"data.num_sinusoids: must be <= {MAX_SINUSOIDS}, got "
                        f"{data.num_sinusoids} (Ma et al. use 10)")
        rows, width, where = data.train_size + data.eval_size, data.input_dim, "data.train_size"
    elif data.kind == "multidigits":
        options = data.options
        sizes = [options.get("train_size", 20000), options.get("eval_size", 4000),
                 options.get("canvas", 12)]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
            return  # the generator names the bad option
        rows, width, where = sizes[0] + sizes[1], sizes[2] ** 2, "data.options.train_size"
    elif data.kind == "esmm":
        options = data.options
        rows = [options.get("train_size", 100_000), options.get("eval_size", 20_000)]
        width = _input_width(data)
        if width is None or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                    for v in rows):
            return  # the generator names the bad option
        rows, where = sum(rows), "data.options.train_size"
    else:
        return
    needed = rows * width * 4
    if needed > SYNTHETIC_BYTES_MAX:
        raise error(f"{where}: the generated data would take {needed / 2**30:.1f} GiB "
                    f"(at most {SYNTHETIC_BYTES_MAX >> 30} GiB); use fewer or smaller examples")


def check_import(module: str, allow_import: Sequence[str], path: str, what: str,
                 error: type[Exception]) -> None:
    """Refuses a config value that would import the Python module `module` unless the user
    allowed it (`--allow-import MODULE` on the CLI, `allow_import=` in Python): importing runs
    the module's code, and a config may come from someone else (a run directory, a sweep).

    Args:
        module: the module the value would import.
        allow_import: the modules the user allowed.
        path: the key path the message names.
        what: the value and what imports it, e.g. `'m:Env' would make gymnasium import`.
        error: the exception class raised.
    """
    if module not in allow_import:
        raise error(f"{path}: {what} the Python module {module!r}; pass --allow-import {module} "
                    "(in Python: allow_import=[...]) if you trust it")


def _input_width(data: Any) -> int | None:
    """The input's feature count when the config states it (generated data), else None."""
    if data.kind in ("mmoe", "mixed"):
        return data.input_dim
    if data.kind == "multidigits":
        canvas = data.options.get("canvas", 12)
        return canvas ** 2 if isinstance(canvas, int) and not isinstance(canvas, bool) else None
    if data.kind == "esmm":
        sizes = [data.options.get(k, v) for k, v in (("numeric", 8), ("categorical", 2),
                                                      ("levels", 5))]
        if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes):
            return sizes[0] + sizes[1] * sizes[2]
    return None


def check_env_id(env_id: str, allow_import: Sequence[str], path: str,
                 error: type[Exception]) -> None:
    """`env.id` of the form `module:Env` makes gymnasium import `module`: refused unless the
    user allowed that module (`--allow-import MODULE`)."""
    if ":" not in env_id:
        return
    module = env_id.split(":", 1)[0]
    if module not in allow_import:
        raise error(f"{path}: {env_id!r} would make gymnasium import the Python module "
                    f"{module!r}; pass --allow-import {module} if you trust it, or use a "
                    "registered id such as CartPole-v1")


def check_data_function(data: Any, allow_import: Sequence[str], path: str,
                        error: type[Exception]) -> None:
    """`data.kind: python` imports and calls `data.function` (`module:function`): refused
    unless its module is allowed. `data` is a `DataConfig` or a raw `data.per_head.<head>`
    mapping; each per-head section is checked too."""
    if isinstance(data, Mapping):
        kind, function, per_head = data.get("kind"), data.get("function"), data.get("per_head")
    else:
        kind, function, per_head = data.kind, data.function, data.per_head
    if kind == "python" and isinstance(function, str) and ":" in function:  # else check_data names the form
        check_import(function.partition(":")[0], allow_import, f"{path}.function",
                     f"{function!r} would import and call", error)
    if isinstance(per_head, Mapping):
        for head, section in per_head.items():
            if isinstance(section, Mapping) or hasattr(section, "function"):
                check_data_function(section, allow_import, f"{path}.per_head.{head}", error)


def check_rules(config: Any, allow_import: Sequence[str] = (), *,
                error: type[Exception] = ValueError) -> None:
    """Runs every rule on an `ExperimentConfig` built from YAML (free-form parts still raw).

    Raises:
        error: the first rule broken, one line naming the key path.
    """
    _check_seed(config.seed, "seed", error)
    _check_seed(config.data.seed, "data.seed", error)
    check_data_function(config.data, allow_import, "data", error)
    _check_numbers(config.data.options, "data.options", error)
    _check_synthetic_size(config.data, error)
    _check_numbers(config.model.trunk, "model.trunk", error)
    _check_layers(config.model.trunk, "model.trunk", error)
    check_model_size(config.model.trunk, {n: h.layers for n, h in config.model.heads.items()},
                     _input_width(config.data), error)
    # Every objective, a head's own or one of `objectives:`, under the same rules: its
    # weight and trunk_scale schedules hold finite numbers as its optimizer does.
    specs = [(f"model.heads.{n}", h) for n, h in config.model.heads.items()]
    specs += [(f"objectives.{n}", o) for n, o in config.objectives.items()]
    for path, spec in specs:
        for key in ("layers", "loss", "optimizer", "metrics", "weight", "trunk_scale"):
            _check_numbers(getattr(spec, key, None), f"{path}.{key}", error)
        _check_layers(getattr(spec, "layers", None), f"{path}.layers", error)
        _check_loss(spec.loss, f"{path}.loss", error)
        _check_optimizer(spec.optimizer, f"{path}.optimizer", error)
        _check_metrics(spec.metrics, f"{path}.metrics", error)
    trunk = config.train.trunk
    if isinstance(trunk, Mapping):
        _check_numbers(trunk, "train.trunk", error)
        _check_magnitudes(trunk.get("options"), "train.trunk.options", error)
        _check_optimizer(trunk.get("optimizer"), "train.trunk.optimizer", error)
        _check_seed(trunk.get("seed"), "train.trunk.seed", error)
    if config.env is not None:
        _check_numbers(config.env.kwargs, "env.kwargs", error)
        check_env_id(config.env.id, allow_import, "env.id", error)
