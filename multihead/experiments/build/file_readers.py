"""Reading one data file into named numpy arrays: `.npz`, CSV, TFRecord and prepared
tensorflow_datasets splits. Each reader checks the file before it trusts it (sizes against
memory, headers, encodings, numeric values) and names the file and the config key in its
errors; `multihead.experiments.build.data_sources` assembles the arrays into data."""

from __future__ import annotations

import csv
import math
import os
import re
import zipfile
import zlib
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from multihead._boundary import BoundaryError
from multihead._records import check_records, scan_records
from multihead.experiments.config.data_section import DataConfig
from multihead.experiments.config.errors import ConfigError
from multihead.experiments.config.sizes import memory_bytes

_CSV_BATCH = 4096
#: Elements parsed per tfrecord batch at most (the batch shrinks for large examples).
_TFRECORD_BATCH_ELEMENTS = 1 << 24
_INT32 = np.iinfo(np.int32)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_file(path: str, where: str) -> None:
    if os.path.isdir(path):
        raise ConfigError(f"{where}: {path!r} is a directory; give the data file")
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no such file {path!r}")


def numeric(array: np.ndarray, where: str, label: bool) -> np.ndarray:
    """Features as float32; labels as int32 (integer labels) or float32; columns as `(n, 1)`.
    A value the conversion would change (an imaginary part, an integer label beyond int32, a
    float beyond float32) is an error, never silently dropped, wrapped or made infinite."""
    array = np.asarray(array)
    if np.issubdtype(array.dtype, np.complexfloating):
        raise ConfigError(f"{where}: has complex dtype {array.dtype}; give real numbers (e.g. the "
                          "real and imaginary parts as two columns)")
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number)
                                     or array.dtype == np.bool_):
        raise ConfigError(f"{where}: has dtype {array.dtype}, expected numbers")
    if array.ndim == 0:
        raise ConfigError(f"{where}: is a scalar, expected one row per example")
    if array.ndim == 1:
        array = array[:, None]
    if label and (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        if array.size and np.issubdtype(array.dtype, np.integer) and \
                (array.min() < _INT32.min or array.max() > _INT32.max):
            bad = int(np.argmax(((array < _INT32.min) | (array > _INT32.max)).reshape(len(array), -1).any(1)))
            raise ConfigError(f"{where}: integer label {array.reshape(len(array), -1)[bad].tolist()} "
                              f"(row {bad}) is beyond the int32 range labels are read as "
                              f"[{_INT32.min}, {_INT32.max}]; give class indices")
        return array.astype(np.int32)
    if np.issubdtype(array.dtype, np.floating) and array.dtype.itemsize > 4 and array.size:
        finite = np.abs(np.where(np.isfinite(array), array, 0))
        if finite.max() > _FLOAT32_MAX:
            bad = int(np.argmax((finite > _FLOAT32_MAX).reshape(len(array), -1).any(1)))
            raise ConfigError(f"{where}: row {bad} holds a value beyond the float32 range "
                              f"(|x| <= {_FLOAT32_MAX:.4g}) the data is read as; rescale the data")
    return array.astype(np.float32)


def read_npz(path: str, where: str) -> dict[str, np.ndarray]:
    """Every array of an `.npz`, each header read and checked first: an object (ragged)
    array, or a shape whose data the file does not hold or memory cannot, is refused before
    anything is allocated."""
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{where}: {path!r} is not a complete .npz file (no zip directory: "
                          "truncated, or not written with numpy.savez)")
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.filename.endswith(".npy"):
                    with archive.open(info) as member:
                        _check_npy_header(member, info, path, where)
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ConfigError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError) as err:
        raise ConfigError(f"{where}: cannot read {path!r} as .npz (corrupt or truncated: "
                          f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None


def _check_npy_header(member: Any, info: zipfile.ZipInfo, path: str, where: str) -> None:
    name = info.filename[:-4]
    try:
        version = np.lib.format.read_magic(member)
        shape, _, dtype = (np.lib.format.read_array_header_1_0(member) if version == (1, 0)
                           else np.lib.format.read_array_header_2_0(member))
    except ValueError as err:
        raise ConfigError(f"{where}: array {name!r} of {path!r} has a corrupt header "
                          f"({str(err).splitlines()[0]})") from None
    if dtype.hasobject:
        raise ConfigError(f"{where}: array {name!r} of {path!r} is an object array (ragged rows?); "
                          "give numeric arrays of one shape")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > info.file_size:
        raise ConfigError(f"{where}: array {name!r} of {path!r} declares shape {tuple(shape)} "
                          f"({nbytes:.3g} bytes) but the file holds {info.file_size} bytes of it "
                          "(corrupt or truncated)")
    if nbytes > memory_bytes():
        raise ConfigError(f"{where}: array {name!r} of {path!r} has shape {tuple(shape)}: "
                          f"{nbytes / 2**30:.1f} GiB, more than this machine's memory "
                          f"({memory_bytes() / 2**30:.1f} GiB)")


def csv_header(path: str, where: str) -> list[str]:
    """The column names of a CSV file's header row, in the file's order."""
    try:  # utf-8-sig: a byte-order mark is not part of the first column's name
        with open(path, encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh), None)
    except UnicodeDecodeError as err:
        raise ConfigError(_not_utf8(path, where, err)) from None
    if not header:
        raise ConfigError(f"{where}: {path!r} is empty; a CSV file needs a header row")
    return header


def read_csv(path: str, where: str, needed: list[str], dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The needed columns of a CSV file with a header row, parsed by `tf.io.decode_csv`.

    Every column is decoded (unused ones as strings), so a row with a missing or extra field
    fails; an empty float field is NaN, an empty integer field an error.
    """
    header = csv_header(path, where)
    for column in dtypes:
        if column not in header:
            raise ConfigError(f"data.dtypes.{column}: {path!r} has no column {column!r}")
    defaults = []
    for column in header:
        if column not in needed:
            defaults.append(tf.constant([""], tf.string))
        elif dtypes.get(column, "float32").startswith("float"):
            defaults.append(tf.constant([np.nan], tf.as_dtype(dtypes.get(column, "float32"))))
        else:
            defaults.append(tf.constant([], tf.as_dtype(dtypes[column])))
    keep = [i for i, c in enumerate(header) if c in needed]
    lines = (tf.data.TextLineDataset(path).skip(1)
             .map(lambda line: tf.strings.regex_replace(line, "\r$", ""))  # CRLF files
             .filter(lambda line: tf.strings.length(line) > 0))
    ds = lines.batch(_CSV_BATCH).map(lambda b: tuple(tf.io.decode_csv(b, defaults)[i] for i in keep),
                                     num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    parts: list[list[np.ndarray]] = [[] for _ in keep]
    try:
        for batch in ds:
            for store, column in zip(parts, batch):
                store.append(column.numpy())
    except tf.errors.InvalidArgumentError as err:
        raise ConfigError(_csv_problem(path, where, header, needed, dtypes)
                          or f"{where}: cannot parse {path!r}: {str(err.message).splitlines()[0]}") from None
    return {header[i]: (np.concatenate(store) if store else np.zeros((0,), np.float32))
            for i, store in zip(keep, parts)}


def _csv_problem(path: str, where: str, header: list[str], needed: list[str],
                 dtypes: Mapping[str, str]) -> str | None:
    """The first ragged row or unparsable value, found by reading the file again in Python
    (only after tf.data reported a problem)."""
    try:
        return _first_csv_problem(path, where, header, needed, dtypes)
    except UnicodeDecodeError as err:
        return _not_utf8(path, where, err)


def _not_utf8(path: str, where: str, err: UnicodeDecodeError) -> str:
    """The line and column of the first byte that is not UTF-8 (the decoder's own offset is
    within the chunk it read)."""
    with open(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                return (f"{where}: {path!r} is not UTF-8 text (byte {raw[bad.start]:#04x} at line "
                        f"{line}, column {bad.start + 1}); save it as UTF-8")
    return f"{where}: {path!r} is not UTF-8 text ({err.reason}); save it as UTF-8"


def _first_csv_problem(path: str, where: str, header: list[str], needed: list[str],
                       dtypes: Mapping[str, str]) -> str | None:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if line == 1 or not row:
                continue
            if len(row) != len(header):
                return (f"{where}: line {line} of {path!r} has {len(row)} fields but the header has "
                        f"{len(header)} (ragged rows); fix the file")
            for column, value in zip(header, row):
                dtype = dtypes.get(column, "float32")
                if column not in needed or (value == "" and dtype.startswith("float")):
                    continue
                try:
                    float(value) if dtype.startswith("float") else int(value)
                except ValueError:
                    key = f"data.dtypes.{column}" if column in dtypes else where
                    return (f"{key}: column {column!r} of {path!r} has {value!r} at line {line}, "
                            f"not a {dtype}; fix the value or set data.dtypes.{column}")
    return None


def tfrecord_features(path: str) -> list[str] | None:
    """The feature names of a tfrecord file's first `tf.train.Example`, or `None` when there is
    none to read (an empty or corrupt file: the reader reports it)."""
    from google.protobuf.message import DecodeError

    try:
        if scan_records(path).records == 0:  # TensorFlow is given whole, bounded records only
            return None
        for record in tf.data.TFRecordDataset(path).take(1):
            return sorted(tf.train.Example.FromString(record.numpy()).features.feature)
    except (tf.errors.OpError, DecodeError, BoundaryError):
        pass
    return None


def read_tfrecord(path: str, where: str, needed: list[str], dtypes: Mapping[str, str],
                   shapes: Mapping[str, list[int]]) -> dict[str, np.ndarray]:
    """`tf.train.Example` records parsed with a fixed-length feature spec (`data.dtypes`,
    `data.shapes`); a float feature is stored as a float list, an integer one as an int64 list."""
    spec = {}
    for name in needed:
        dtype = dtypes.get(name, "float32")
        spec[name] = tf.io.FixedLenFeature(shapes.get(name, []),
                                           tf.float32 if dtype.startswith("float") else tf.int64)
    elements = sum(math.prod(shapes.get(name, [])) for name in needed)
    if elements * 8 > memory_bytes():  # data.shapes is bounded at load; this is the reader's own rule
        raise ConfigError(f"data.shapes: one example of {path!r} would take {elements * 8 / 2**30:.1f} "
                          f"GiB, more than this machine's memory")
    try:
        check_records(path)  # before TensorFlow allocates what a header declares
    except BoundaryError as err:
        raise ConfigError(f"{where}: {err}") from None
    batch = max(1, min(_CSV_BATCH, _TFRECORD_BATCH_ELEMENTS // max(1, elements)))
    ds = tf.data.TFRecordDataset(path).batch(batch).map(
        lambda records: tf.io.parse_example(records, spec),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in needed}
    try:
        for batch in ds:
            for name in needed:
                parts[name].append(batch[name].numpy())
    except tf.errors.InvalidArgumentError as err:
        message = str(err.message).splitlines()[0]
        found = re.search(r"Key: ([^,]+), Index: (\d+)\.\s*(.*)", message)
        culprit = found.group(1) if found and found.group(1) in needed else None
        if found:
            message = f"feature {found.group(1)!r} of record {found.group(2)}: {found.group(3).strip()}"
        key = f"data.shapes.{culprit}" if culprit else where
        raise ConfigError(f"{key}: the records of {path!r} do not match the feature spec "
                          f"(data.dtypes, data.shapes): {message}") from None
    except tf.errors.DataLossError as err:
        raise ConfigError(f"{where}: {path!r} is not a TFRecord file ({str(err.message).splitlines()[0]})") from None
    except UnicodeDecodeError:  # TF's error quotes the undecodable payload
        raise ConfigError(f"{where}: {path!r} holds records that are not tf.train.Example "
                          "protos; write them with tf.io.TFRecordWriter") from None
    out = {}
    for name, store in parts.items():
        array = np.concatenate(store) if store else np.zeros([0] + shapes.get(name, []), np.float32)
        dtype = dtypes.get(name, "float32")
        out[name] = array.astype(dtype)
    return out


def read_tfds(data: DataConfig, split: str, where: str) -> dict[str, np.ndarray]:
    """One split of a `tensorflow_datasets` dataset already prepared in `data.data_dir`
    (never downloaded), its top-level features by name."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ConfigError("data.kind: tfds needs tensorflow-datasets: pip install "
                          "'multihead[tfds]'") from None
    try:
        builder = tfds.builder(str(data.name), data_dir=data.data_dir)
    except Exception as err:  # tfds raises its own DatasetNotFoundError and friends
        raise ConfigError(f"data.name: no tensorflow_datasets dataset {data.name!r} in "
                          f"{data.data_dir or 'the default data_dir'}: "
                          f"{str(err).splitlines()[0]}") from None
    splits = sorted(builder.info.splits.keys())
    if not splits or not os.path.isdir(builder.data_dir):
        raise ConfigError(f"data.name: {data.name!r} is not prepared in {builder.data_dir!r}; "
                          "run its download_and_prepare first (multihead never downloads)")
    try:
        arrays = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
    except (ValueError, KeyError) as err:
        raise ConfigError(f"{where}: {data.name!r} has no split {split!r} (splits: {splits}): "
                          f"{str(err).splitlines()[0]}") from None
    if not isinstance(arrays, Mapping):
        raise ConfigError(f"data.name: {data.name!r} does not yield a dict of features")
    return {str(k): v for k, v in arrays.items() if isinstance(v, np.ndarray)}


# -- Python functions ------------------------------------------------------------------
