"""TFRecord files read as untrusted data: every record header is checked before TensorFlow
reads the file.

A TFRecord is an 8-byte little-endian length, a 4-byte masked CRC32C of those 8 bytes, the
data, and a 4-byte masked CRC32C of the data. TensorFlow's readers check the length's CRC,
then allocate the declared length before reading it: a header that claims 2^44 bytes with a
valid CRC kills the process (SIGSEGV) instead of raising. `scan_records` walks the headers
alone (12 bytes a record, the data skipped) and finds the first record whose length is more
than `MAX_RECORD_BYTES` or more than what is left of the file; `check_records` turns that
into one line naming the file and the record's byte offset (`RecordError`, a
`BoundaryError`, hence a `ValueError`).

Event files of a live or crashed writer may end in a torn record (`partial_tail=True`):
one cut short by the end of the file, or a corrupt length CRC (where TensorFlow's readers
stop by themselves), is tolerated there; a length beyond the bound never is. Data files
are strict: any bad header is refused.

No TensorFlow here (`multihead report --help` and `compare` stay fast).

Example:
    >>> check_records("data/train.tfrecord")     # doctest: +SKIP
    1000
"""

from __future__ import annotations

import dataclasses
import os
import struct

from multihead._boundary import BoundaryError, open_regular

#: The largest record read (bytes): far above any event or `tf.train.Example`, far below
#: what an allocation survives.
MAX_RECORD_BYTES = 1 << 28
_HEADER = 12  # length (8) + its masked CRC (4)
_FOOTER = 4  # the data's masked CRC


class RecordError(BoundaryError):
    """A TFRecord file whose record headers TensorFlow must not be given."""


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`, as TensorFlow's `crc32c::Value`."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC TFRecord headers carry (`crc32c::Mask`: rotate right 15, add a constant)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class RecordScan:
    """What the headers of a TFRecord file say.

    Attributes:
        records: whole records before the first bad header (all of them if none is bad).
        end: the byte offset where those records end.
        size: the file's size in bytes.
        problem: the first bad header, one line naming the file and offset (None: none).
        torn: the problem is a record cut short by the end of the file or a corrupt length
            CRC, where TensorFlow's readers stop by themselves; False for a length beyond
            `limit`, which they must never read.
    """

    records: int
    end: int
    size: int
    problem: str | None = None
    torn: bool = False


def scan_records(path: str | os.PathLike[str], *, limit: int = MAX_RECORD_BYTES) -> RecordScan:
    """Walks the record headers of the regular file `path` (`_boundary.open_regular`: no
    symlink, no FIFO) without reading the data.

    Raises:
        BoundaryError: `path` is not a regular file or cannot be read.
    """
    path = os.fspath(path)
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        offset = records = 0
        while offset < size:
            at = f"{path}: record {records} at byte {offset}"
            header = os.pread(fd, _HEADER, offset)
            if len(header) < _HEADER:
                return RecordScan(records, offset, size, f"{at}: the header is cut short "
                                  f"({len(header)} of {_HEADER} bytes); the file is truncated", True)
            (length,) = struct.unpack("<Q", header[:8])
            (crc,) = struct.unpack("<I", header[8:])
            if masked_crc32c(header[:8]) != crc:
                return RecordScan(records, offset, size, f"{at}: the length's CRC does not match; "
                                  "not a TFRecord file, or a corrupt one", True)
            if length > limit:
                return RecordScan(records, offset, size, f"{at} declares {length} bytes, more than "
                                  f"the {limit}-byte bound of one record; the file is corrupt or "
                                  "crafted")
            if offset + _HEADER + length + _FOOTER > size:
                return RecordScan(records, offset, size, f"{at} declares {length} bytes but only "
                                  f"{max(0, size - offset - _HEADER)} remain; the file is truncated",
                                  True)
            offset += _HEADER + length + _FOOTER
            records += 1
    except OSError as err:
        raise BoundaryError(f"{path}: cannot read ({err.strerror})") from None
    finally:
        os.close(fd)
    return RecordScan(records, offset, size)


def check_records(path: str | os.PathLike[str], *, partial_tail: bool = False,
                  limit: int = MAX_RECORD_BYTES) -> int:
    """The number of whole records of the TFRecord file `path`, after checking every header
    TensorFlow would read (see the module docstring).

    Args:
        path: the file (a regular file).
        partial_tail: tolerate a torn last record (an event file a writer is appending to,
            or a crashed one); a length beyond `limit` is refused all the same.
        limit: the largest record allowed, in bytes.

    Raises:
        RecordError: a bad header, one line naming the file and the record's byte offset.
        BoundaryError: `path` is not a regular file or cannot be read.
    """
    scan = scan_records(path, limit=limit)
    if scan.problem is not None and not (partial_tail and scan.torn):
        raise RecordError(scan.problem)
    return scan.records


def read_records(path: str | os.PathLike[str], *, partial_tail: bool = False,
                 limit: int = MAX_RECORD_BYTES) -> list[bytes]:
    """The data of every whole record of the TFRecord file `path`, read in Python after
    `check_records` (so no TensorFlow is imported and no header is trusted). The data's own
    CRC is not recomputed: a corrupt record fails where it is parsed.

    Raises:
        RecordError, BoundaryError: as `check_records`.
    """
    count = check_records(path, partial_tail=partial_tail, limit=limit)
    out = []
    fd = open_regular(os.fspath(path))
    try:
        offset = 0
        for _ in range(count):
            (length,) = struct.unpack("<Q", os.pread(fd, 8, offset))
            out.append(os.pread(fd, length, offset + _HEADER))
            offset += _HEADER + length + _FOOTER
    except OSError as err:
        raise BoundaryError(f"{os.fspath(path)}: cannot read ({err.strerror})") from None
    finally:
        os.close(fd)
    return out
