"""Periodic checkpoints of a training run, and an exact resume.

`CheckpointManager` keeps the last N checkpoints of a run, atomically: the
state file only ever names complete checkpoints. A resume restores every part
(step, optimizer slots, RNG seed states, target counters, data position); a
corrupted latest checkpoint falls back to the previous one with a warning, and
the TensorBoard events written after the restored checkpoint are dropped
(`multihead.io.event_rewind`) so the resumed run logs each step once.
`CheckpointManager.callback()` is how `Trainer.fit` saves on the cadence.

What a manager trusts: only the checkpoint files in its own directory. The state
file (`<directory>/checkpoint`) is a hint that anyone can edit; checkpoints are
found by scanning the directory (`scan_checkpoints`: regular files
`ckpt-<step>.index` with regular data shards, no symlinks), and the state file is
rewritten from that scan before `tf.train.CheckpointManager` reads it, so no path
it named (outside the directory, or garbage) is ever restored or deleted, and a
missing, empty or stale state file loses nothing. Before a save, a symlink at any name
the save writes (`ckpt-<step>.index`, `.data-*`, the `_temp` shard folder) is removed,
so the save never writes through one.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import tensorflow as tf

from multihead._boundary import temp_file, unlink_symlinks_at
from multihead._checks import check_int
from multihead.training.callbacks import Callback
from multihead.training.keras_model import MultiHeadModel
from multihead.io.checkpoint_file import CheckpointReadError, restore_objects
from multihead.io.event_rewind import rewind_events
from multihead.io.checkpoint_parts import (
    available_parts,
    check_ready,
    checkpoint_root,
    group,
    part_objects,
    target_map,
)

if TYPE_CHECKING:
    from multihead.training.trainer import Trainer


_CHECKPOINT_INDEX = re.compile(r"ckpt-([0-9]{1,18})\.index")
_STATE_FILE = "checkpoint"


def scan_checkpoints(directory: str | os.PathLike[str]) -> list[str]:
    """The `ckpt-<step>` checkpoint prefixes in `directory`, oldest first.

    A checkpoint counts when `ckpt-<step>.index` (not empty) and its `ckpt-<step>.data-*`
    shards are regular files directly in `directory` (a symlink is not followed: what it points at may
    be outside the directory). Whether a file is readable is for the restore to find out.

    Args:
        directory: a manager's directory (missing: no checkpoints).
    """
    try:
        entries = {e.name: e for e in os.scandir(directory)}
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in entries:
        match = _CHECKPOINT_INDEX.fullmatch(name)
        if match is not None and _complete(entries, name[: -len(".index")]):
            found.append((int(match.group(1)), os.path.join(os.fspath(directory), name[:-6])))
    return [path for _, path in sorted(found)]


def _complete(entries: Mapping[str, os.DirEntry], prefix: str) -> bool:
    index = entries.get(prefix + ".index")
    if index is None or not index.is_file(follow_symlinks=False) or \
            index.stat(follow_symlinks=False).st_size == 0:  # an index cut off by a crash
        return False
    return all(e.is_file(follow_symlinks=False) for n, e in entries.items()
               if n.startswith(prefix + ".data-"))


def own_checkpoint(prefix: str | os.PathLike[str]) -> bool:
    """True when checkpoint `prefix` is the directory's own: `prefix.index` (not empty) and
    its `prefix.data-*` shards are regular files, not symlinks (as `scan_checkpoints` counts)."""
    directory, name = os.path.split(os.fspath(prefix))
    try:
        entries = {e.name: e for e in os.scandir(directory or ".")}
    except (FileNotFoundError, NotADirectoryError):
        return False
    return _complete(entries, name)


def _reset_state_file(directory: str, found: list[str]) -> None:
    """Rewrites `directory/checkpoint` to list exactly the scanned checkpoints `found`.

    `tf.train.CheckpointManager` reads the paths to keep and to delete from this file; written
    from the scan, it names only files in `directory`, by relative name. The write replaces
    the file atomically (a symlink in its place is replaced, not followed).
    """
    state = os.path.join(directory, _STATE_FILE)
    if not found:
        if os.path.lexists(state):
            os.unlink(state)
        return
    lines = [f'model_checkpoint_path: "{os.path.basename(found[-1])}"']
    for path in found:
        stamp = os.stat(path + ".index", follow_symlinks=False).st_mtime
        lines.append(f'all_model_checkpoint_paths: "{os.path.basename(path)}"')
        lines.append(f"all_model_checkpoint_timestamps: {stamp!r}")
    # An old preservation time: every listed checkpoint is one the manager may rotate out.
    lines.append("last_preserved_timestamp: 0.0")
    fd, tmp = temp_file(directory, prefix=".checkpoint-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(tmp, state)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class _RunClock(tf.Module):
    """Wall time at which a manager's checkpoint was saved: events after it belong to a lost run."""

    def __init__(self) -> None:
        super().__init__(name="run_clock")
        self.saved_at = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="saved_at")


class CheckpointManager:
    """Periodic, atomic checkpoints of a training run, and exact resume.

    Built on `tf.train.CheckpointManager`: checkpoints are `<directory>/ckpt-<step>`,
    the last `keep` are kept, and the state file naming the latest is updated
    only after a checkpoint is completely written, so a crash during a save
    leaves the manager pointing at the previous complete checkpoint. Besides the
    parts (`multihead.io.checkpoint_parts`), each checkpoint holds `run/saved_at`, the wall
    time of the save.

    Example:
        >>> manager = mh.CheckpointManager("runs/x/checkpoints", model, trainer, every=500)
        >>> manager.restore_latest()          # None on a fresh run       # doctest: +SKIP
        >>> trainer.fit(data, steps=10_000 - trainer.global_step, checkpoints=manager)

    Args:
        directory: where checkpoints are written.
        model: the model (built).
        trainer: the trainer; with it, every part is saved (optimizers, step,
            data position, ...). Without, only the model parts.
        every: `maybe_save(step)` saves when `step % every == 0`; 0 disables
            periodic saves (`save()` still works).
        keep: how many checkpoints to keep.
        targets: name -> target network (any trackable object) saved too.
        host: name -> trackable host-side state (an RL run's replay buffer, generators,
            environments: `multihead.rl.host_state.HostState`) saved under `host/<name>`.
        counter: what numbers a checkpoint and drives the cadence (an RL run's environment
            steps); None: the trainer's step.

    Raises:
        ValueError: `every` or `keep` is not an integer in range, or the model is not built.
    """

    def __init__(self, directory: str | os.PathLike[str], model: MultiHeadModel,
                 trainer: Trainer | None = None, *, every: int = 0, keep: int = 3,
                 targets: Mapping[str, Any] | None = None,
                 host: Mapping[str, Any] | None = None,
                 counter: Callable[[], int] | None = None) -> None:
        every = check_int(every, "CheckpointManager.every", minimum=0, hint="0 disables periodic saves")
        keep = check_int(keep, "CheckpointManager.keep", minimum=1)
        check_ready(model, trainer)
        self.directory = os.fspath(directory)
        self.every = every
        self.keep = keep
        self.model = model
        self.trainer = trainer
        targets = target_map(targets)
        self._clock = _RunClock()
        self._parts = available_parts(model, trainer, targets)
        self._objects = part_objects(model, trainer, targets, self._parts)
        self._objects["run"] = self._clock
        if host:
            self._objects["host"] = group(dict(host))
        self._counter = counter
        # Non-chief workers of a multi-worker run do not write into `directory`.
        self._state = trainer.checkpoint_state() if trainer is not None else None
        self._chief = self._state.is_chief if self._state is not None else True
        if self._chief and os.path.isdir(self.directory):
            _reset_state_file(self.directory, scan_checkpoints(self.directory))
        self._manager = tf.train.CheckpointManager(
            checkpoint_root(self._objects), self.directory, max_to_keep=keep, checkpoint_name="ckpt")
        self._last_saved: int | None = None
        self._last_seen: int | None = None

    @property
    def parts(self) -> list[str]:
        """The parts every checkpoint of this manager holds."""
        return list(self._parts)

    @property
    def checkpoints(self) -> list[str]:
        """Kept checkpoint prefixes, oldest first."""
        return list(self._manager.checkpoints)

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest complete checkpoint, or None."""
        return self._manager.latest_checkpoint

    @staticmethod
    def step_of(path: str) -> int:
        """The step number in a checkpoint prefix `.../ckpt-<step>`."""
        return int(path.rsplit("-", 1)[1])

    def callback(self) -> CheckpointCallback:
        """A `fit` callback that calls `maybe_save` at the end of each compiled call.

        Its `every` is the manager's (None when 0), so `fit` ends its calls at
        the checkpoint steps and the saved state is exactly theirs.
        """
        return CheckpointCallback(self)

    def _step(self) -> int:
        if self._counter is not None:
            return int(self._counter())
        if self._state is not None:
            return self._state.global_step
        return (self._last_saved or 0) + 1  # without a trainer: numbered by save

    def maybe_save(self, step: int) -> str | None:
        """The checkpoint cadence: called after each training step with the global step.

        Saves when a multiple of `every` was reached since the previous call, so a
        caller that advances several steps at once (several steps per execution)
        still saves once per period, at the first step it sees past the multiple.

        Args:
            step: the global step (steps done).

        Returns:
            The checkpoint written, or None.
        """
        previous = self._last_seen if self._last_seen is not None else step - 1
        self._last_seen = step
        if self.every and step // self.every > previous // self.every and step != self._last_saved:
            return self.save()
        return None

    def save(self) -> str:
        """Writes a checkpoint of everything now, numbered by the trainer's step.

        Returns:
            The checkpoint prefix (`<directory>/ckpt-<step>`).
        """
        step = self._step()
        if self._state is not None:
            self._state.flush_logs()  # events up to this step are on disk before the save
        self._clock.saved_at.assign(time.time())
        path = self._write(step)
        self._last_saved = step
        return path

    def _write(self, step: int) -> str:
        if not self._chief:
            # As tf.distribute's multi-worker guide does: a non-chief worker writes to a
            # scratch directory it deletes, so that it takes part in whatever collective
            # reads saving involves, and only the chief's checkpoint remains.
            scratch = tempfile.mkdtemp(prefix="multihead-worker-ckpt-")
            try:
                checkpoint_root(self._objects).write(os.path.join(scratch, f"ckpt-{step}"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return os.path.join(self.directory, f"ckpt-{step}")
        # TensorFlow merges the index in place: a symlink planted at a name it writes
        # would be written through, so none is left at them.
        unlink_symlinks_at(os.path.join(self.directory, f"ckpt-{step}"))
        return self._manager.save(checkpoint_number=step)

    def restore_latest(self, rewind_logs: bool = True) -> int | None:
        """Restores the newest readable checkpoint.

        A missing, truncated or corrupted checkpoint is skipped with a warning
        and the previous one is tried.

        Args:
            rewind_logs: drop the TensorBoard events the trainer's log directory
                received after the restored checkpoint was saved (by the run that
                crashed), so that the resumed run logs each step once.

        Returns:
            The step of the restored checkpoint, or None if there is none.

        Raises:
            CheckpointMismatchError: the checkpoint does not fit the model.
            CheckpointReadError: checkpoints exist but none is readable.
        """
        candidates = list(reversed(self._manager.checkpoints))
        if not candidates:
            return None
        for i, path in enumerate(candidates):
            try:
                restore_objects(path, self._objects)
            except CheckpointReadError as err:
                fallback = candidates[i + 1] if i + 1 < len(candidates) else None
                warnings.warn(
                    f"{err}; falling back to {fallback!r}" if fallback else f"{err}; no older checkpoint",
                    RuntimeWarning, stacklevel=2,
                )
                continue
            if self._state is not None:
                self._state.mark_restored()
                if rewind_logs and self._state.log_dir is not None:
                    rewind_events(self._state.log_dir, float(self._clock.saved_at.numpy()))
            step = self.step_of(path)
            self._last_saved = self._last_seen = step
            return step
        raise CheckpointReadError(
            f"no readable checkpoint in {self.directory!r} (tried {', '.join(candidates)})"
        )


class CheckpointCallback(Callback):
    """Saves through a `CheckpointManager` on its cadence, at the end of `fit`'s compiled calls.

    Args:
        manager: the manager whose `maybe_save` runs after each call.
    """

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self.every = manager.every or None

    def on_call_end(self, step: int) -> None:
        """Saves if a multiple of the manager's `every` was reached by `step`."""
        self.manager.maybe_save(step)
