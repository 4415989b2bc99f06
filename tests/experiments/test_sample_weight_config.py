"""`data.sample_weights: {head: column}`: per-example weights read from the same csv/npz files
as the features train the run and weight its evaluation as Keras' weighted means; bad weight
columns are refused by `multihead validate` with one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.run import supervised
from multihead.experiments.config.schema import from_dict

HEADS = ("y1", "y2")
N, D = 48, 3


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D)).astype(np.float32)
    y = {"y1": (x @ rng.standard_normal((D, 1))).astype(np.float32),
         "y2": np.sin(x[:, :1]).astype(np.float32)}
    w = rng.uniform(0.0, 3.0, N).astype(np.float32)
    w[::7] = 0.0  # zero-weight rows count for nothing
    return x, y, w


def _write(tmp_path, name, x, y, w):
    np.savez(tmp_path / f"{name}.npz", x=x, w=w, **y)
    lines = [",".join([f"x{i}" for i in range(D)] + ["y1", "y2", "w"])]
    for i in range(len(x)):
        lines.append(",".join(f"{v:.9g}" for v in [*x[i], y["y1"][i, 0], y["y2"][i, 0], w[i]]))
    (tmp_path / f"{name}.csv").write_text("\n".join(lines) + "\n")


def _files(tmp_path):
    x, y, w = _arrays()
    half = N // 2
    _write(tmp_path, "train", x[:half], {h: v[:half] for h, v in y.items()}, w[:half])
    _write(tmp_path, "eval", x[half:], {h: v[half:] for h, v in y.items()}, w[half:])
    return x[half:], {h: v[half:] for h, v in y.items()}, w[half:]


def _config(tmp_path, kind, **data):
    files = {"kind": kind, "train": str(tmp_path / f"train.{kind}"),
             "eval": str(tmp_path / f"eval.{kind}"), "sample_weights": {"y2": "w"}}
    if kind == "csv":
        files["features"] = [f"x{i}" for i in range(D)]
    return {"model": {"trunk": {"mlp": {"units": [8]}},
                      "heads": {h: {"metrics": ["mae"]} for h in HEADS}},
            "data": {**files, **data}, "seed": 1,
            "train": {"steps": 4, "batch_size": 8, "eval_every": 4}, "log": {"tensorboard": False}}


def test_a_csv_weight_column_trains_from_a_config_and_weights_the_eval_loss(tmp_path):
    x, y, w = _files(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, "csv")))
    assert run_experiment(str(config), run_dir=str(tmp_path / "run"), quiet=True).exit_code == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    pred = mh.load_run(tmp_path / "run").model(x, training=False)
    error = pred["y2"].numpy()[:, 0] - y["y2"][:, 0]
    # Keras' conventions: the loss (mse) reduces as sum(w l) / n (sum_over_batch_size with
    # sample_weight), a metric is the weighted mean sum(w m) / sum(w)
    np.testing.assert_allclose(metrics["eval"]["y2"]["loss"], np.sum(w * error ** 2) / len(w),
                               rtol=1e-5)
    np.testing.assert_allclose(metrics["eval"]["y2"]["mean_absolute_error"],
                               np.sum(w * np.abs(error)) / np.sum(w), rtol=1e-5)
    # the head without weights keeps the plain mean
    error1 = pred["y1"].numpy()[:, 0] - y["y1"][:, 0]
    np.testing.assert_allclose(metrics["eval"]["y1"]["loss"], np.mean(error1 ** 2), rtol=1e-5)
    # the constant baseline is weighted as the eval is: the weighted train mean, scored with
    # the eval weights (the head without weights: the plain mean, plainly scored)
    _, y_all, w_all = _arrays()
    constant = np.average(y_all["y2"][:N // 2, 0], weights=w_all[:N // 2])
    np.testing.assert_allclose(metrics["baseline"]["y2"]["loss"],
                               np.sum(w * (y["y2"][:, 0] - constant) ** 2) / len(w), rtol=2e-3)
    np.testing.assert_allclose(metrics["baseline"]["y2"]["mean_absolute_error"],
                               np.sum(w * np.abs(y["y2"][:, 0] - constant)) / np.sum(w), rtol=2e-3)
    plain = y_all["y1"][:N // 2, 0].mean()
    np.testing.assert_allclose(metrics["baseline"]["y1"]["loss"],
                               np.mean((y["y1"][:, 0] - plain) ** 2), rtol=2e-3)


def test_an_npz_weight_array_trains_bitwise_as_fit_with_sample_weight(tmp_path):
    _files(tmp_path)
    runner = supervised.prepare(from_dict(_config(tmp_path, "npz")))
    train = np.load(tmp_path / "train.npz")
    np.testing.assert_array_equal(runner.data.w_train["y2"], train["w"])
    twin = supervised.prepare(from_dict(_config(tmp_path, "npz")))  # same seed: same init
    runs = []
    for run, data in ((runner, supervised._splits(runner.data)[0]),
                      (twin, (train["x"], {h: train[h] for h in HEADS}, {"y2": train["w"]}))):
        mh.Trainer(run.model, run.objectives).fit(data, 3, batch_size=8, seed=0, verbose=False)
        runs.append([v.numpy() for v in run.model.weights])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def _bad(tmp_path, capsys, raw):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(config), "--build"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "eval.csv", "eval.npz",
                                                          "train.csv", "train.npz"]
    return err


@pytest.mark.parametrize("data, expected", [
    ({"sample_weights": {"y9": "w"}}, "data.sample_weights.y9: the model has no head 'y9'"),
    ({"sample_weights": {"y2": "wt"}}, "data.sample_weights.y2: data.train"),
    ({"sample_weights": {"y2": "x1"}}, "data.sample_weights.y2: column 'x1' is also read by "
                                       "data.features"),
    ({"sample_weights": {"y2": "y1"}}, "data.sample_weights.y2: column 'y1' is also read by "
                                       "data.targets.y1"),
])
def test_a_bad_weight_key_is_refused_by_validate_with_one_line(tmp_path, capsys, data, expected):
    _files(tmp_path)
    err = _bad(tmp_path, capsys, _config(tmp_path, "csv", **data))
    assert expected in err
    if "'wt'" in err:
        assert "did you mean 'w'" in err


@pytest.mark.parametrize("value, shown", [(-1.0, "-1.0"), (np.nan, "nan"), (np.inf, "inf")])
def test_a_negative_or_nonfinite_weight_is_named_with_its_file_column_and_row(tmp_path, capsys,
                                                                             value, shown):
    x, y, w = _arrays()
    _files(tmp_path)
    w = w[N // 2:].copy()
    w[5] = value
    _write(tmp_path, "eval", x[N // 2:], {h: v[N // 2:] for h, v in y.items()}, w)
    err = _bad(tmp_path, capsys, _config(tmp_path, "npz"))
    assert f"data.sample_weights.y2: array 'w' of '{tmp_path / 'eval.npz'}' has {shown} at row 5" \
        in err


def test_sample_weights_with_per_head_data_are_refused_naming_the_key(tmp_path, capsys):
    _files(tmp_path)
    section = {"kind": "npz", "train": str(tmp_path / "train.npz")}
    raw = _config(tmp_path, "npz")
    raw["data"] = {"per_head": {"y1": section, "y2": {**section, "sample_weights": {"y2": "w"}}}}
    assert "data.per_head.y2.sample_weights: sample weights with one dataset per head" \
        in _bad(tmp_path, capsys, raw)
    raw["data"] = {"per_head": {"y1": section, "y2": section}, "sample_weights": {"y2": "w"}}
    assert "data.sample_weights: sample weights with one dataset per head" \
        in _bad(tmp_path, capsys, raw)


def test_sample_weights_of_generated_data_are_refused_naming_the_key(tmp_path, capsys):
    _files(tmp_path)
    raw = _config(tmp_path, "npz")
    raw["data"] = {"kind": "mmoe", "sample_weights": {"y2": "w"}}
    assert "data.sample_weights: read from the data files" in _bad(tmp_path, capsys, raw)


def test_weights_stay_with_their_rows_through_holdout_and_dropped_rows(tmp_path):
    x, _, _ = _arrays()
    index = np.arange(N, dtype=np.float32)
    x[3, 1] = np.nan  # row 3 is dropped, its weight with it
    np.savez(tmp_path / "d.npz", x=x, y1=index, y2=index, w=index)  # weight i on row i
    data = mh.load_data({"kind": "npz", "train": str(tmp_path / "d.npz"), "holdout": 0.25,
                         "on_nonfinite": "drop", "sample_weights": {"y1": "w"}}, heads=HEADS)
    for w, y in ((data.w_train, data.y_train), (data.w_eval, data.y_eval)):
        np.testing.assert_array_equal(w["y1"], y["y1"][:, 0])
    kept = np.sort(np.concatenate([data.w_train["y1"], data.w_eval["y1"]]))
    np.testing.assert_array_equal(kept, np.delete(index, 3))


def test_a_tfrecord_float_feature_is_read_as_the_weights(tmp_path):
    import tensorflow as tf

    x, y, w = _arrays()
    with tf.io.TFRecordWriter(str(tmp_path / "d.tfrecord")) as writer:
        for i in range(N):
            values = {"x": x[i], "w": w[i:i + 1], **{h: y[h][i] for h in HEADS}}
            feature = {k: tf.train.Feature(float_list=tf.train.FloatList(value=v))
                       for k, v in values.items()}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature))
                         .SerializeToString())
    data = mh.load_data({"kind": "tfrecord", "train": str(tmp_path / "d.tfrecord"),
                         "eval": str(tmp_path / "d.tfrecord"), "shapes": {"x": [D]},
                         "sample_weights": {"y2": "w"}}, heads=HEADS)
    np.testing.assert_array_equal(data.w_train["y2"], w)
    np.testing.assert_array_equal(data.w_eval["y2"], w)
