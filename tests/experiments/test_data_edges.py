"""Hostile and careless data files: every value is checked (NaN and inf, complex numbers,
integers beyond int32, floats beyond float32), every size is bounded before allocation
(npz headers, tfrecord shapes, model layers) and every broken file is one line naming the
key and the file, never a traceback, a MemoryError or a SIGSEGV."""

from __future__ import annotations

import io
import time
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

import multihead as mh
from multihead.experiments.build.builders import build_layer
from multihead.cli.main import main
from multihead.experiments.config.schema import ConfigError
from multihead.experiments.config.sizes import estimate_parameters

N, D = 40, 3


def _xy(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(np.float32)
    return x, (x[:, :1] * 2.0).astype(np.float32)


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return {"kind": "npz", "train": str(path)}


def _load(section, heads=("y1",)):
    return mh.load_data(section, heads=list(heads))


def _error(section, heads=("y1",)) -> str:
    with pytest.raises(ConfigError) as err:
        _load(section, heads)
    message = str(err.value)
    assert "\n" not in message, message
    return message


# -- values ---------------------------------------------------------------------------------


def test_inf_is_treated_like_nan_and_on_nan_still_names_the_policy(tmp_path):
    x, y = _xy()
    x[3, 1], y[7, 0], x[9, 0] = np.inf, -np.inf, np.nan
    section = _npz(tmp_path / "d.npz", x=x, y1=y)
    message = _error(section)
    assert message.startswith("data.on_nonfinite: data.train has NaN or inf in the inputs "
                              "(2 rows, first row 3: inf)"), message
    finite = np.isfinite(x).all(1) & np.isfinite(y).all(1)  # rows 3, 7, 9 go
    for key in ("on_nonfinite", "on_nan"):  # on_nan: the former name, same meaning
        data = _load({**section, key: "drop", "eval": str(tmp_path / "d.npz")})
        np.testing.assert_array_equal(data.x_train, x[finite])
        np.testing.assert_array_equal(data.y_train["y1"], y[finite])
    kept = _load({**section, "on_nonfinite": "keep", "eval": str(tmp_path / "d.npz")})
    assert np.isposinf(kept.x_train[3, 1]) and np.isneginf(kept.y_train["y1"][7, 0])
    assert "data.on_nan: 'drop' differs from data.on_nonfinite 'keep'" in _error(
        {**section, "on_nan": "drop", "on_nonfinite": "keep"})


def test_values_a_conversion_would_change_are_refused(tmp_path):
    x, y = _xy()
    message = _error(_npz(tmp_path / "c.npz", x=x + 1j, y1=y))
    assert message.startswith("data.features ('x' in data.train (") and "complex" in message
    labels = np.arange(N, dtype=np.int64)
    labels[5] = 2**31  # int32 would wrap it to -2**31
    message = _error(_npz(tmp_path / "i.npz", x=x, y1=labels))
    assert message.startswith("data.targets.y1 ('y1' in data.train (") and "row 5" in message
    assert "int32" in message
    big = x.astype(np.float64)
    big[2, 0] = 1e300  # float32 would make it inf
    assert "row 2 holds a value beyond the float32 range" in _error(
        _npz(tmp_path / "f.npz", x=big, y1=y))
    # within range, int64 labels are read exactly
    labels[5] = 2**31 - 1
    data = _load({**_npz(tmp_path / "ok.npz", x=x, y1=labels), "eval": str(tmp_path / "ok.npz")})
    np.testing.assert_array_equal(data.y_train["y1"][:, 0], labels)
    assert data.y_train["y1"].dtype == np.int32


# -- npz ------------------------------------------------------------------------------------


def test_an_npz_header_declaring_a_huge_shape_is_refused_before_allocation(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 6)})
    with zipfile.ZipFile(tmp_path / "h.npz", "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 48)
        archive.writestr("y1.npy", _npy(np.zeros((2, 1), np.float32)))
    started = time.process_time()
    message = _error({"kind": "npz", "train": str(tmp_path / "h.npz")})
    assert time.process_time() - started < 5  # CPU time: read the header, allocate nothing
    assert message.startswith("data.train: array 'x' of ") and "(1000000000000, 6)" in message
    assert "truncated" in message


def _npy(array):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array)
    return buffer.getvalue()


def test_truncated_corrupt_and_object_npz_files_say_which(tmp_path):
    x, y = _xy()
    np.savez(tmp_path / "good.npz", x=x, y1=y)
    whole = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "noise.npz").write_bytes(np.random.default_rng(0).bytes(600))
    for name in ("cut.npz", "noise.npz"):
        message = _error({"kind": "npz", "train": str(tmp_path / name)})
        assert message.startswith(f"data.train: '{tmp_path / name}' is not a complete .npz file")
        assert "object array" not in message
    # a member whose data was damaged inside an intact archive
    damaged = bytearray(whole)
    start = whole.index(b"x.npy") + 200
    damaged[start:start + 64] = bytes(64)
    (tmp_path / "damaged.npz").write_bytes(bytes(damaged))
    message = _error({"kind": "npz", "train": str(tmp_path / "damaged.npz")})
    assert message.startswith("data.train: ") and "damaged.npz" in message
    with zipfile.ZipFile(tmp_path / "ragged.npz", "w") as archive:
        archive.writestr("x.npy", _npy(np.array([[1.0], [1.0, 2.0]], dtype=object)))
        archive.writestr("y1.npy", _npy(y))
    assert "is an object array (ragged rows?)" in _error({"kind": "npz", "train": str(tmp_path / "ragged.npz")})


# -- csv, tfrecord, paths -------------------------------------------------------------------


def test_a_csv_with_a_byte_order_mark_keeps_its_first_column(tmp_path):
    rows = "\n".join(f"{i},{2 * i},{3 * i}" for i in range(10))
    (tmp_path / "bom.csv").write_text("a,b,y1\n" + rows + "\n", encoding="utf-8-sig")
    data = _load({"kind": "csv", "train": str(tmp_path / "bom.csv"), "features": ["a", "b"],
                  "eval": str(tmp_path / "bom.csv")})
    np.testing.assert_array_equal(data.x_train, np.array([[i, 2 * i] for i in range(10)], np.float32))


def test_latin1_bytes_empty_files_garbage_records_and_directories_are_one_line(tmp_path):
    (tmp_path / "latin.csv").write_bytes(b"a,note,y1\n" + b"\n".join(
        b"%d,caf\xe9,%d" % (i, i) for i in range(5)) + b"\n")
    (tmp_path / "latin_header.csv").write_bytes(b"a,caf\xe9,y1\n1,2,3\n")
    (tmp_path / "header_only.csv").write_text("a,b,y1\n")
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    with tf.io.TFRecordWriter(str(tmp_path / "garbage.tfrecord")) as writer:
        for _ in range(3):
            writer.write(b"\xff\xfe\x80 not a tf.train.Example" * 4)
    (tmp_path / "adir.npz").mkdir()
    x, y = _xy()
    csv = {"kind": "csv", "features": ["a"]}
    cases = [
        ({**csv, "train": "latin.csv"}, "is not UTF-8 text (byte 0xe9 at line 2, column 6)"),
        ({**csv, "train": "latin_header.csv"}, "is not UTF-8 text (byte 0xe9 at line 1, column 6)"),
        ({**csv, "train": "header_only.csv"}, "has no rows (column 'a' is empty)"),
        ({"kind": "npz", "train": "zero.npz"}, "has no rows (array 'x' is empty)"),
        ({"kind": "tfrecord", "train": "empty.tfrecord", "shapes": {"x": [D]}},
         "has no rows (feature 'x' is empty)"),
        ({"kind": "tfrecord", "train": "garbage.tfrecord"}, "holds records that are not tf.train.Example"),
        ({"kind": "npz", "train": "adir.npz"}, "is a directory; give the data file"),
    ]
    np.savez(tmp_path / "zero.npz", x=x[:0], y1=y[:0])
    for section, words in cases:
        path = str(tmp_path / section["train"])
        message = _error({**section, "train": path})
        assert message.startswith(f"data.train: {path!r} ") and words in message, message


def _config(tmp_path, data, **model):
    raw = {"data": data, "model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"y1": {}}, **model},
           "train": {"steps": 2, "batch_size": 8}, "log": {"tensorboard": False}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize("command", ["validate", "train"])
def test_bad_edges_exit_2_in_one_line_and_write_nothing(tmp_path, capsys, command):
    x, y = _xy()
    with tf.io.TFRecordWriter(str(tmp_path / "d.tfrecord")) as writer:
        example = tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))}))
        writer.write(example.SerializeToString())
    np.savez(tmp_path / "d.npz", x=x, y1=y)
    cases = [
        # 10**13 values per example: TensorFlow's parser crashed the process (SIGSEGV)
        ({"kind": "tfrecord", "train": str(tmp_path / "d.tfrecord"),
          "shapes": {"x": [10**6, 10**7]}}, {}, "data.shapes.x: [1000000, 10000000] is 1e+13 values"),
        ({"kind": "npz", "train": str(tmp_path / "d.npz")},
         {"trunk": {"class_name": "Model", "module": "keras", "config": {}}},
         "model.trunk: class_name 'Model' is Keras' abstract base class"),
        ({"kind": "npz", "train": str(tmp_path / "d.npz")},
         {"trunk": {"mlp": {"units": [20000, 10**7]}}}, "model.trunk.mlp.units[1]: the model would have"),
        ({"kind": "npz", "train": str(tmp_path)}, {}, "is a directory"),
    ]
    for data, model, words in cases:
        config = _config(tmp_path, data, **model)
        extra = ["--run-dir", str(tmp_path / "run"), "--quiet"] if command == "train" else ["--build"]
        assert main([command, config, *extra]) == 2, words
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("multihead: error: ") and words in err, err
        assert not (tmp_path / "run").exists()


# -- the model size estimate ----------------------------------------------------------------


@pytest.mark.parametrize("trunk, head, input_shape", [
    ({"mlp": {"units": [16, 8]}}, {"mlp": {"units": [4, 1]}}, (None, 5)),
    ([{"class_name": "Dense", "config": {"units": 7}},
      {"class_name": "Dropout", "config": {"rate": 0.1}},
      {"class_name": "Dense", "config": {"units": 3}}], {"class_name": "Dense", "config": {"units": 2}},
     (None, 11)),
    ([{"class_name": "Conv2D", "config": {"filters": 6, "kernel_size": 3}},
      {"class_name": "Conv2D", "config": {"filters": 4, "kernel_size": [2, 3]}}],
     {"class_name": "Conv2D", "config": {"filters": 2, "kernel_size": 1}}, (None, 9, 9, 2)),
])
def test_the_parameter_estimate_equals_keras_count_for_dense_and_conv_stacks(trunk, head, input_shape):
    model = mh.MultiHeadModel(build_layer(trunk, "model.trunk"), {"h": build_layer(head, "h")})
    model.build(input_shape)
    parameters, layers, _ = estimate_parameters(trunk, {"h": head}, input_width=input_shape[-1])
    assert parameters == model.count_params() and layers >= 2


def test_the_estimate_is_a_lower_bound_when_the_input_width_is_unknown():
    trunk = {"mlp": {"units": [10, 10]}}
    model = keras.Sequential([keras.layers.Dense(10), keras.layers.Dense(10)])
    model.build((None, 50))
    assert estimate_parameters(trunk)[0] == (1 + 1) * 10 + (10 + 1) * 10 < model.count_params()
