"""`multihead._records`: TFRecord headers walked and checked before TensorFlow reads a file
(a valid-CRC header declaring 2^44 bytes crashed its readers with SIGSEGV)."""

import os
import struct

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from multihead._boundary import BoundaryError
from multihead._records import (
    MAX_RECORD_BYTES,
    RecordError,
    check_records,
    crc32c,
    masked_crc32c,
    scan_records,
)


def header(length: int, crc: int | None = None) -> bytes:
    """A record header: the length, and its masked CRC32C (or `crc`, to corrupt it)."""
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc32c(raw) if crc is None else crc)


def record(data: bytes) -> bytes:
    return header(len(data)) + data + struct.pack("<I", masked_crc32c(data))


def _written_by_tensorflow(path, payloads) -> bytes:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    return path.read_bytes()


def test_crc32c_is_castagnoli_and_matches_tensorflows_records(tmp_path):
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720, B.4)
    payloads = [b"", b"a", b"hello world" * 30]
    data = _written_by_tensorflow(tmp_path / "t.tfrecord", payloads)
    assert data == b"".join(record(p) for p in payloads)  # headers and footers byte for byte
    scan = scan_records(tmp_path / "t.tfrecord")
    assert (scan.records, scan.end, scan.size, scan.problem) == (3, len(data), len(data), None)
    assert check_records(tmp_path / "t.tfrecord") == 3


@pytest.mark.parametrize("partial_tail", [False, True])
def test_a_length_beyond_the_bound_is_refused_with_the_file_and_offset(tmp_path, partial_tail):
    first = record(b"x" * 10)
    (tmp_path / "bomb").write_bytes(first + header(1 << 44) + b"\0" * 64)
    with pytest.raises(RecordError) as err:
        check_records(tmp_path / "bomb", partial_tail=partial_tail)
    assert str(err.value) == (f"{tmp_path / 'bomb'}: record 1 at byte {len(first)} declares "
                              f"{1 << 44} bytes, more than the {MAX_RECORD_BYTES}-byte bound of "
                              "one record; the file is corrupt or crafted")
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


@pytest.mark.parametrize("tail, words", [
    (record(b"y" * 20)[:-5], "declares 20 bytes but only 11 remain; the file is truncated"),
    (header(5)[:7], "the header is cut short (7 of 12 bytes)"),
    (header(5, crc=0) + b"z" * 9, "the length's CRC does not match"),
])
def test_a_torn_last_record_is_refused_in_data_and_tolerated_in_event_files(tmp_path, tail, words):
    whole = record(b"a") + record(b"bc")
    (tmp_path / "torn").write_bytes(whole + tail)
    with pytest.raises(RecordError, match=f"record 2 at byte {len(whole)}.*{words[:20]}"):
        check_records(tmp_path / "torn")
    assert check_records(tmp_path / "torn", partial_tail=True) == 2
    assert scan_records(tmp_path / "torn").end == len(whole)


def test_only_regular_files_are_scanned(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(BoundaryError, match="is a FIFO"):
        scan_records(tmp_path / "fifo")
    (tmp_path / "real").write_bytes(record(b"a"))
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(BoundaryError, match="is a symlink"):
        scan_records(tmp_path / "link")


_LENGTHS = st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1),
                     st.sampled_from([MAX_RECORD_BYTES, MAX_RECORD_BYTES + 1, 1 << 44, 2**64 - 1]))


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.tuples(_LENGTHS, st.booleans(), st.binary(max_size=80)), max_size=6),
       cut=st.integers(0, 40))
def test_fuzzed_headers_give_a_count_or_one_line(tmp_path_factory, records, cut):
    """Random declared lengths (valid or corrupt CRCs, data shorter or longer than declared),
    then a random cut of the end: the scan never raises anything but `RecordError`, never
    reports a record past the file's end or beyond the bound, and its one line names the file."""
    path = tmp_path_factory.mktemp("fuzz") / "f.tfrecord"
    data = b"".join(header(n, crc=None if good else 1) + body + struct.pack("<I", 0)
                    for n, good, body in records)
    path.write_bytes(data[:max(0, len(data) - cut)])
    scan = scan_records(path)
    assert 0 <= scan.end <= scan.size == path.stat().st_size
    try:
        count = check_records(path)
    except RecordError as err:
        assert str(err).startswith(f"{path}: record ") and "\n" not in str(err)
        assert scan.problem == str(err)
    else:
        assert count == scan.records and scan.end == scan.size
