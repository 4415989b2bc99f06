"""Finished runs: rebuild a run directory's model (and Trainer) and restore a checkpoint.

A supervised run directory holds `config.yaml` (the resolved config), `inputs.json` (the
model's input, so nothing is rebuilt from `data.input_dim` or by reading the data again) and
`checkpoints/` (`final`, the periodic `ckpt-<step>`), plus `best/` with a best-checkpoint
callback. A run directory is data, not code: its files are read inside it only
(`multihead._boundary`), its data source is never built, and `run_checkpoint` is the one
rule that picks the checkpoint `load_run`, `predict` and `export` restore.

Example:
    >>> run = mh.load_run("runs/quickstart-20260101-120000")             # doctest: +SKIP
    >>> run.model.predict(x)["y1"]                                         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence


from multihead._boundary import BoundaryError, inside, read_text
from multihead.training.keras_model import MultiHeadModel
from multihead.training.trainer import Trainer
from multihead.experiments.build.builders import build_model, build_objectives, build_trainer, build_trunk
from multihead.experiments.config.schema import (
    ConfigError,
    ExperimentConfig,
    from_dict,
    objective_configs,
    parse_yaml,
)
from multihead.experiments.run.inputs_record import (
    INPUTS_FILE,
    run_input_shape,
    run_standardization,
)
from multihead.experiments.config.yaml12 import MAX_BYTES


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


def build_run_model(config: ExperimentConfig, run_dir: str) -> MultiHeadModel:
    """A supervised run's model, unrestored, from its config and `inputs.json` (input shape and,
    with `data.normalize`, the training split's statistics).

    Raises:
        ConfigError: the run records no statistics while its config normalizes.
    """
    standardization = run_standardization(run_dir)
    if config.data.normalize and standardization is None:
        raise ConfigError(f"{os.path.join(run_dir, INPUTS_FILE)}: holds no normalize statistics, "
                          "but the run's config has data.normalize; copy inputs.json from the "
                          "run that wrote the checkpoints")
    return build_model(config, run_input_shape(run_dir), standardization)


def read_run_config(run_dir: str, allow_import: Sequence[str] = ()) -> ExperimentConfig:
    """The run's resolved `config.yaml`, read as a regular file inside the run directory
    (bounded, YAML 1.2, validated).

    Raises:
        ConfigError: no config.yaml, a symlink or FIFO in its place, or an invalid config.
    """
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.lexists(path):
        raise ConfigError(f"{run_dir!r}: no config.yaml there; is it a multihead run directory?")
    try:
        text = read_text(run_dir, "config.yaml", limit=MAX_BYTES)
    except BoundaryError as err:
        raise ConfigError(str(err)) from None
    raw = parse_yaml(text, path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping at the top level")
    return from_dict(raw, path, allow_import)


def run_checkpoint(run_dir: str, checkpoint: str | None = None) -> str:
    """The checkpoint prefix of a run, by the one rule `predict`, `export` and `load_run`
    share: `final` (default; else the newest periodic one), `latest`, `best`, `best/<head>`
    (the whole model at that head's best evaluation, `callbacks.best_checkpoint.per_head`),
    a name in `checkpoints/` such as `ckpt-1000`, or a path. Every name the tool prints is
    accepted back as it is printed, relative to the run directory: `checkpoints/final`,
    `checkpoints/ckpt-1000`, `best/best-200`, `best/<head>/best-200`.

    `final` holds the weights the run ended with: with `early_stopping.restore_best`, the
    best evaluation's, which the last periodic checkpoint (the stop step) does not.
    Only the run's own files count: a checkpoint whose files are symlinks, a symlinked
    `checkpoints/` or `best/`, and a `best.json` naming anything but a `best-<step>` there
    are refused; `best/checkpoint` (TensorFlow's state file) is not read.

    Raises:
        ConfigError: there is no such checkpoint, or the run's files leave the run directory.
    """
    from multihead.io.manager import own_checkpoint, scan_checkpoints

    if checkpoint is not None and re.fullmatch(r"checkpoints/[^/]+", checkpoint):
        checkpoint = checkpoint.split("/", 1)[1]  # as status.json, predict and export print it
    try:
        directory = inside(run_dir, "checkpoints")
        if checkpoint in (None, "final", "latest"):
            found = scan_checkpoints(directory)  # the state file is a hint, not trusted
            final = os.path.join(directory, "final")
            if checkpoint != "latest":
                _refuse_links(final)  # not silently replaced by an older checkpoint either
                if own_checkpoint(final):
                    return final
            if checkpoint != "final" and found:
                return found[-1]
        elif re.fullmatch(r"best/([^/]+/)?best-[0-9]{1,18}", checkpoint):
            named = inside(run_dir, checkpoint)  # one best checkpoint, as metrics.json names it
            _refuse_links(named)
            if own_checkpoint(named):
                return named
        elif checkpoint == "best" or checkpoint.startswith("best/"):
            found_best = _best_in(inside(run_dir, checkpoint))
            if found_best is not None:
                return found_best
        else:
            plain = "/" not in checkpoint and os.sep not in checkpoint and checkpoint not in ("..", ".")
            named = os.path.join(directory, checkpoint)
            if plain and os.path.lexists(named + ".index"):
                _refuse_links(named)
                if own_checkpoint(named):
                    return named
            elif not plain and os.path.exists(checkpoint + ".index"):
                return checkpoint  # a path the user typed: theirs to choose
    except BoundaryError as err:
        raise ConfigError(str(err)) from None
    raise ConfigError(f"checkpoint {checkpoint or 'final'!r}: not found in {run_dir!r}; use final, "
                      "latest, best, best/<head>, a name in checkpoints/ (ckpt-<step>) or a "
                      "checkpoint path")


def best_checkpoint_name(config: ExperimentConfig, head: str) -> str:
    """`best/<head>`, the `run_checkpoint` name of a head's best checkpoint, for a head of
    the run (else one line naming the heads)."""
    heads = list(objective_configs(config))
    if head not in heads:
        raise ConfigError(f"best: the run has no head {head!r}; its heads are {heads}")
    return f"best/{head}"


def _best_in(best: str) -> str | None:
    """The checkpoint a best-checkpoint directory holds (`best/`, or `best/<head>/` of a
    per-head best): the one its `best.json` names, else its newest `best-<step>`."""
    from multihead.io.best_checkpoint import BestCheckpoint
    from multihead.io.manager import own_checkpoint

    record = BestCheckpoint.read(best) if os.path.isdir(best) else None
    if record is not None:
        _refuse_links(record["path"])
        return record["path"] if own_checkpoint(record["path"]) else None
    if not os.path.isdir(best):
        return None
    names = sorted((e.name[:-len(".index")] for e in os.scandir(best)
                    if re.fullmatch(r"best-[0-9]{1,18}\.index", e.name)),
                   key=lambda n: int(n.split("-")[1]))
    for name in reversed(names):
        if own_checkpoint(os.path.join(best, name)):
            return os.path.join(best, name)
    return None


def _refuse_links(prefix: str | None) -> None:
    """A checkpoint whose files are symlinks is refused by name (rather than "not found")."""
    if prefix is None:
        return
    directory, name = os.path.split(prefix)
    try:
        links = sorted(e.name for e in os.scandir(directory) if e.is_symlink()
                       and (e.name == name + ".index" or e.name.startswith(name + ".data-")))
    except (FileNotFoundError, NotADirectoryError):
        return
    if links:
        raise BoundaryError(f"{os.path.join(directory, links[0])}: is a symlink; a run's "
                            "checkpoints must be inside it (copy the target in its place)")


def load_run(run_dir: str | os.PathLike[str], checkpoint: str | None = None,
             trainer: bool = False, allow_import: Sequence[str] = (),
             best: str | None = None) -> LoadedRun:
    """Rebuilds a finished supervised run's model from its `config.yaml` and restores a checkpoint.

    Args:
        run_dir: a run directory written by `multihead train`.
        checkpoint: `final` (default), `latest`, `best`, `ckpt-<step>` or a checkpoint path.
        trainer: also rebuild the run's `Trainer` (objectives, optimizers, step), restored
            from the checkpoint, e.g. to evaluate with the run's losses and metrics.
        allow_import: modules the run's config may import (a `data.function` of `kind:
            python`, an `env.id` `module:Env`); any other is refused before it is imported,
            since a run directory may come from someone else.
        best: a head name: restore the whole model at that head's best evaluation
            (`RUN_DIR/best/<head>/`, written by `callbacks.best_checkpoint.per_head`);
            instead of `checkpoint`.

    Returns:
        The rebuilt run. `run.trainer.evaluate(data.eval, batch_size=config.train.batch_size)`
        gives the final evaluation of `metrics.json` exactly.

    Raises:
        ConfigError: not a run directory, not a supervised run, or no such checkpoint.
    """
    from multihead.io.checkpoints import restore_checkpoint

    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ConfigError(f"{run_dir!r}: not a directory; is it a multihead run directory?")
    config = read_run_config(run_dir, allow_import)
    if config.task != "supervised":
        raise ConfigError(f"{run_dir!r}: task {config.task!r}; load_run rebuilds supervised runs")
    if best is not None:
        if checkpoint is not None:
            raise ConfigError(f"load_run: give checkpoint ({checkpoint!r}) or best ({best!r}), "
                              "not both")
        checkpoint = best_checkpoint_name(config, best)
    path = run_checkpoint(run_dir, checkpoint)
    model = build_run_model(config, run_dir)
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
