"""Saving and restoring chosen parts of a model, trainer and target networks.

`save_checkpoint` and `restore_checkpoint` write and read any subset of the
parts (`multihead.io.checkpoint_parts`: `trunk`, `heads/<name>`, `rng`, `optimizers/<name>`,
`trunk_update`, `step`, `data`, `targets/<name>`) with `tf.train.Checkpoint`.
Before anything is assigned, every requested part is compared with the file
(`multihead.io.checkpoint_file`); a mismatch is one `CheckpointMismatchError`
that lists every mismatched part.

`CheckpointManager` (`multihead.io.manager`), which runs these periodically
over a training run and resumes it, is importable from here too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from multihead._boundary import unlink_symlinks_at
from multihead.training.keras_model import MultiHeadModel
from multihead.io.checkpoint_file import (
    CheckpointMismatchError,
    CheckpointReadError,
    FileGraph,
    restore_objects,
)
from multihead.io.manager import CheckpointManager
from multihead.io.checkpoint_parts import (
    available_parts,
    check_ready,
    checkpoint_root,
    expand_parts,
    part_objects,
    target_map,
)

if TYPE_CHECKING:
    from multihead.training.trainer import Trainer

__all__ = [
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointReadError",
    "available_parts",
    "checkpoint_parts",
    "restore_checkpoint",
    "save_checkpoint",
]


def checkpoint_parts(path: str | os.PathLike[str]) -> list[str]:
    """The part names stored in a checkpoint written by multihead (`trunk`, `heads/y1`, ...).

    Args:
        path: the checkpoint prefix.

    Returns:
        Part names, in the order of the object graph.

    Raises:
        CheckpointReadError: the file is missing or unreadable.
    """
    return FileGraph(os.fspath(path)).parts()


def save_checkpoint(path: str | os.PathLike[str], model: MultiHeadModel,
                    parts: Sequence[str] | None = None, trainer: Trainer | None = None,
                    targets: Mapping[str, Any] | None = None) -> str:
    """Writes the chosen parts of `model` (and `trainer`, `targets`) to `path`.

    Example:
        >>> mh.save_checkpoint("ckpt/trunk", model, parts=["trunk"])           # doctest: +SKIP
        >>> mh.save_checkpoint("ckpt/all", model, trainer=trainer)             # doctest: +SKIP

    Args:
        path: checkpoint prefix; files `path.index` and `path.data-*` are written.
        model: a built model.
        parts: part names (`"trunk"`, `"heads/<name>"`, `"rng"`,
            `"optimizers/<name>"`, `"trunk_update"`, `"step"`, `"data"`,
            `"targets/<name>"`) or groups (`"heads"`, `"optimizers"`,
            `"targets"`); None saves every part available. An optimizer part
            also holds the variables it was built on.
        trainer: the trainer whose optimizers, step counter and data position to save.
        targets: name -> target network (any trackable object) to save.

    Returns:
        The checkpoint prefix.
    """
    check_ready(model, trainer)
    targets = target_map(targets)
    wanted = expand_parts(parts, available_parts(model, trainer, targets), trainer)
    ckpt = checkpoint_root(part_objects(model, trainer, targets, wanted))
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
    unlink_symlinks_at(path)  # the writer would follow a symlink at `path.index` out
    return ckpt.write(os.fspath(path))


def restore_checkpoint(path: str | os.PathLike[str], model: MultiHeadModel,
                       parts: Sequence[str] | None = None, trainer: Trainer | None = None,
                       targets: Mapping[str, Any] | None = None) -> list[str]:
    """Restores the chosen parts of a checkpoint into a built `model` (and `trainer`, `targets`).

    Every requested part is compared with the file before anything is assigned;
    parts in the file that are not asked for are ignored. Restoring the `data`
    part makes the trainer's next `fit` continue from the saved data position.

    Example:
        >>> fresh = build_model_with_other_heads()                            # doctest: +SKIP
        >>> mh.restore_checkpoint("ckpt/all", fresh, parts=["trunk"])          # doctest: +SKIP

    Args:
        path: the checkpoint prefix (as returned by `save_checkpoint`).
        model: a built model.
        parts: as for `save_checkpoint`; None restores every part available for
            the given model, trainer and targets.
        trainer: trainer whose optimizers, step and data position to restore.
        targets: name -> target network to restore.

    Returns:
        The parts restored.

    Raises:
        CheckpointMismatchError: requested parts missing from the file or with
            other variables, shapes or dtypes (all listed in one message);
            nothing is assigned.
        CheckpointReadError: the file is missing, truncated or corrupted.
    """
    check_ready(model, trainer)
    targets = target_map(targets)
    wanted = expand_parts(parts, available_parts(model, trainer, targets), trainer)
    restore_objects(os.fspath(path), part_objects(model, trainer, targets, wanted))
    if "data" in wanted:
        trainer.checkpoint_state().mark_restored()
    return wanted
