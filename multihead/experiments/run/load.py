"""Finished runs: rebuild a run directory's model (and Trainer) and restore a checkpoint.

A supervised run directory holds `config.yaml` (the resolved config), `inputs.json` (the
model's input, so nothing is rebuilt from `data.input_dim` or by reading the data again) and
`checkpoints/` (`final`, the periodic `ckpt-<step>`), plus `best/` with a best-checkpoint
callback.

Example:
    >>> run = mh.load_run("runs/quickstart-20260101-120000")             # doctest: +SKIP
    >>> run.model.predict(x)["y1"]                                         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import tensorflow as tf

from multihead.core.model import MultiHeadModel
from multihead.core.trainer import Trainer
from multihead.experiments.build.builders import build_model, build_objectives, build_trainer, build_trunk
from multihead.experiments.config.schema import ConfigError, ExperimentConfig, load_config
from multihead.experiments.run.supervised import INPUTS_FILE


@dataclasses.dataclass
class LoadedRun:
    """A finished run, rebuilt.

    Attributes:
        run_dir: the run directory.
        config: its resolved config.
        model: the model with the checkpoint's weights.
        checkpoint: the checkpoint path restored.
        trainer: the run's `Trainer` with optimizer state and step restored (`trainer=True`),
            else None. It writes no TensorBoard events.
    """

    run_dir: str
    config: ExperimentConfig
    model: MultiHeadModel
    checkpoint: str
    trainer: Trainer | None = None


def run_input_shape(run_dir: str, config: ExperimentConfig) -> Any:
    """The model input shape of a run: from `inputs.json`, else (runs written before it was
    recorded) from reading the run's data again."""
    path = os.path.join(run_dir, INPUTS_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            tree = json.load(fh)
        if "shape" in tree and not isinstance(tree["shape"], dict):
            return tuple(tree["shape"])
        return {name: tuple(spec["shape"]) for name, spec in tree.items()}
    from multihead.experiments.build.data_sources import build_data, input_spec

    return input_spec(build_data(config))


def run_checkpoint(run_dir: str, checkpoint: str | None = None) -> str:
    """The checkpoint prefix of a run: `final` (default; else the newest periodic one),
    `latest`, `best`, a name in `checkpoints/` such as `ckpt-1000`, or a path.

    Raises:
        ConfigError: there is no such checkpoint.
    """
    directory = os.path.join(run_dir, "checkpoints")
    from multihead.io.manager import scan_checkpoints

    found = scan_checkpoints(directory)  # the state file is a hint, not trusted
    latest = found[-1] if found else None
    final = os.path.join(directory, "final")
    if checkpoint in (None, "final"):
        if os.path.exists(final + ".index"):
            return final
        if checkpoint is None and latest is not None:
            return latest
    elif checkpoint == "latest":
        if latest is not None:
            return latest
    elif checkpoint == "best":
        best = os.path.join(run_dir, "best")
        found = tf.train.latest_checkpoint(best) if os.path.isdir(best) else None
        if found is None and os.path.isdir(best):
            found = next((os.path.join(best, f[:-len(".index")]) for f in sorted(os.listdir(best))
                          if f.endswith(".index")), None)
        if found is not None:
            return found
    else:
        for candidate in (os.path.join(directory, checkpoint), checkpoint):
            if os.path.exists(candidate + ".index"):
                return candidate
    raise ConfigError(f"checkpoint {checkpoint or 'final'!r}: not found in {run_dir!r}; use final, "
                      "latest, best, a name in checkpoints/ (ckpt-<step>) or a checkpoint path")


def load_run(run_dir: str | os.PathLike[str], checkpoint: str | None = None,
             trainer: bool = False, allow_import: Sequence[str] = ()) -> LoadedRun:
    """Rebuilds a finished supervised run's model from its `config.yaml` and restores a checkpoint.

    Args:
        run_dir: a run directory written by `multihead train`.
        checkpoint: `final` (default), `latest`, `best`, `ckpt-<step>` or a checkpoint path.
        trainer: also rebuild the run's `Trainer` (objectives, optimizers, step), restored
            from the checkpoint, e.g. to evaluate with the run's losses and metrics.
        allow_import: modules the run's config may import (a `data.function` of `kind:
            python`, an `env.id` `module:Env`); any other is refused before it is imported,
            since a run directory may come from someone else.

    Returns:
        The rebuilt run. `run.trainer.evaluate(data.eval, batch_size=config.train.batch_size)`
        gives the final evaluation of `metrics.json` exactly.

    Raises:
        ConfigError: not a run directory, not a supervised run, or no such checkpoint.
    """
    from multihead.io.checkpoints import restore_checkpoint

    run_dir = os.fspath(run_dir)
    saved = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(saved):
        raise ConfigError(f"{run_dir!r}: no config.yaml there; is it a multihead run directory?")
    config = load_config(saved, allow_import=allow_import)
    if config.task != "supervised":
        raise ConfigError(f"{run_dir!r}: task {config.task!r}; load_run rebuilds supervised runs")
    path = run_checkpoint(run_dir, checkpoint)
    model = build_model(config, run_input_shape(run_dir, config))
    built = None
    if trainer:
        built = build_trainer(config, model, build_objectives(config), run_dir=None,
                              trunk=build_trunk(config), write_config=False)
        built.build_optimizers()
    try:
        restore_checkpoint(path, model, parts=None if built else
                           ["trunk"] + [f"heads/{h}" for h in model.head_names], trainer=built)
    except ValueError as err:
        raise ConfigError(f"{path}: {str(err).splitlines()[0]}") from None
    return LoadedRun(run_dir=run_dir, config=config, model=model, checkpoint=path, trainer=built)
