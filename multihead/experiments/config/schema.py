"""Experiment configs: YAML -> validated, typed config objects.

Nothing in the core imports this module: `multihead.experiments.build.builders` turns a config
into library objects, and everything a config can do, Python can do directly.
Errors name the file and the key path (`model.heads.y1.every`), show the bad
value and, for unknown keys, suggest the closest known one.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence, Union

import yaml

from multihead._boundary import BoundaryError, read_text
from multihead._checks import (
    check_bounds, check_choice, check_float, check_keys, describe, suggest)
from multihead.settings import (
    SettingError,
    check_affinity,
    check_loss_scaling,
    check_rep_grad_data,
    check_rep_grad_trunk,
    check_strategy_limits,
    check_trunk_aggregation,
)
from multihead.experiments.config.data_section import DataConfig, check_data
from multihead.experiments.config.errors import ConfigError
from multihead.experiments.config.spelling import CONFIG as _CONFIG, ConfigSpelling as _ConfigSpelling
from multihead.experiments.config.yaml12 import MAX_BYTES
from multihead.experiments.config.objective_section import (
    HeadConfig,
    ObjectiveConfig,
    check_objectives as _check_objectives,
    check_only_heads,
    objective_configs,
    objective_path,
    trains_trunk as _trains_trunk,
)
from multihead.experiments.config.fields import build as _build
from multihead.experiments.config.fields import field as _field
from multihead.experiments.config.fields import join as _join
from multihead.experiments.config.step_section import StepSection, step_options
from multihead.experiments.config.callbacks_section import CallbacksConfig, ReduceLROnPlateauConfig
from multihead.experiments.config.rl_section import (
    ActorCriticConfig,
    DQNConfig,
    EnvConfig,
    RL_TASKS,
    PPOConfig,
    SACConfig,
    TD3Config,
)
from multihead.monitoring.metric_key import MEAN_LOSS, MetricKey


def _config_error(err: SettingError) -> ConfigError:
    """A core rule's error, spelled with `_CONFIG`, as a `ConfigError`."""
    return ConfigError(str(err))


# -- YAML ------------------------------------------------------------------------------


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parses YAML safely (no Python objects can be constructed), with YAML 1.2 semantics
    (`yes` and `1:30` are strings, `010` is 10), duplicate keys refused and size, depth and
    alias expansion bounded (`multihead.experiments.config.yaml12`)."""
    from multihead.experiments.config.yaml12 import describe_error, load_yaml

    try:
        return load_yaml(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: invalid YAML: {describe_error(err)}") from None


# -- schema ----------------------------------------------------------------------------



@dataclasses.dataclass
class ModelConfig:
    """`model:` the shared trunk and the heads."""

    trunk: Any = _field(doc="Keras layer dict, list of them, or {mlp: {...}}")
    heads: dict[str, HeadConfig] = _field(doc="head name -> head config", each="<head>")
    taps: dict[str, Any] = _field({}, doc="head -> the trunk block it reads instead of the trunk's "
                                          "output (trunk taps): a layer name or index of a list "
                                          "trunk; it trains only the blocks up to it")


@dataclasses.dataclass
class TrunkConfig:
    """`train.trunk:` one trunk optimizer fed by an aggregate of the heads' trunk gradients."""

    optimizer: Any = _field("adam", doc="Keras optimizer name or serialization dict")
    aggregator: Any = _field("sum", doc="a name in multihead.AGGREGATORS (a loss weighting's "
                                        "name: that weighting with sum), or {class_name: "
                                        "'pkg>Name', config: {...}} of a registered class")
    options: dict[str, Any] = _field({}, doc="the aggregator's options, e.g. {c: 0.4} for cagrad")
    loss_weighting: Any = _field(None, doc="a name in multihead.LOSS_WEIGHTINGS, or {class_name: "
                                           "'pkg>Name', config: {...}}; scales the losses, then "
                                           "the aggregator combines")
    loss_weighting_options: dict[str, Any] = _field({}, doc="the loss weighting's options")
    rep_grad: bool = _field(False, doc="combine at the trunk output (MGDA-UB style)")
    seed: Union[int, None] = _field(None, doc="PCGrad order seed; default: the top-level seed")
    dtype: str = _field("float32", doc="float32, or float64 for analysis (Gramian, solve, state)")


@dataclasses.dataclass
class TrainConfig(StepSection):
    """`train:` how long and how."""

    steps: Union[int, None] = _field(None, minimum=1, doc="training steps; default 1000 when "
                                                          "train.epochs is not given")
    epochs: Union[int, None] = _field(
        None, minimum=1, doc="instead of train.steps (task supervised): passes over the training "
                             "data, ceil(rows / batch_size) steps each; with data.per_head, over "
                             "the largest head's data")
    batch_size: int = _field(128, minimum=1)
    eval_every: Union[int, None] = _field(None, minimum=1, doc="default: only at the end")
    steps_per_execution: Union[int, str] = _field(
        "auto", minimum=1, choices=("auto",),
        doc="steps per compiled call, or auto (~50 ms per call); changes nothing but speed")
    trunk: Any = _field("per_head", doc="per_head, or a TrunkConfig mapping (trunk aggregation)",
                        section=TrunkConfig)
    max_nonfinite_steps: int = _field(10, minimum=1,
                                      doc="stop with an error when a head's loss or gradient is "
                                          "non-finite this many steps in a row")
    mixed_precision: Union[str, None] = _field(
        None, choices=("float16", "bfloat16"),
        doc="compute in float16 (a dynamic loss scale per head) or bfloat16, each head's output "
            "layer in float32; variables stay float32; default: float32 (docs/training.md)")
    only_heads: Union[list[str], None] = _field(None, doc="train these heads alone, as train "
                                                "--only-head does (docs/affinity.md); null: all")


@dataclasses.dataclass
class LogConfig:
    """`log:` TensorBoard cadence."""

    every: int = _field(100, minimum=1, doc="scalars every this many steps")
    histograms_every: int = _field(1000, minimum=0,
                                   doc="gradient histograms every this many steps; 0: never")
    variable_norms: bool = _field(False, doc="also log each variable's gradient norm")
    affinity_every: int = _field(0, minimum=0, doc="inter-task affinities affinity/<i>/<j> every "
                                                   "this many steps (docs/affinity.md); 0: never")
    affinity_lookahead: str = _field("optimizer", choices=("optimizer", "sgd"), doc="each head's "
                                     "own optimizer step, or the paper's plain gradient step")
    tensorboard: bool = _field(True, doc="write TensorBoard events; false is needed for XLA")


@dataclasses.dataclass
class CheckpointConfig:
    """`checkpoint:` what the run saves (`RUN_DIR/checkpoints/ckpt-<step>`, for --resume)."""

    every: int = _field(0, minimum=0, doc="periodic checkpoints; 0: only the final one")
    keep: int = _field(3, minimum=1, doc="how many of the newest checkpoints to keep")


@dataclasses.dataclass
class DistributeConfig:
    """`distribute:` scale-out through tf.distribute (task supervised; see README)."""

    strategy: str = _field("none", choices=("none", "mirrored", "multi_worker"),
                           doc="mirrored: the devices of this machine; multi_worker: the "
                               "workers named by the TF_CONFIG environment variable")
    devices: Union[list[str], None] = _field(
        None, doc="mirrored only, e.g. [/gpu:0, /gpu:1]; default: every GPU, else every CPU device")
    timeout_s: Union[float, None] = _field(600.0, minimum=1, doc=(
        "multi_worker only: the longest wait for the other workers (start-up, one all-reduce, "
        "heartbeats); past it the worker fails with one line; null: wait forever"))


@dataclasses.dataclass
class ExperimentConfig:
    """A whole experiment file."""

    model: ModelConfig = _field()
    seed: int = _field(0)
    task: str = _field("supervised", choices=("supervised", *RL_TASKS))
    data: DataConfig = _field(DataConfig(), doc="supervised only")
    env: Union[EnvConfig, None] = _field(None, doc="RL tasks only")
    dqn: Union[DQNConfig, None] = _field(None, doc="task dqn only")
    actor_critic: Union[ActorCriticConfig, None] = _field(None, doc="task actor_critic only")
    ppo: Union[PPOConfig, None] = _field(None, doc="task ppo only")
    td3: Union[TD3Config, None] = _field(None, doc="task td3 only")
    sac: Union[SACConfig, None] = _field(None, doc="task sac only")
    train: TrainConfig = _field(TrainConfig())
    log: LogConfig = _field(LogConfig())
    checkpoint: CheckpointConfig = _field(CheckpointConfig())
    callbacks: CallbacksConfig = _field(CallbacksConfig(), doc="supervised only")
    distribute: DistributeConfig = _field(DistributeConfig())
    objectives: dict[str, ObjectiveConfig] = _field(
        {}, doc="objectives not named for a head (docs/objectives.md)", each="<name>")
    sweep: Any = _field(None, doc="multihead sweep only: grid, zip and random axes "
                                  "(docs/sweeps.md); multihead train ignores it")


# -- validation ------------------------------------------------------------------------


def from_dict(raw: Any, source: str = "<config>", allow_import: Sequence[str] = ()) -> ExperimentConfig:
    """Validates a parsed config; errors are prefixed with `source`. `allow_import`: modules
    an `env.id` (`module:Env`) or a `data.function` (`module:function`) may import."""
    from multihead.experiments.config.value_checks import check_rules

    try:
        config = _build(ExperimentConfig, raw, "")
        check_rules(config, allow_import, error=ConfigError)
        if not config.model.heads:
            raise ConfigError("model.heads: at least one head is required")
        for name, spec in objective_configs(config).items():
            path = objective_path(config, name)
            spec.weight = _check_weight(spec.weight, f"{path}.weight")
            spec.trunk_scale = _check_weight(spec.trunk_scale, f"{path}.trunk_scale", minimum=None)
        _check_objectives(config)
        check_only_heads(config.train.only_heads, list(config.model.heads))
        config.train.trunk = _check_trunk(config)
        _check_length(config.train, config.task)
        config.callbacks.reduce_lr_on_plateau = _check_callbacks(config)
        _check_distribute(config)
        if config.sweep is not None:  # its own module: the rules of the sweep section
            from multihead.experiments.config.sweep_section import sweep_spec

            sweep_spec(config.sweep)
        check_data(config.data, list(objective_configs(config)), config.train.only_heads is not None)
        trunk = config.train.trunk
        try:
            check_rep_grad_data(isinstance(trunk, TrunkConfig) and trunk.rep_grad,
                                bool(config.data.per_head), _CONFIG)
            check_rep_grad_trunk(isinstance(trunk, TrunkConfig) and trunk.rep_grad, "", False,
                                 _CONFIG, tapped=list(config.model.taps))
            step_options(config.train).check(logging=config.log.tensorboard, strategy=None,
                                             spell=_CONFIG)
            check_loss_scaling(config.train.mixed_precision == "float16",
                               isinstance(trunk, TrunkConfig), _CONFIG)
            check_affinity(config.log.affinity_every, config.log.tensorboard, None, _CONFIG)
        except SettingError as err:
            raise _config_error(err) from None
        for section, tasks in (("env", tuple(RL_TASKS)), *((task, (task,)) for task in RL_TASKS)):
            if getattr(config, section) is not None and config.task not in tasks:
                raise ConfigError(f"{section}: only used with task {' or '.join(tasks)}, "
                                  f"but task is {config.task!r}; remove it or change task")
        return config
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _check_length(train: TrainConfig, task: str) -> None:
    """Exactly one of `train.steps` and `train.epochs`; steps default to 1000."""
    if train.epochs is None:
        if train.steps is None:
            train.steps = 1000
        return
    if train.steps is not None:
        raise ConfigError(f"train.epochs: give train.steps or train.epochs, not both (steps "
                          f"{train.steps}, epochs {train.epochs}); set the other to null")
    if task != "supervised":
        raise ConfigError(f"train.epochs: only for task supervised (task {task!r} has no "
                          "dataset to pass over); give train.steps")


def _check_weight(weight: Any, path: str, minimum: float | None = 0) -> Union[float, dict[str, Any]]:
    """A head's `weight` (or `trunk_scale`, with `minimum=None`): a number >= `minimum`, or a
    Keras `LearningRateSchedule` serialization dict that deserializes (checked now, kept as
    the dict)."""
    if not isinstance(weight, Mapping):
        return check_float(weight, path, minimum=minimum, error=ConfigError,
                           hint="or give a schedule {class_name: ExponentialDecay, config: {...}}")
    import keras  # only when a schedule is given

    schedules = keras.optimizers.schedules
    known = [n for n in dir(schedules) if isinstance(getattr(schedules, n), type)
             and issubclass(getattr(schedules, n), schedules.LearningRateSchedule)
             and n != "LearningRateSchedule"]
    check_keys(weight, ["class_name", "config", "module", "registered_name"], path, error=ConfigError)
    name = weight.get("class_name")
    if name is None:
        raise ConfigError(f"{path}.class_name: required key is missing; a schedule is "
                          "{class_name: ExponentialDecay, config: {...}}")
    check_choice(name, f"{path}.class_name", known, error=ConfigError)
    options = weight.get("config") or {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"{path}.config: expected a mapping, got {describe(options)}")
    try:
        getattr(schedules, name).from_config(dict(options))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{path}.config: cannot build {name}: {str(err).splitlines()[0]}") from None
    return {"class_name": name, "config": dict(options)}


def _check_callbacks(config: ExperimentConfig) -> list[ReduceLROnPlateauConfig]:
    """Validates `callbacks` against the task, the heads and their metrics; returns
    `reduce_lr_on_plateau` as a list of typed entries."""
    callbacks = config.callbacks
    raw = callbacks.reduce_lr_on_plateau
    path = "callbacks.reduce_lr_on_plateau"
    heads = list(objective_configs(config))
    if raw is None:
        raw = []
    if isinstance(raw, Mapping):  # head -> options
        entries = []
        for head, options in raw.items():
            where = _join(path, head)
            if options is None:
                options = {}
            if not isinstance(options, Mapping):
                raise ConfigError(f"{where}: expected a mapping of options, got {describe(options)}")
            if "head" in options:
                raise ConfigError(f"{where}.head: the key {head!r} already names the head; remove it")
            entry = _build(ReduceLROnPlateauConfig, {**options, "head": str(head)}, where)
            entries.append((where, where, entry))  # the key names the head
    elif isinstance(raw, list):
        entries = [(f"{path}[{i}]", f"{path}[{i}].head",
                    _build(ReduceLROnPlateauConfig, item, f"{path}[{i}]"))
                   for i, item in enumerate(raw)]
    else:
        raise ConfigError(f"{path}: expected a list of {{head: ..., factor: ...}} or a mapping "
                          f"head -> options, got {describe(raw)}")
    used = [name for name in ("early_stopping", "best_checkpoint") if getattr(callbacks, name)]
    used += ["reduce_lr_on_plateau"] if entries else []
    if used and config.task != "supervised":
        raise ConfigError(f"callbacks.{used[0]}: only used with task supervised, but task is "
                          f"{config.task!r}; remove it")
    seen: dict[str, str] = {}
    for where, head_key, entry in entries:
        if entry.head not in heads:
            raise ConfigError(f"{head_key}: the model has no head {entry.head!r}"
                              f"{suggest(entry.head, heads)}; its heads are {heads}")
        if entry.head in seen:
            raise ConfigError(f"{head_key}: head {entry.head!r} already has an entry at "
                              f"{seen[entry.head]}; give one entry per head")
        seen[entry.head] = where
        check_bounds(entry.factor, f"{where}.factor", minimum=0, maximum=1, min_open=True,
                     max_open=True, error=ConfigError, hint="e.g. 0.5 halves the rate")
        entry.monitor = _check_monitor(config, entry.monitor or str(MetricKey(entry.head, "loss")),
                                       entry.mode, f"{where}.monitor")
    for name in ("early_stopping", "best_checkpoint"):
        section = getattr(callbacks, name)
        if section is not None and section.per_head:
            _check_per_head(section, f"callbacks.{name}")
        elif section is not None:
            if getattr(section, "restore_heads", False):
                raise ConfigError(f"callbacks.{name}.restore_heads: needs per_head: true")
            section.monitor = _check_monitor(config, section.monitor, section.mode,
                                             f"callbacks.{name}.monitor")
    if callbacks.early_stopping is not None and callbacks.early_stopping.restore_best is None:
        callbacks.early_stopping.restore_best = not callbacks.early_stopping.per_head
    for name in [n for n in used if n != "best_checkpoint"]:
        if config.train.eval_every is None:
            raise ConfigError(f"callbacks.{name}: acts at evaluations, but train.eval_every is not "
                              "set (the run evaluates only at its end); set train.eval_every")
    return [entry for _, _, entry in entries]


def _check_per_head(section: Any, path: str) -> None:
    """A `per_head` callback section watches each head's `eval/<head>/loss`: no monitor of
    its own, and (early stopping) no whole-model restore."""
    if section.monitor != MEAN_LOSS:
        raise ConfigError(f"{path}.monitor: not used with per_head (each head watches "
                          f"eval/<head>/loss), got {section.monitor!r}; remove it")
    if getattr(section, "restore_best", None):
        raise ConfigError(f"{path}.restore_best: not with per_head (a stopped head is frozen; "
                          "its best model is in RUN_DIR/best/<head>/ with callbacks."
                          "best_checkpoint.per_head); remove it")


def _check_monitor(config: ExperimentConfig, monitor: str, mode: str, path: str) -> str:
    """A callback's `monitor` naming a head and a metric the evaluation reports, with the
    metric as the evaluation names it (`eval/y1/mae` -> `eval/y1/mean_absolute_error`)."""
    heads = list(objective_configs(config))
    try:
        key = MetricKey.parse(monitor)
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from None
    if not key.is_mean_loss:
        head, metric = key.head, key.metric
        if head not in heads:
            raise ConfigError(f"{path}: the model has no head {head!r} (in {monitor!r})"
                              f"{suggest(head, heads)}; its heads are {heads}")
        names = _metric_names(config, head)
        if metric not in names:
            available = [str(MetricKey(head, n)) for n in dict.fromkeys(names.values())] + [MEAN_LOSS]
            raise ConfigError(f"{path}: the evaluation of head {head!r} has no metric {metric!r}"
                              f"{suggest(metric, names)}; available: {', '.join(available)}")
        monitor = str(MetricKey(head, names[metric]))
    from multihead.training.callbacks import MonitoredQuantity  # TF import: only when used

    try:
        MonitoredQuantity(monitor, mode, "callback")
    except ValueError as err:
        raise ConfigError(f"{path.rsplit('.', 1)[0]}.mode: {str(err).partition(': ')[2]}") from None
    return monitor


def _metric_names(config: ExperimentConfig, head: str) -> dict[str, str]:
    """What a monitor may call each metric of `head` -> the name the evaluation reports it
    under: `loss`, the resolved names and the names as written in `metrics:`."""
    from multihead.objectives.objective import resolve_metric  # TF import: only when used

    spec = objective_configs(config)[head]
    names = {"loss": "loss"}
    for metric in spec.metrics:
        try:
            resolved = resolve_metric(metric, head, spec.loss).name
        except (ValueError, TypeError):
            continue  # reported under model.heads.<head>.metrics by the builder
        names[resolved] = resolved
        if isinstance(metric, str):
            names.setdefault(metric, resolved)
    return names


def _check_distribute(config: ExperimentConfig) -> None:
    """`distribute` against the task and the training options it does not support."""
    dist = config.distribute
    if dist.devices is not None and dist.strategy != "mirrored":
        raise ConfigError(f"distribute.devices: only used with strategy mirrored, but strategy is "
                          f"{dist.strategy!r}; remove devices")
    if dist.devices is not None and not dist.devices:
        raise ConfigError("distribute.devices: the list is empty; name devices such as /gpu:0 "
                          "or remove the key")
    if dist.strategy == "none":
        return
    if config.task != "supervised":
        raise ConfigError(f"distribute.strategy: {dist.strategy} is only supported with task "
                          f"supervised, but task is {config.task!r}; set distribute.strategy: none")
    trunk = config.train.trunk
    weighting = None
    if isinstance(trunk, TrunkConfig):
        from multihead.aggregation.registry import LOSS_WEIGHTINGS  # TF import: only when used

        if isinstance(trunk.aggregator, str) and trunk.aggregator in LOSS_WEIGHTINGS:
            weighting = trunk.aggregator
        elif trunk.loss_weighting is not None:
            weighting = (trunk.loss_weighting if isinstance(trunk.loss_weighting, str)
                         else str(trunk.loss_weighting.get("class_name")))
    try:
        step_options(config.train).check(
            logging=False, strategy=f"distribute.strategy {dist.strategy}", spell=_CONFIG)
        check_affinity(config.log.affinity_every, True, f"distribute.strategy {dist.strategy}",
                       _CONFIG)
        check_strategy_limits(f"distribute.strategy {dist.strategy}",
                              rep_grad=isinstance(trunk, TrunkConfig) and trunk.rep_grad,
                              loss_weighting=weighting, spell=_CONFIG)
    except SettingError as err:
        raise _config_error(err) from None


def _check_trunk(config: ExperimentConfig) -> Union[str, TrunkConfig]:
    """Validates `train.trunk` against the heads and schedule; returns it typed."""
    raw = config.train.trunk
    if raw == "per_head":
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"train.trunk: must be per_head or a mapping {{optimizer: ..., aggregator: ...}}, "
            f"got {describe(raw)}"
        )
    trunk = _build(TrunkConfig, raw, "train.trunk")
    from multihead.step.trunk_policy import TRUNK_AGGREGATORS, TrunkPolicy  # TF import: only when used

    for key in ("aggregator", "loss_weighting"):
        value = getattr(trunk, key)
        if not (value is None and key == "loss_weighting") and not isinstance(value, (str, Mapping)):
            raise ConfigError(f"train.trunk.{key}: expected a name or {{class_name: 'pkg>Name', "
                              f"config: {{...}}}}, got {describe(value)}")
    if isinstance(trunk.aggregator, str):
        check_choice(trunk.aggregator, "train.trunk.aggregator", TRUNK_AGGREGATORS, error=ConfigError)
    try:
        TrunkPolicy(optimizer=trunk.optimizer, aggregator=trunk.aggregator,
                    options=trunk.options, rep_grad=trunk.rep_grad, dtype=trunk.dtype,
                    loss_weighting=trunk.loss_weighting,
                    loss_weighting_options=trunk.loss_weighting_options)
    except SettingError as err:  # every check of the policy names its field
        field = err.field.partition(".")[2]  # the policy's own wording names it TrunkPolicy.<field>
        text = str(err).removeprefix(f"TrunkPolicy.{field}: ")
        raise ConfigError(f"{_CONFIG.key(err.field, err.head)}: {text}") from None
    try:
        check_trunk_aggregation(config.train.schedule,
                                {n: (_trains_trunk(h), h.every)
                                 for n, h in objective_configs(config).items()},
                                _ConfigSpelling(config.objectives))
    except SettingError as err:
        raise _config_error(err) from None
    trunk_heads = [n for n, h in objective_configs(config).items() if _trains_trunk(h)]
    try:
        TrunkPolicy(aggregator=trunk.aggregator, options=trunk.options).method.check_heads(
            len(trunk_heads))
    except ValueError as err:
        raise ConfigError(f"train.trunk.options: {err} (heads that train the trunk: "
                          f"{trunk_heads})") from None
    return trunk


def to_dict(config: ExperimentConfig) -> dict[str, Any]:
    """The config as plain data (what `multihead train` writes as the resolved config)."""
    return dataclasses.asdict(config)


# -- files and overrides ---------------------------------------------------------------


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Applies one `a.b.c=value` override in place; the value is parsed as YAML."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected KEY.PATH=VALUE")
    parts = key.strip().split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"--set {assignment!r}: {where} is {child!r}, not a mapping")
        node = child
    node[parts[-1]] = parse_yaml(text, source=f"--set {assignment!r}")


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = (),
                allow_import: Sequence[str] = (), *,
                inside: str | os.PathLike[str] | None = None) -> ExperimentConfig:
    """Reads, overrides and validates an experiment file.

    Args:
        path: the YAML file.
        overrides: `a.b.c=value` strings applied in order before validation.
        allow_import: modules the config may import: an `env.id` of the form `module:Env`,
            a `data.function` (`kind: python`) `module:function`.
        inside: a directory `path` lies in that is not trusted below itself (a sweep's
            `config.yaml`, read by its trials): the file is read through
            `multihead._boundary` (a regular file, no symlink followed, no FIFO opened).

    Raises:
        ConfigError: one line naming the file, the key path and what is wrong.
    """
    source = os.fspath(path)
    if inside is not None:
        text = _read_inside(source, os.fspath(inside))
    else:
        try:
            with open(source, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as err:
            raise ConfigError(f"{source}: cannot read the config ({err.strerror})") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"{source}: not UTF-8 text (byte {err.object[err.start]:#04x} at "
                              f"offset {err.start}); save the config as UTF-8") from None
    raw = parse_yaml(text, source)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a mapping at the top level")
    for assignment in overrides:
        apply_override(raw, assignment)
    return from_dict(raw, source, allow_import)


def _read_inside(source: str, base: str) -> str:
    """The text of `source`, a file below `base`, read through the boundary helper."""
    rel = os.path.relpath(os.path.abspath(source), os.path.abspath(base))
    try:
        return read_text(base, rel, limit=MAX_BYTES)
    except BoundaryError as err:
        raise ConfigError(str(err)) from None
