"""Config -> library objects. The only module that knows both the config and the core.

Layers, losses and optimizers are Keras' own serialization format, so any Keras
layer or optimizer works without a registry: `{"class_name": "Dense", "config":
{"units": 64}}` (the `module` key may be left out for built-in layers), plus the
shorthand `{"mlp": {"units": [64, 64], "activation": "relu"}}`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple, Sequence

import keras
import tensorflow as tf
import yaml

from multihead import _keras_internals as internals
from multihead._checks import check_float, check_int, check_keys, suggest
from multihead.experiments.build.architectures import build_architecture, is_architecture
from multihead.experiments.config.data_section import missing_label_of
from multihead.experiments.config.schema import (
    ConfigError,
    ExperimentConfig,
    objective_configs,
    objective_path,
    to_dict,
)
from multihead.training.callbacks import EarlyStopping, ReduceLROnPlateau
from multihead.training.head_early_stopping import HeadEarlyStopping
from multihead.datasets.multitask import MultiTaskData
from multihead.training.keras_model import MultiHeadModel
from multihead.model.standardize import Standardization, standardize_layer
from multihead.model.taps import resolve_taps
from multihead.step.options import options_of
from multihead.objectives.objective import Objective, resolve_loss, resolve_metric, resolve_optimizer
from multihead.training.trainer import Trainer
from multihead.io.best_checkpoint import BestCheckpoint

_MLP_KEYS = ("units", "activation", "output_activation", "dropout", "kernel_regularizer")


def _public_names(module: Any) -> list[str]:
    return [n for n in dir(module) if not n.startswith("_")]


#: `train.mixed_precision` -> the Keras dtype policy of every layer the builders make.
_POLICIES = {"float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}


def dtype_policy(config: ExperimentConfig) -> str | None:
    """The dtype policy `train.mixed_precision` asks for (`"mixed_float16"`, ...), or None."""
    precision = config.train.mixed_precision
    if precision is None:
        return None
    if precision not in _POLICIES:  # the schema checks it; a config built by hand may not be
        raise ConfigError(f"train.mixed_precision: expected float16 or bfloat16, got {precision!r}")
    return _POLICIES[precision]


def _mlp(spec: Any, path: str, dtype: str | None = None, output_dtype: str | None = None,
         ) -> keras.Sequential:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{path}: expected a mapping with 'units', got {spec!r}")
    check_keys(spec, _MLP_KEYS, path, error=ConfigError)
    units = spec.get("units")
    if not isinstance(units, list) or not units:
        raise ConfigError(f"{path}.units: expected a non-empty list of positive integers, got {units!r}")
    units = [check_int(u, f"{path}.units[{i}]", minimum=1, error=ConfigError,
                       hint="units lists the width of each Dense layer")
             for i, u in enumerate(units)]
    activation = spec.get("activation", "relu")
    output_activation = spec.get("output_activation", activation)
    dropout = check_float(spec.get("dropout", 0.0), f"{path}.dropout", minimum=0.0, maximum=1.0,
                          max_open=True, error=ConfigError)
    layers: list[keras.layers.Layer] = []
    try:
        for i, n in enumerate(units):
            last = i == len(units) - 1
            layers.append(keras.layers.Dense(
                n, activation=output_activation if last else activation,
                kernel_regularizer=spec.get("kernel_regularizer"),
                dtype=(output_dtype or dtype) if last else dtype,
            ))
            if dropout and not last:
                layers.append(keras.layers.Dropout(dropout, dtype=dtype))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{path}: {str(err).splitlines()[0]}") from None
    return keras.Sequential(layers)


def build_layer(spec: Any, path: str, dtype: str | None = None, output_dtype: str | None = None,
                ) -> keras.layers.Layer:
    """A Keras layer from a config spec: a Keras serialization dict, a list of specs
    (a `keras.Sequential`), or `{"mlp": {...}}`; `dtype`: the layers' dtype policy,
    `output_dtype`: the last layer's (None: `dtype`); a layer whose config names its own
    `dtype` keeps it; None for Keras' default.

    Raises:
        ConfigError: naming `path`, for unknown classes, bad arguments or shapes of spec.
    """
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{path}: the list of layers is empty")
        last = len(spec) - 1
        return keras.Sequential([build_layer(s, f"{path}[{i}]", dtype,
                                             output_dtype if i == last else None)
                                 for i, s in enumerate(spec)])
    if isinstance(spec, Mapping) and set(spec) == {"mlp"}:
        return _mlp(spec["mlp"], f"{path}.mlp", dtype, output_dtype)
    if not isinstance(spec, Mapping) or "class_name" not in spec:
        raise ConfigError(
            f"{path}: expected a Keras layer {{class_name: ..., config: {{...}}}}, a list of them, "
            f"or {{mlp: {{units: [...]}}}}, got {spec!r}"
        )
    spec = dict(spec)
    name = spec["class_name"]
    if "module" not in spec:
        if not isinstance(name, str) or not isinstance(getattr(keras.layers, name, None), type):
            raise ConfigError(
                f"{path}.class_name: unknown Keras layer {name!r}"
                f"{suggest(str(name), _public_names(keras.layers))}"
            )
        spec["module"] = "keras.layers"
    spec.setdefault("config", {})
    dtype = output_dtype or dtype
    if dtype is not None and isinstance(spec["config"], Mapping):
        spec["config"] = {"dtype": dtype, **spec["config"]}
    try:
        return keras.layers.deserialize(spec)
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"{path}: cannot build {name!r}: {str(err).splitlines()[0]}") from None


def build_model(config: ExperimentConfig, input_shape: Any,
                standardization: Standardization | Mapping[str, Standardization] | None = None,
                ) -> MultiHeadModel:
    """The model of `config.model`, built for inputs of `input_shape`: `(None, ...)`, or a dict
    input name -> shape for named inputs (see `named_inputs_trunk`).

    With `data.normalize`, `standardization` holds the training split's statistics (one
    input's, or a dict input name -> those), applied by the model's `preprocess` layer before
    the trunk (`multihead.model.standardize`).

    With `train.mixed_precision`, every layer computes in the mixed policy except each
    head's output layer, which computes in float32 (Keras' advice for a model's outputs:
    measured on the quickstart, bfloat16 output layers cost 7-10% of the final eval loss,
    float32 ones nothing beyond run-to-run noise; docs/performance.md)."""
    dtype = dtype_policy(config)
    if is_architecture(config.model.trunk):
        if isinstance(input_shape, Mapping):
            raise ConfigError(f"model.trunk: {next(iter(config.model.trunk))} takes one input "
                              f"tensor, but the data has named inputs {sorted(input_shape)}")
        trunk = build_architecture(config.model.trunk, list(config.model.heads), dtype=dtype)
    else:
        trunk = build_layer(config.model.trunk, "model.trunk", dtype)
    if isinstance(input_shape, Mapping):
        trunk = named_inputs_trunk(trunk, input_shape)
    heads = {
        name: build_layer(head.layers, f"model.heads.{name}.layers", dtype,
                          "float32" if dtype else None)
        for name, head in config.model.heads.items()
    }
    try:  # errors name the config key of the tap
        resolve_taps(trunk, config.model.taps, list(heads), where="model.taps")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    preprocess = None
    if config.task == "supervised" and config.data.normalize:
        if standardization is None:  # a caller's bug, said as what is missing
            raise ConfigError("data.normalize: the model needs the statistics of the training "
                              "split (the run's inputs.json holds them)")
        preprocess = standardize_layer(standardization)
    try:
        model = MultiHeadModel(trunk, heads, taps=config.model.taps, preprocess=preprocess)
        model.build(input_shape)
        model.partition  # noqa: B018 - validates the trunk/head partition now
    except (ValueError, TypeError, NotImplementedError) as err:  # NotImplementedError: no call()
        raise ConfigError(f"model: {_first_line(err)}") from None
    except (tf.errors.ResourceExhaustedError, MemoryError) as err:
        raise ConfigError(f"model: its weights do not fit in memory ({type(err).__name__}: "
                          f"{_first_line(err)}); use fewer units") from None
    return model


def _first_line(err: BaseException) -> str:
    """The first line of an error that says something (Keras starts some with a blank line)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def named_inputs_trunk(trunk: keras.layers.Layer, input_shape: Mapping[str, Any]) -> keras.Model:
    """A functional trunk for named inputs: each input flattened, concatenated in name order,
    then `trunk`. A trunk that is already a functional model taking these names is kept."""
    if isinstance(trunk, keras.Model) and isinstance(internals.functional_inputs(trunk), Mapping):
        return trunk
    inputs = {name: keras.Input(shape=tuple(input_shape[name][1:]), name=name)
              for name in sorted(input_shape)}
    flat = [keras.layers.Flatten()(t) if len(t.shape) != 2 else t for t in inputs.values()]
    joined = flat[0] if len(flat) == 1 else keras.layers.Concatenate()(flat)
    try:
        return keras.Model(inputs=inputs, outputs=trunk(joined), name="trunk")
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model.trunk: cannot take the named inputs {sorted(input_shape)}: "
                          f"{str(err).splitlines()[0]}") from None


def build_objectives(config: ExperimentConfig) -> dict[str, Objective]:
    """Objective name -> `Objective` (each head's own, then `objectives:`), with every loss,
    optimizer and metric resolved once to catch unknown names here rather than in the
    middle of a run."""
    objectives = {}
    for name, spec in objective_configs(config).items():
        path = objective_path(config, name)
        for key, resolve in [("loss", resolve_loss), ("optimizer", resolve_optimizer)]:
            try:
                if key == "loss":
                    resolve(spec.loss, name, missing_label_of(config.data, name))
                else:
                    resolve(spec.optimizer, name)
            except (ValueError, TypeError) as err:
                raise ConfigError(f"{path}.{key}: {err}") from None
        for i, metric in enumerate(spec.metrics):
            try:
                resolve_metric(metric, name)
            except (ValueError, TypeError) as err:
                raise ConfigError(f"{path}.metrics[{i}]: {err}") from None
        fields = dict(loss=spec.loss, optimizer=spec.optimizer, every=spec.every,
                      trains_trunk=spec.trains_trunk, metrics=list(spec.metrics),
                      on_nonfinite=spec.on_nonfinite,
                      missing_label=missing_label_of(config.data, name),
                      reads=spec.reads, combine=spec.combine, trains=spec.trains)
        for key in ("weight", "trunk_scale"):  # a number, or a schedule's serialization dict
            value = getattr(spec, key)
            fields[key] = dict(value) if isinstance(value, Mapping) else value
            try:
                Objective(**{**fields, key: fields[key]})
            except (ValueError, TypeError) as err:  # checked at load; a from_dict caller too
                raise ConfigError(f"{path}.{key}: {str(err).splitlines()[0]}") from None
        objectives[name] = Objective(**fields)
    return objectives


class RunCallbacks(NamedTuple):
    """The `fit` callbacks of a config's `callbacks:` section, by kind (None / empty when absent)."""

    early_stopping: EarlyStopping | None
    best_checkpoint: BestCheckpoint | None
    reduce_lr_on_plateau: tuple[ReduceLROnPlateau, ...]
    head_early_stopping: HeadEarlyStopping | None = None
    head_best: Mapping[str, BestCheckpoint] = {}

    def as_list(self) -> list[Any]:
        """Every callback, in the order `fit` calls them."""
        return [c for c in (self.early_stopping, self.head_early_stopping, self.best_checkpoint)
                if c is not None] + list(self.head_best.values()) + list(self.reduce_lr_on_plateau)


#: The run-directory file where per-head early stopping keeps the evaluations it saw.
HEAD_STOPPING_FILE = "head_stopping.json"


def build_callbacks(config: ExperimentConfig, best_dir: str | None) -> RunCallbacks:
    """The callbacks of `config.callbacks` (validated at load: heads, monitors, modes).

    Args:
        config: the experiment.
        best_dir: where `best_checkpoint` keeps its checkpoint (`RUN_DIR/best`, or
            `RUN_DIR/best/<head>` per head); None leaves it out (used to check the rest
            before a run directory exists).

    Raises:
        ConfigError: `reduce_lr_on_plateau` names a head whose optimizer has a
            learning-rate schedule (a schedule cannot be assigned a reduced rate).
    """
    cfg = config.callbacks
    plateau = []
    for i, entry in enumerate(cfg.reduce_lr_on_plateau):
        spec = objective_configs(config)[entry.head].optimizer
        try:
            rate = resolve_optimizer(spec, entry.head).learning_rate
        except (ValueError, TypeError):
            rate = None  # reported under model.heads.<head>.optimizer by build_objectives
        if rate is not None and not isinstance(rate, keras.Variable):
            raise ConfigError(
                f"callbacks.reduce_lr_on_plateau[{i}].head: the optimizer of head {entry.head!r} "
                "has a learning-rate schedule, which cannot be reduced on a plateau; give "
                f"model.heads.{entry.head}.optimizer a number as learning_rate, or remove the entry")
        plateau.append(ReduceLROnPlateau(
            entry.head, monitor=entry.monitor, factor=entry.factor, patience=entry.patience,
            min_delta=entry.min_delta, min_lr=entry.min_lr, cooldown=entry.cooldown,
            mode=entry.mode))
    stop = cfg.early_stopping
    best = cfg.best_checkpoint
    per_head_stop = stop is not None and stop.per_head
    per_head_best = best is not None and best.per_head and best_dir is not None
    # The record of per-head stopping sits beside best/ in the run directory, for --resume.
    record = None if best_dir is None else os.path.join(os.path.dirname(best_dir),
                                                        HEAD_STOPPING_FILE)
    return RunCallbacks(
        early_stopping=None if stop is None or per_head_stop else EarlyStopping(
            stop.monitor, patience=stop.patience, min_delta=stop.min_delta, mode=stop.mode,
            restore_best=stop.restore_best),
        best_checkpoint=None if best is None or best.per_head or best_dir is None else
        BestCheckpoint(best_dir, monitor=best.monitor, mode=best.mode, min_delta=best.min_delta),
        reduce_lr_on_plateau=tuple(plateau),
        head_early_stopping=HeadEarlyStopping(
            patience=stop.patience, min_delta=stop.min_delta, mode=stop.mode, record=record)
        if per_head_stop else None,
        head_best={h: BestCheckpoint(os.path.join(best_dir, h), monitor=f"eval/{h}/loss",
                                     mode=best.mode, min_delta=best.min_delta)
                   for h in objective_configs(config)} if per_head_best else {},
    )


def build_trunk(config: ExperimentConfig) -> Any:
    """`Trainer(trunk=...)` for `config.train.trunk`: `"per_head"` or a `TrunkPolicy`."""
    from multihead.step.trunk_policy import TrunkPolicy

    trunk = config.train.trunk
    if trunk == "per_head":
        return trunk
    try:
        resolve_optimizer(trunk.optimizer, "trunk")
    except (ValueError, TypeError) as err:
        raise ConfigError(f"train.trunk.optimizer: {err}") from None
    return TrunkPolicy(optimizer=trunk.optimizer, aggregator=trunk.aggregator,
                       options=dict(trunk.options), rep_grad=trunk.rep_grad,
                       seed=config.seed if trunk.seed is None else trunk.seed, dtype=trunk.dtype,
                       loss_weighting=trunk.loss_weighting,
                       loss_weighting_options=dict(trunk.loss_weighting_options))


def build_strategy(config: ExperimentConfig) -> Any:
    """The `tf.distribute` strategy of `config.distribute`, or None (`strategy: none`)."""
    from multihead.step.distribute import make_strategy

    try:
        return make_strategy(config.distribute.strategy, config.distribute.devices,
                             timeout_s=config.distribute.timeout_s)
    except ValueError as err:
        raise ConfigError(f"distribute: {err}") from None


def build_data(config: ExperimentConfig) -> MultiTaskData | dict[str, MultiTaskData]:
    """The data of `config.data` (any kind; `multihead.experiments.build.data_sources`); a dict
    head -> data with `data.per_head`."""
    from multihead.experiments.build.data_sources import build_data as read

    return read(config)


def build_trainer(config: ExperimentConfig, model: MultiHeadModel, objectives: Mapping[str, Objective],
                  run_dir: str | None, trunk: Any = "per_head", strategy: Any = None,
                  write_config: bool = True, target_networks: Sequence[Any] = ()) -> Trainer:
    """The `Trainer` of a run: the step's options, logging and non-finite settings from `config`.

    TensorBoard events go to `run_dir` (unless `log.tensorboard` is false or
    `run_dir` is None); with `write_config`, the resolved config is written as the
    `config` text summary at step 0. `target_networks` are updated inside each
    compiled train step, after the optimizers (`Trainer(target_networks=...)`).
    """
    cfg = config
    # The step's options are the `train:` keys of the same names (`StepOptions`).
    trainer = Trainer(model, objectives,
                      log_dir=run_dir if cfg.log.tensorboard else None, log_every=cfg.log.every,
                      histograms_every=cfg.log.histograms_every,
                      log_variable_norms=cfg.log.variable_norms,
                      affinity_every=cfg.log.affinity_every,
                      affinity_lookahead=cfg.log.affinity_lookahead,
                      trunk=trunk, strategy=strategy,
                      max_nonfinite_steps=cfg.train.max_nonfinite_steps,
                      target_networks=list(target_networks), **options_of(cfg.train))
    if trainer.monitor is not None and write_config:
        trainer.monitor.write_config(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return trainer
