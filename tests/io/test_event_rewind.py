"""rewind_events: drops events after a checkpoint's wall time, only in the log dir's own files."""

import os
import time

import tensorflow as tf
from tensorflow.core.util import event_pb2

from multihead.io.event_rewind import rewind_events

PAUSE_S = 0.05  # event wall times have microsecond resolution; this keeps before and after apart


def _write(run_dir, steps, tag="loss"):
    """Writes scalar `tag` at `steps` with a fresh writer (a new event file) and closes it."""
    writer = tf.summary.create_file_writer(str(run_dir))
    with writer.as_default():
        for step in steps:
            tf.summary.scalar(tag, float(step), step=step)
    writer.close()


def _checkpoint_time():
    time.sleep(PAUSE_S)
    saved_at = time.time()
    time.sleep(PAUSE_S)
    return saved_at


def _steps(run_dir):
    """Sorted steps of every summary under `run_dir` (all of its event files)."""
    found = []
    for path in tf.io.gfile.glob(os.path.join(str(run_dir), "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            if event.HasField("summary"):
                found.append(event.step)
    return sorted(found)


def _files(directory):
    return {p: p.read_bytes() for p in directory.rglob("events.out.tfevents.*") if not p.is_symlink()}


def test_drops_the_events_after_the_checkpoint_and_removes_emptied_files(tmp_path):
    _write(tmp_path / "train", range(5))
    saved_at = _checkpoint_time()
    _write(tmp_path / "train", range(5, 8))  # a second writer of the lost run: all of it after
    _write(tmp_path / "eval", [9])
    assert len(list((tmp_path / "train").iterdir())) == 2
    assert rewind_events(tmp_path, saved_at) == 3 + 1
    assert _steps(tmp_path / "train") == [0, 1, 2, 3, 4]
    assert _steps(tmp_path / "eval") == []
    assert len(list((tmp_path / "train").iterdir())) == 1 and not list((tmp_path / "eval").iterdir())
    assert rewind_events(tmp_path, saved_at) == 0  # nothing left to drop: no file is rewritten


def test_a_torn_last_record_is_cut(tmp_path):
    _write(tmp_path, range(3))
    (path,) = tmp_path.iterdir()
    whole = path.read_bytes()
    path.write_bytes(whole + whole[-30:-5])  # a crash mid-record
    assert rewind_events(tmp_path, time.time() + 60) == 0  # no event dropped, only the tail
    assert path.read_bytes() == whole


def test_never_rewrites_a_file_a_live_writer_has_open(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.scalar("loss", 1.0, step=0)
    writer.flush()
    before = _files(tmp_path)
    assert rewind_events(tmp_path, saved_at=0.0) == 0  # every event is newer, but the file is open
    assert _files(tmp_path) == before
    writer.close()
    assert rewind_events(tmp_path, saved_at=0.0) == 1  # closed (as after a crash): rewound
    assert _steps(tmp_path) == []


def test_never_follows_a_symlink_out_of_the_log_dir(tmp_path):
    outside, log_dir = tmp_path / "outside", tmp_path / "run"
    _write(outside / "elsewhere", range(2))
    _write(outside / "linked_run", range(2))
    saved_at = _checkpoint_time()
    _write(outside / "elsewhere", range(2, 4))
    _write(outside / "linked_run", range(2, 4))
    before = _files(outside)
    (log_dir / "train").mkdir(parents=True)
    for target in (outside / "elsewhere").iterdir():  # a file symlink, with the event-file name
        (log_dir / "train" / target.name).symlink_to(target)
    (log_dir / "eval").symlink_to(outside / "linked_run", target_is_directory=True)
    assert rewind_events(log_dir, saved_at) == 0
    assert _files(outside) == before
    assert all(p.is_symlink() for p in (log_dir / "train").iterdir()) and (log_dir / "eval").is_symlink()


def test_a_log_dir_given_through_a_symlink_is_rewound_in_place(tmp_path):
    real = tmp_path / "runs" / "x"
    _write(real / "train", range(2))
    saved_at = _checkpoint_time()
    _write(real / "train", range(2, 4))
    (tmp_path / "latest").symlink_to(real, target_is_directory=True)
    assert rewind_events(tmp_path / "latest", saved_at) == 2
    assert _steps(real / "train") == [0, 1]
    assert not [p for p in real.rglob(".rewind-*")]  # no temporary file left behind
