"""Partial and full checkpoints on `tf.train.Checkpoint`, keyed by part, not by Keras names.

The object graph written is

    trunk                 the trunk layer
    heads/<name>          each head layer
    optimizers/<name>     each head's optimizer (slots, iterations)
    step                  the trainer's step counter

so a checkpoint restores into a freshly built model in another process (Keras
auto-names such as `dense_7` never enter the keys), and any subset of parts can
be saved or restored: a trunk-only restore into a model with other heads works.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

import tensorflow as tf

from multihead.model import MultiHeadModel

if TYPE_CHECKING:
    from multihead.trainer import Trainer


def available_parts(model: MultiHeadModel, trainer: Trainer | None = None) -> list[str]:
    """Every part name that `save_checkpoint` can write for this model (and trainer)."""
    parts = ["trunk"] + [f"heads/{h}" for h in model.head_names]
    if trainer is not None:
        parts += [f"optimizers/{h}" for h in trainer.optimizers] + ["step"]
    return parts


def _objects(model: MultiHeadModel, trainer: Trainer | None,
             parts: Sequence[str] | None) -> dict[str, Any]:
    known = available_parts(model, trainer)
    wanted = known if parts is None else list(parts)
    for part in wanted:
        if part not in known:
            extra = "" if trainer is not None or not part.startswith(("optimizers/", "step")) else (
                " (optimizer and step parts need trainer=...)"
            )
            raise ValueError(f"unknown checkpoint part {part!r}{extra}; parts are {known}")
    objects: dict[str, Any] = {}
    for part in wanted:
        kind, _, name = part.partition("/")
        if kind == "trunk":
            objects["trunk"] = model.trunk
        elif kind == "heads":
            objects.setdefault("heads", {})[name] = model.heads[name]
        elif kind == "optimizers":
            assert trainer is not None
            objects.setdefault("optimizers", {})[name] = trainer.optimizers[name]
        elif kind == "step":
            assert trainer is not None
            objects["step"] = trainer.step_variable
    return objects


def _checkpoint(objects: dict[str, Any]) -> tf.train.Checkpoint:
    kwargs = {
        key: tf.train.Checkpoint(**value) if isinstance(value, dict) else value
        for key, value in objects.items()
    }
    return tf.train.Checkpoint(**kwargs)


def save_checkpoint(path: str | os.PathLike[str], model: MultiHeadModel,
                    parts: Sequence[str] | None = None, trainer: Trainer | None = None) -> str:
    """Writes the chosen parts of `model` (and `trainer`) to `path`.

    Args:
        path: checkpoint prefix; files `path.index` and `path.data-*` are written.
        model: a built model.
        parts: part names (`"trunk"`, `"heads/<name>"`, `"optimizers/<name>"`,
            `"step"`); None saves every part available.
        trainer: the trainer whose optimizers and step counter to save.

    Returns:
        The checkpoint prefix.
    """
    ckpt = _checkpoint(_objects(model, trainer, parts))
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
    return ckpt.write(os.fspath(path))


def restore_checkpoint(path: str | os.PathLike[str], model: MultiHeadModel,
                       parts: Sequence[str] | None = None, trainer: Trainer | None = None) -> None:
    """Restores the chosen parts of a checkpoint into a built `model` (and `trainer`).

    Parts in the file that are not asked for are ignored.

    Raises:
        ValueError: a requested part is not in the checkpoint, or shapes differ.
    """
    ckpt = _checkpoint(_objects(model, trainer, parts))
    try:
        status = ckpt.read(os.fspath(path))
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        raise ValueError(
            f"cannot restore {list(parts) if parts else 'all parts'} from {os.fspath(path)!r}: "
            f"{str(err).strip().splitlines()[0]}"
        ) from None
