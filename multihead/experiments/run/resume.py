"""What `--resume RUN_DIR` checks before it writes anything: the config matches the run's,
the run's folders and checkpoint files are its own, its records are sound
(`multihead.experiments.run.records`), and a checkpoint to resume from exists.

Every refusal is a `RunInputError` (one line, exit 2 in the CLI); nothing here writes.

Example:
    >>> plan = check_resume("runs/x", config, runner, source="exp.yaml")   # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from multihead.experiments.config.schema import ExperimentConfig, to_dict
from multihead.experiments.run.records import RecordError, check_records


class RunInputError(ValueError):
    """Bad input to a run: a run directory in use, not a run's, or not resumable as asked.

    Like a `ConfigError`, it is raised before anything is written; the CLI prints it on
    one line and exits 2.
    """


#: Config keys that may change when a run is resumed (the rest must equal the run's config).
RESUMABLE_CHANGES = ("train.steps", "train.epochs", "checkpoint.every", "checkpoint.keep",
                     "distribute.strategy", "distribute.devices")

#: The folders of a run directory, each the run's own (never a symlink).
RUN_FOLDERS = ("checkpoints", "train", "eval", "best", "hparams")


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def check_resume(run_dir: str, config: ExperimentConfig, runner: Any, source: str) -> str:
    """The latest checkpoint of `run_dir`, after checking the run may be resumed with `config`.

    Args:
        run_dir: the run directory to continue in place.
        config: the experiment as given now (its resumable keys may differ from the run's).
        runner: the prepared task runner (`runner.resumable` says whether it resumes).
        source: how messages name the config (its path).

    Raises:
        RunInputError: the directory is not a run, its config differs, its folders or
            checkpoint files are not its own, or it has no checkpoint to resume from.
    """
    from multihead._boundary import BoundaryError, read_text
    from multihead.experiments.config.schema import parse_yaml
    from multihead.experiments.config.yaml12 import MAX_BYTES
    from multihead.io.checkpoints import CheckpointManager

    saved = os.path.join(run_dir, "config.yaml")
    if not os.path.isdir(run_dir) or not os.path.lexists(saved):
        raise RunInputError(f"--resume {run_dir!r}: no config.yaml there; is it a multihead run "
                            "directory?")
    try:
        before = _flat(parse_yaml(read_text(run_dir, "config.yaml", limit=MAX_BYTES), saved) or {})
    except BoundaryError as err:
        raise RunInputError(f"--resume: {err}") from None
    now = _flat(to_dict(config))
    from multihead.experiments.results.labels import schema_default

    for key in sorted(set(before) | set(now)):
        if key not in before and now.get(key) == schema_default(key):
            continue  # a key newer than the run, at its default: the run's behaviour
        if key not in RESUMABLE_CHANGES and before.get(key) != now.get(key):
            raise RunInputError(
                f"--resume: {source} differs from {saved} at {key} ({before.get(key)!r} -> "
                f"{now.get(key)!r}); only {', '.join(RESUMABLE_CHANGES)} may change on resume"
            )
    if not runner.resumable:
        raise RunInputError(f"--resume: task {config.task!r} does not support resuming yet")
    for name in RUN_FOLDERS:  # a run's folders are its own
        if os.path.islink(os.path.join(run_dir, name)):
            raise RunInputError(f"--resume {run_dir!r}: {name} is a symlink; a run directory's "
                                "folders must be inside it (copy the target in its place)")
    _check_own_files(run_dir)
    try:
        check_records(run_dir, list(config.model.heads))  # what the resume would adopt
    except RecordError as err:
        raise RunInputError(f"--resume: {err}") from None
    latest = latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    if latest is None:
        raise RunInputError(f"--resume {run_dir!r}: no checkpoint in {run_dir}/checkpoints to "
                            "resume from")
    # With train.epochs the runner checks the length, once it knows the data's.
    if config.train.steps is not None and CheckpointManager.step_of(latest) > config.train.steps:
        raise RunInputError(
            f"--resume: train.steps is {config.train.steps} but the latest checkpoint is at step "
            f"{CheckpointManager.step_of(latest)}; set --set train.steps=N with N >= that"
        )
    return latest


def _check_own_files(run_dir: str) -> None:
    """No symlink among the checkpoint files (a save would write through it)."""
    for name in ("checkpoints", "best"):
        folder = os.path.join(run_dir, name)
        if not os.path.isdir(folder):
            continue
        links = sorted(e.name for e in os.scandir(folder) if e.is_symlink())
        if links:
            raise RunInputError(f"--resume {run_dir!r}: {name}/{links[0]} is a symlink; a run's "
                                "checkpoints must be inside it (remove it or copy the target in "
                                "its place)")


def latest_checkpoint(directory: str) -> str | None:
    """The newest periodic checkpoint in `directory` (found by scanning it: the state file
    is not trusted), or None."""
    from multihead.io.manager import scan_checkpoints

    found = scan_checkpoints(directory)
    return found[-1] if found else None
