"""TFRecord files whose headers TensorFlow must not be given (issue 35, item 2): a record
header declaring 2^44 bytes, with a valid masked CRC32C of the length, killed `report` (an
event file under `train/`) and `validate`/`train` (a `data.kind: tfrecord` file) with SIGSEGV.
Each command runs as a subprocess with a timeout: exit 2, one line naming the file and the
record's offset, no signal, no traceback, no hang. A seeded fuzz of headers (random lengths,
corrupt CRCs, truncations) through the event and data readers: no signal, no traceback.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import yaml

from multihead._records import masked_crc32c

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240  # a TensorFlow import on a busy 2-core machine; a hang is far beyond
BOMB = 1 << 44
_TF_LOG = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages before absl)")


def _header(length: int, good_crc: bool = True) -> bytes:
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc32c(raw) if good_crc else masked_crc32c(raw) ^ 1)


def _run(args: list[str], cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args)} hung (> {TIMEOUT} s)")


def _refused(out: subprocess.CompletedProcess, *needles: str) -> str:
    lines = [line for line in out.stderr.strip().splitlines() if not _TF_LOG.match(line)]
    assert out.returncode >= 0, f"killed by signal {-out.returncode}: {out.stderr}"
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, \
        (out.returncode, out.stderr)
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _event_file(directory) -> str:
    """A real event file (a few scalars), as a run's `train/` holds."""
    writer = tf.summary.create_file_writer(str(directory))
    with writer.as_default():
        for step in range(3):
            tf.summary.scalar("loss/y1", 1.0 / (step + 1), step=step)
    writer.close()
    (path,) = [os.path.join(directory, n) for n in os.listdir(directory)]
    return path


def test_report_refuses_an_event_file_declaring_2_44_bytes(tmp_path):
    path = _event_file(tmp_path / "run" / "train")
    offset = os.path.getsize(path)
    with open(path, "ab") as fh:
        fh.write(_header(BOMB) + b"\0" * 32)
    line = _refused(_run(["-m", "multihead", "report", str(tmp_path / "run")]),
                    os.path.basename(path), f"at byte {offset} declares {BOMB} bytes")
    assert line.startswith("multihead: error: ")


def test_report_still_reads_an_event_file_with_a_torn_tail(tmp_path):
    """A crashed writer's last record, cut short: the report reads the whole ones before it."""
    path = _event_file(tmp_path / "run" / "train")
    with open(path, "ab") as fh:
        fh.write(_header(100) + b"\0" * 10)
    out = _run(["-m", "multihead", "report", str(tmp_path / "run"), "--json"])
    assert out.returncode == 0, out.stderr


def _tfrecord_config(tmp_path, data_path) -> str:
    raw = {"data": {"kind": "tfrecord", "train": str(data_path), "shapes": {"x": [2], "y1": [1]}},
           "model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"y1": {}}},
           "train": {"steps": 2, "batch_size": 4}, "log": {"tensorboard": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    return str(tmp_path / "c.yaml")


def _examples(path, n: int = 8) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(n):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, -i])),
                "y1": tf.train.Feature(float_list=tf.train.FloatList(value=[2.0 * i]))})
            ).SerializeToString())


@pytest.mark.parametrize("command", ["validate", "train"])
@pytest.mark.parametrize("first", [True, False])
def test_validate_and_train_refuse_a_data_file_declaring_2_44_bytes(tmp_path, command, first):
    data = tmp_path / "d.tfrecord"
    if first:  # the bomb is the first record (what the feature-name probe reads)
        data.write_bytes(_header(BOMB) + b"\0" * 32)
        offset = 0
    else:
        _examples(data)
        offset = os.path.getsize(data)
        with open(data, "ab") as fh:
            fh.write(_header(BOMB) + b"\0" * 32)
    config = _tfrecord_config(tmp_path, data)
    extra = ["--run-dir", str(tmp_path / "run"), "--quiet"] if command == "train" else ["--build"]
    _refused(_run(["-m", "multihead", command, config, *extra]),
             "data.train", str(data), f"at byte {offset} declares {BOMB} bytes")
    assert not (tmp_path / "run").exists()


_FUZZ_READER = r"""
import sys, traceback
from multihead.experiments.build.file_readers import read_tfrecord, tfrecord_features
from multihead.experiments.config.errors import ConfigError
from multihead.io.event_rewind import _read_events
from multihead.monitoring.report import ReportError, read_scalars

for directory in sys.argv[1:]:
    try:
        read_scalars(directory)
    except ReportError as err:
        assert "\n" not in str(err), str(err)
    _read_events(directory + "/events.out.tfevents.1.fuzz")
    data = directory + "/events.out.tfevents.1.fuzz"
    tfrecord_features(data)
    try:
        read_tfrecord(data, "data.train", ["x"], {}, {"x": [1]})
    except ConfigError as err:
        assert "\n" not in str(err), str(err)
print("survived", len(sys.argv) - 1)
"""


def test_fuzzed_headers_never_crash_a_reader(tmp_path):
    """40 files: whole records, then random headers (lengths small, at the bound, 2^44 or
    2^64-1; CRCs good or corrupt; data short or long), cut at a random byte; each read by
    report's reader, the event rewinder's and the data readers in one subprocess."""
    rng = np.random.default_rng(35)
    directories = []
    for i in range(40):
        directory = tmp_path / f"f{i:02d}"
        directory.mkdir()
        path = directory / "events.out.tfevents.1.fuzz"
        _examples(path, n=int(rng.integers(0, 3)))
        blob = bytearray(path.read_bytes())
        for _ in range(int(rng.integers(1, 4))):
            lengths = [int(rng.integers(0, 64)), 1 << 28, (1 << 28) + 1, BOMB, 2**64 - 1]
            length = lengths[int(rng.integers(len(lengths)))]
            blob += _header(length, good_crc=bool(rng.random() < 0.8))
            blob += rng.bytes(int(rng.integers(0, 80)))
        cut = int(rng.integers(0, 20))
        path.write_bytes(bytes(blob[:len(blob) - cut] if cut < len(blob) else blob))
        directories.append(str(directory))
    out = _run(["-c", _FUZZ_READER, *directories])
    assert out.returncode == 0 and "Traceback" not in out.stderr, (out.returncode, out.stderr[-3000:])
    assert out.stdout.strip() == "survived 40"
