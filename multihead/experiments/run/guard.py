"""What `multihead train` guarantees about a run directory: a lock, a status file, and stops
at a step boundary on SIGINT/SIGTERM.

* **Lock.** While a process trains in a run directory it holds an exclusive
  `fcntl.flock` on `RUN_DIR/.lock`. The OS releases it when the process ends, however
  it ends, so a stale lock cannot exist; a second writer gets a `RunLocked` error.
* **Status.** `RUN_DIR/status.json` says `running` while training, then `completed`,
  `failed` (with the error) or `interrupted` (with the signal), the last step done and
  the newest checkpoint. A run killed outright (SIGKILL, power loss) still says
  `running` with no process holding the lock.
* **Signals.** `RunWatch` is a `fit` callback: the first SIGINT/SIGTERM asks `fit` to
  stop after the current compiled call; the runner then writes a checkpoint and
  raises `RunInterrupted`. A second signal stops at once.

Example:
    >>> with RunLock("runs/x"), RunWatch() as watch:                  # doctest: +SKIP
    ...     runner.run("runs/x", callbacks=[watch])
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import signal
import stat
import threading
import types
from typing import Any

from multihead._boundary import BoundaryError, read_json, rewrite_in_place, temp_file
from multihead._checks import check_int, describe
from multihead.training.callbacks import Callback

LOCK_FILE = ".lock"
STATUS_FILE = "status.json"
#: The exit code of a run stopped by signal N is 128 + N, as a shell reports it.
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The most bytes of `error` a status rewritten in place (a full disk) keeps.
_STATUS_ERROR_MAX = 512


class RunLocked(Exception):
    """Another process holds the run directory's lock."""


class RunLockError(Exception):
    """The lock file cannot be taken: not a directory, unwritable, or `.lock` is not a
    regular file (a symlink, a directory)."""


class RunInterrupted(Exception):
    """A run stopped by SIGINT/SIGTERM.

    Attributes:
        signum: the signal.
        step: the last step done, or None.
        checkpoint: the checkpoint written at that step, or None.
    """

    def __init__(self, signum: int, step: int | None = None, checkpoint: str | None = None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class RunLock:
    """An exclusive `flock` on `RUN_DIR/.lock`, held until `release()` or the process ends.

    Args:
        run_dir: an existing directory.

    Raises:
        RunLocked: another process holds it (the message names its pid).
        RunLockError: the lock file cannot be opened or is not a regular file.
    """

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, LOCK_FILE)
        # O_NOFOLLOW: a symlink planted as the lock file is not followed out of the directory;
        # O_NONBLOCK: a FIFO planted there is not waited on.
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC |
                         os.O_NONBLOCK, 0o644)
        except OSError as err:
            why = "it is a symlink" if err.errno == errno.ELOOP else err.strerror
            raise RunLockError(f"{self.path}: cannot take the run directory's lock ({why}); "
                               "remove it or choose another directory") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunLockError(f"{self.path}: not a regular file; remove it or choose another "
                               "directory")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise RunLocked(f"run directory {run_dir!r} is in use by another multihead "
                                f"process (pid {holder}); wait for it or choose another directory"
                                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Releases the lock (the lock file stays: removing it would race with a new locker)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def write_status(run_dir: str, status: str, *, step: int | None = None,
                 checkpoint: str | None = None, error: str | None = None,
                 **extra: Any) -> bool:
    """Writes `RUN_DIR/status.json`; False if even the in-place rewrite failed (disk full).

    Args:
        run_dir: the run directory.
        status: `running`, `completed`, `failed` or `interrupted`.
        step: the last step done.
        checkpoint: the newest checkpoint (made relative to the run directory).
        error: one line saying what went wrong.
        extra: more fields (e.g. `signal`, `exit_code`).
    """
    tree = {"status": status, "step": step,
            "checkpoint": os.path.relpath(checkpoint, run_dir) if checkpoint else None,
            "error": error, "pid": os.getpid(),
            "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **extra}
    text = json.dumps(tree, indent=2) + "\n"
    path = os.path.join(run_dir, STATUS_FILE)
    try:
        fd, tmp = temp_file(run_dir, prefix=".status-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return True
    except OSError:
        pass
    return _rewrite_in_place(path, tree, error)


def _rewrite_in_place(path: str, tree: dict[str, Any], error: str | None) -> bool:
    """No space for a new file: overwrites the existing status file within the blocks it
    already has, with the fields that fit: no traceback, the error cut short."""
    small = {k: v for k, v in tree.items() if k != "traceback"}
    for cut in (_STATUS_ERROR_MAX, 64, 0):
        small["error"] = (error or "")[:cut] or None
        if rewrite_in_place(path, json.dumps(small)):
            return True
    return False


#: The values of `status.json`'s `status`.
STATUSES = ("running", "completed", "failed", "interrupted")


def check_status(record: dict[str, Any], where: str) -> None:
    """Raises `BoundaryError` unless `record` is a `status.json` this module writes: `status`
    one of `STATUSES`, `step` a step count or null, `checkpoint` and `error` text or null.

    Args:
        record: the file's JSON object.
        where: the file's path, for the message.
    """
    if record.get("status") not in STATUSES:
        raise BoundaryError(f"{where}: status must be one of {', '.join(STATUSES)}, got "
                            f"{describe(record.get('status'))}")
    if record.get("step") is not None:
        check_int(record["step"], f"{where}: step", minimum=0, error=BoundaryError)
    for key in ("checkpoint", "error"):
        if not isinstance(record.get(key), (str, type(None))):
            raise BoundaryError(f"{where}: {key} must be text or null, got {describe(record[key])}")


def read_status(run_dir: str) -> dict[str, Any] | None:
    """The run's `status.json`, or None if it has none (or it is unreadable)."""
    try:  # a regular file of the run only: a FIFO or a symlink there is not followed
        return read_json(run_dir, STATUS_FILE, limit=1 << 20)
    except (OSError, ValueError):
        return None


class RunWatch(Callback):
    """Records the last step done and turns SIGINT/SIGTERM into a stop at a step boundary.

    As a context manager it installs its signal handlers (main thread only) and restores
    the previous ones on exit. As a `fit` callback, the first signal asks `fit` to stop
    after the current compiled call (`trainer.stop_reason` names the signal); the runner
    checks `interrupted` after `fit`. Without a `fit` to stop (`immediate=True`, or a
    second signal), the handler raises `RunInterrupted` at once.

    Args:
        immediate: raise at the first signal (for runners that do not take callbacks).

    Attributes:
        signum: the first signal received, or None.
        step: the last step done (`on_step_end`), or None.
    """

    def __init__(self, immediate: bool = False, run_dir: str | None = None) -> None:
        self.immediate = immediate
        self.signum: int | None = None
        self.step: int | None = None
        self._previous: dict[int, Any] = {}
        self._fitting = False
        self._run_dir = run_dir
        self._checkpoints_seen: int | None = None

    @property
    def tracks_steps(self) -> bool:
        """True when `step` is reported (the watch is a `fit` callback)."""
        return not self.immediate

    @property
    def interrupted(self) -> bool:
        """True once a signal was received."""
        return self.signum is not None

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if not first or self.immediate:
            raise RunInterrupted(signum, self.step)
        if self._fitting:
            self.request_stop(f"interrupted by {signal.Signals(signum).name}")

    def __enter__(self) -> RunWatch:
        if threading.current_thread() is not threading.main_thread():
            return self  # Python delivers signals to the main thread only: nothing to install
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def on_train_begin(self) -> None:
        self._fitting = True
        if self.signum is not None:  # a signal while the run was being set up
            self.request_stop(f"interrupted by {signal.Signals(self.signum).name}")

    def on_step_end(self, step: int, result: Any) -> None:
        self.step = step
        if self._run_dir is not None:
            self._note_checkpoint(step)

    def _note_checkpoint(self, step: int) -> None:
        """With a run directory: once a new checkpoint is written (TensorFlow's state file in
        `checkpoints/` changed; one `stat` a call), `status.json` says `running` with the
        step and the newest checkpoint, so a reader mid-run sees what a resume would use."""
        directory = os.path.join(self._run_dir, "checkpoints")
        try:
            changed = os.stat(os.path.join(directory, "checkpoint")).st_mtime_ns
        except OSError:
            return
        if changed == self._checkpoints_seen:
            return
        self._checkpoints_seen = changed
        from multihead.io.manager import scan_checkpoints

        found = scan_checkpoints(directory)  # the state file is a hint, not trusted
        if found:
            write_status(self._run_dir, "running", step=step, checkpoint=found[-1])

    def on_train_end(self) -> None:
        self._fitting = False


def stop_if_interrupted(callbacks: Any, save: Any, step: int) -> None:
    """After `fit`: if a `RunWatch` among `callbacks` received a signal, writes a checkpoint
    with `save()` (skipped when the disk refuses it) and raises `RunInterrupted`.

    Args:
        callbacks: the callbacks given to the runner.
        save: writes a checkpoint of the current state and returns its path.
        step: the trainer's global step.
    """
    watch = next((c for c in callbacks if isinstance(c, RunWatch) and c.interrupted), None)
    if watch is None:
        return
    assert watch.signum is not None
    try:
        path = save()
    except OSError:
        path = None
    except Exception as err:  # noqa: BLE001 - TF reports a full disk as its own error types
        if not is_disk_full(err):
            raise
        path = None
    raise RunInterrupted(watch.signum, step, path)


def is_disk_full(err: BaseException) -> bool:
    """True for an error that reports no space left (Python's OSError or TensorFlow's)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(err) or "Disk quota exceeded" in str(err)
