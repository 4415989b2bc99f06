"""A run's hyperparameters and final metrics for TensorBoard's HParams dashboard.

Every `multihead train` run writes, at its end, one HParams session into a run of its
own, `<run_dir>/hparams` (TensorBoard's convention: a session is a run, and its metrics
are the scalars of that run and of the runs below it; an event file at the run directory
itself would show as a run named `.`):

- the hyperparameters, named by their config key path: `seed`, `task`, `model.trunk`
  (the architecture, as compact YAML), `train.schedule`, `train.steps` (or `train.epochs`),
  `train.batch_size`,
  `train.trunk` (`per_head` or the aggregator), the trunk optimizer and its learning rate
  when aggregated, and per head `model.heads.<h>.optimizer` (class name),
  `model.heads.<h>.optimizer.config.learning_rate` and `model.heads.<h>.weight`; plus every
  `--set KEY=VALUE` of the run under `KEY` (a sweep passes its axes that way, so the values
  that differ across a sweep are always there);
- the final evaluation of `metrics.json` as scalars `final/<head>/<metric>` and
  `final/mean_loss` (the mean of the heads' losses), at the run's last step.

Results first: the session's run holds nothing but those scalars, so the dashboard's metrics
are the final evaluation only, and TensorBoard checks the first five of them by default. In
the train run, the session's metrics were every diagnostic the run logs, which TensorBoard
sorts by name (`agg_cosine/...` before `final/...`) and of which it checks the first five.
The order is not set by an experiment summary (`hp.hparams_config`) per run because
TensorBoard reads one such summary per log directory: over `--logdir runs` it would show
one run's hyperparameters and heads as the columns of all. The diagnostics stay in the
Scalars and Custom Scalars tabs, where they are curves.

A seed (`seed`, any `*.seed`) is logged as its decimal string: TensorBoard prints a number
to 5 significant digits (seed 1 as `1.0000`, 123456 as `1.2346e+5`), and a seed is an
identity, not a quantity to order on an axis.

`tensorboard --logdir SWEEP_DIR` then lists every trial in the HParams table,
parallel-coordinates and scatter views; `multihead sweep` also writes the experiment
summary at the sweep directory (TensorBoard's convention), with the hyperparameters
that differ between its trials (the swept axes; the constant ones are hidden) and only
the `final/...` metrics.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import yaml

from multihead.experiments.config.schema import (
    ExperimentConfig,
    objective_configs,
    objective_path,
    parse_yaml,
)

if TYPE_CHECKING:  # annotation only
    from multihead.experiments.run.runner import Runner

HParamValue = bool | int | float | str

#: The run a session is written to: its own, beside `train` and `eval` (see the docstring).
SESSION_RUN = "hparams"


def _scalar(value: Any) -> HParamValue:
    """A value the HParams plugin can show: bool, int, float or str (others as flow YAML)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if value is None:
        return "null"
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()


def _method_name(spec: Any) -> str:
    return str(spec["class_name"]) if isinstance(spec, Mapping) else str(spec)


def _optimizer(spec: Any) -> tuple[str, HParamValue | None]:
    """(class name, learning rate) of an optimizer given as a name or a serialization dict."""
    if isinstance(spec, str):
        import keras  # the default learning rate of an optimizer given by name

        optimizer = keras.optimizers.get(spec)
        return type(optimizer).__name__, float(optimizer.get_config()["learning_rate"])
    if isinstance(spec, Mapping):
        rate = (spec.get("config") or {}).get("learning_rate")
        return str(spec.get("class_name")), None if rate is None else _scalar(rate)
    return _scalar(spec), None  # type: ignore[return-value]


def run_hparams(config: ExperimentConfig, overrides: Sequence[str] = ()) -> dict[str, HParamValue]:
    """The hyperparameters of a run (see the module docstring), key path -> value.

    Args:
        config: the run's resolved config.
        overrides: the run's `KEY=VALUE` overrides; each becomes hyperparameter `KEY`.
    """
    values: dict[str, HParamValue] = {
        "seed": config.seed,
        "task": config.task,
        "model.trunk": _scalar(config.model.trunk),
        "train.schedule": config.train.schedule,
        # The run's length as configured: train.steps, or train.epochs.
        **({"train.steps": config.train.steps} if config.train.epochs is None
           else {"train.epochs": config.train.epochs}),
        "train.batch_size": config.train.batch_size,
    }
    trunk = config.train.trunk
    if isinstance(trunk, str):
        values["train.trunk"] = trunk
    else:
        values["train.trunk"] = "aggregated"
        # A user method is a {class_name, config} mapping: its registered name is the value.
        values["train.trunk.aggregator"] = _method_name(trunk.aggregator)
        if trunk.loss_weighting is not None:
            values["train.trunk.loss_weighting"] = _method_name(trunk.loss_weighting)
        name, rate = _optimizer(trunk.optimizer)
        values["train.trunk.optimizer"] = name
        if rate is not None:
            values["train.trunk.optimizer.config.learning_rate"] = rate
    for head, spec in objective_configs(config).items():
        path = objective_path(config, head)
        name, rate = _optimizer(spec.optimizer)
        values[f"{path}.optimizer"] = name
        if rate is not None:
            values[f"{path}.optimizer.config.learning_rate"] = rate
        values[f"{path}.weight"] = _scalar(spec.weight)
    for assignment in overrides:
        key, _, text = assignment.partition("=")
        values[key.strip()] = _scalar(parse_yaml(text, source=f"--set {assignment!r}"))
    return {key: _seed_text(value) if key.rpartition(".")[2] == "seed" else value
            for key, value in values.items()}


def _seed_text(value: HParamValue) -> HParamValue:
    """An integer seed as its decimal string (see the module docstring)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def final_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """`final/<head>/<metric>` (and `final/mean_loss`) from a `metrics.json` tree's `eval`."""
    out: dict[str, float] = {}
    evaluation = metrics.get("eval") or {}
    losses = []
    for head, values in evaluation.items():
        if not isinstance(values, Mapping):
            continue
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"final/{head}/{name}"] = float(value)
        if isinstance(values.get("loss"), (int, float)):
            losses.append(float(values["loss"]))
    if losses:
        out["final/mean_loss"] = math.fsum(losses) / len(losses)
    return out


def write_run_hparams(run_dir: str, config: ExperimentConfig, metrics: Mapping[str, Any],
                      overrides: Sequence[str] = ()) -> None:
    """Writes the run's HParams session and final metrics into its session run,
    `<run_dir>/hparams` (see the module docstring)."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    values = run_hparams(config, overrides)
    writer = tf.summary.create_file_writer(os.path.join(run_dir, SESSION_RUN))
    try:
        with writer.as_default(step=int(metrics.get("steps") or 0)):
            hp.hparams(values, trial_id=os.path.basename(os.path.normpath(run_dir)))
            for tag, value in final_metrics(metrics).items():
                tf.summary.scalar(tag, value)
    finally:
        writer.close()


def write_experiment(sweep_dir: str, hparams: Mapping[str, Sequence[HParamValue]],
                     metric_tags: Sequence[str]) -> None:
    """The HParams experiment summary of a sweep at `sweep_dir`: the hyperparameters whose
    values differ between trials (with the values seen; all of them when none differs)
    and the `final/...` metrics, so the dashboard lists only those."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    def domain(seen: Sequence[HParamValue]) -> Any:
        kinds = {type(v) for v in seen}
        if len(kinds) == 1 and kinds <= {bool, int, float, str}:
            return hp.Discrete(sorted(set(seen)))
        return None  # mixed types: no domain

    swept = {name: seen for name, seen in hparams.items() if len(set(seen)) > 1} or hparams
    params = [hp.HParam(name, domain(list(seen))) for name, seen in sorted(swept.items())]
    metrics = [hp.Metric(tag, display_name=tag) for tag in sorted(metric_tags)]
    writer = tf.summary.create_file_writer(sweep_dir)
    try:
        with writer.as_default():
            hp.hparams_config(hparams=params, metrics=metrics)
    finally:
        writer.close()


def log_run_hparams(run_dir: str, config: ExperimentConfig, runner: Runner, metrics: Mapping[str, Any],
                    overrides: Sequence[str] = ()) -> None:
    """`write_run_hparams` for a finished `multihead train` run, when it writes TensorBoard
    events and this process is the chief (the other workers of a multi-worker run write nothing)."""
    from multihead.step.distribute import is_chief

    if config.log.tensorboard and is_chief(runner.strategy):
        write_run_hparams(run_dir, config, metrics, overrides)
