"""Rewinding a run's TensorBoard event files to the checkpoint it resumes from.

A run that crashes after a checkpoint has logged steps past it; the resumed run
logs those steps again. `rewind_events` drops, from the event files under the
log directory, every event written after the checkpoint, so both of
TensorBoard's loaders show each step once.

TensorBoard's own protocol for this, an `Event` with `session_log.status =
SessionLog.START` at the resume step, is not used, because only one of its two
loaders honours it (tensorboard 2.21.0, tensorboard-data-server 0.7.2; the
`--load_fast=false` and `--load_fast=true` servers):

* The Python loader (`EventAccumulator`, `purge_orphaned_data=True`) purges
  every tensor series at steps >= the START event's step, and only from the
  second START event of a run on (the first marks the initial session); a START
  in a file that sorts after the resumed writer's file purges the resumed
  run's own events too.
* The Rust data server (`--load_fast=true`) ignores START events. It keeps one
  point per step of a series that is rewritten from a lower step, but an
  evaluation logged after the checkpoint by the crashed run (eval at step 15,
  checkpoint at 10, next eval at 20) stays on the eval run's chart.

Rules: only regular files named `events.out.tfevents.*` are read or rewritten,
found without following a symlink (to a file or a directory), and only if
their real path is inside the log directory; the rewritten file replaces the
original atomically from a temporary file in the same directory.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator

import tensorflow as tf
from tensorflow.core.util import event_pb2

from multihead._boundary import temp_file
from multihead._records import scan_records

_PREFIX = "events.out.tfevents."
_PROC_FDS = "/proc/self/fd"


def rewind_events(log_dir: str | os.PathLike[str], saved_at: float) -> int:
    """Drops the TensorBoard events written after wall time `saved_at` under `log_dir`.

    Event files holding records newer than `saved_at`, or a torn last record,
    are rewritten without them; files left with no event but the file header
    are removed. Files holding no event newer than `saved_at` are not touched,
    nor are files a writer of this process still has open (the resumed run's
    own, or a live trainer's: rewriting them would lose its later events);
    close a trainer before rewinding its logs.

    Example:
        >>> rewind_events("runs/x/logs", saved_at=1.7e9)          # doctest: +SKIP
        42

    Args:
        log_dir: the run's log directory (its `train` and `eval` runs are below it).
        saved_at: wall time (seconds since the epoch) of the checkpoint resumed from.

    Returns:
        The number of events dropped.
    """
    dropped = 0
    in_use = _open_files()
    own = f".{socket.gethostname()}.{os.getpid()}."  # in the names of this process's event files
    for path in _event_files(log_dir):
        if in_use is not None and path in in_use:
            continue
        events = _read_events(path)
        created = events[0].wall_time if events else float("inf")
        if in_use is None and own in os.path.basename(path) and created > saved_at:
            continue  # without /proc: this process's files newer than the checkpoint are its own
        keep = [e for e in events if e.HasField("file_version") or e.wall_time <= saved_at]
        if len(keep) == len(events) and _records_end(path, len(events)):
            continue
        dropped += len(events) - len(keep)
        if all(e.HasField("file_version") for e in keep):
            os.remove(path)
        else:
            _replace(path, keep)
    return dropped


def _event_files(log_dir: str | os.PathLike[str]) -> Iterator[str]:
    """Real paths of the regular event files under `log_dir`, sorted; symlinks are skipped."""
    root = os.path.realpath(os.fspath(log_dir))
    found = []
    for directory, _, names in os.walk(root, followlinks=False):
        for name in names:
            path = os.path.join(directory, name)
            if not name.startswith(_PREFIX) or os.path.islink(path) or not os.path.isfile(path):
                continue
            real = os.path.realpath(path)
            if os.path.commonpath([root, real]) == root:
                found.append(real)
    return iter(sorted(found))


def _read_events(path: str) -> list[event_pb2.Event]:
    """Events of one file, stopping at a truncated or corrupted record (a crash's tail). Only
    the records whose headers `scan_records` found whole are given to TensorFlow: a crafted
    length (2^44 bytes) would crash its reader, and is dropped with the tail instead."""
    events = []
    try:
        for record in tf.data.TFRecordDataset(path).take(scan_records(path).records):
            events.append(event_pb2.Event.FromString(record.numpy()))
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError):
        pass
    return events


def _replace(path: str, events: list[event_pb2.Event]) -> None:
    """Rewrites `path` to hold exactly `events`, atomically, keeping its mode."""
    fd, tmp = temp_file(os.path.dirname(path), prefix=".rewind-")
    os.close(fd)
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for event in events:
                writer.write(event.SerializeToString())
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _open_files() -> set[str] | None:
    """Real paths of the files this process has open (Linux), or None if unknown."""
    if not os.path.isdir(_PROC_FDS):
        return None
    found = set()
    for fd in os.listdir(_PROC_FDS):
        try:
            found.add(os.path.realpath(os.readlink(os.path.join(_PROC_FDS, fd))))
        except OSError:
            continue
    return found


def _records_end(path: str, count: int) -> bool:
    """True if the file holds exactly `count` whole TFRecords (no torn tail).

    A TFRecord is a little-endian uint64 length, a 4-byte CRC of the length, the
    data, and a 4-byte CRC of the data (`multihead._records`).
    """
    scan = scan_records(path)
    return scan.problem is None and scan.records == count
