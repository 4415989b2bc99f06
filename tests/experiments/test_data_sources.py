"""Data sources in configs: npz, csv, tfrecord and python read the same data, train identically,
and every bad input is a one-line error naming the key, exit 2, with no run directory left."""

import os
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import yaml

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError, from_dict
from multihead.experiments.run import supervised

HEADS = ("y1", "y2")
N, D = 120, 5


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(np.float32)
    y1 = (x @ rng.standard_normal((D, 1))).astype(np.float32)
    y2 = np.sin(x[:, :1]).astype(np.float32)
    return x, {"y1": y1, "y2": y2}


def _write_csv(path, x, y, extra_rows=()):
    cols = [f"x{i}" for i in range(D)] + ["note", "t1", "t2"]
    lines = [",".join(cols)]
    for i in range(len(x)):
        # %.9g round-trips float32 exactly
        values = [f"{v:.9g}" for v in x[i]] + ["n/a", f"{y['y1'][i, 0]:.9g}", f"{y['y2'][i, 0]:.9g}"]
        lines.append(",".join(values))
    lines += list(extra_rows)
    path.write_text("\n".join(lines) + "\n")


def _write_tfrecord(path, x, y):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(len(x)):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i]))}
            for h in HEADS:
                feature[h] = tf.train.Feature(float_list=tf.train.FloatList(value=y[h][i]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _write_module(tmp_path, monkeypatch, name="my_data"):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import numpy as np
        import tensorflow as tf

        def arrays(seed=0):
            rng = np.random.default_rng(seed)
            x = rng.standard_normal(({N}, {D})).astype(np.float32)
            y1 = (x @ rng.standard_normal(({D}, 1))).astype(np.float32)
            y2 = np.sin(x[:, :1]).astype(np.float32)
            return x, {{"y1": y1, "y2": y2}}

        def dataset(seed=0):
            return tf.data.Dataset.from_tensor_slices(arrays(seed)).batch(7)

        def extra_target():
            x, y = arrays()
            return x, {{**y, "y3": y["y1"]}}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))


def _write_tfds(data_dir, x, y):
    """A tiny tensorflow_datasets dataset prepared locally (no download), rows in key order."""
    tfds = pytest.importorskip("tensorflow_datasets")

    class TinyMultiTask(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            spec = {"x": tfds.features.Tensor(shape=(D,), dtype=np.float32)}
            spec.update({h: tfds.features.Tensor(shape=(1,), dtype=np.float32) for h in HEADS})
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(spec),
                                         disable_shuffling=True)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(len(x)):
                yield i, {"x": x[i], **{h: y[h][i] for h in HEADS}}

    TinyMultiTask(data_dir=str(data_dir)).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def _sources(tmp_path, monkeypatch):
    x, y = _arrays()
    np.savez(tmp_path / "d.npz", x=x, **y)
    _write_csv(tmp_path / "d.csv", x, y)
    _write_tfrecord(tmp_path / "d.tfrecord", x, y)
    _write_module(tmp_path, monkeypatch)
    return {
        "npz": {"kind": "npz", "train": str(tmp_path / "d.npz")},
        "csv": {"kind": "csv", "train": str(tmp_path / "d.csv"),
                "features": [f"x{i}" for i in range(D)], "targets": {"y1": "t1", "y2": "t2"}},
        "tfrecord": {"kind": "tfrecord", "train": str(tmp_path / "d.tfrecord"),
                     "shapes": {"x": [D], "y1": [1], "y2": [1]}},
        "python": {"kind": "python", "function": "my_data:arrays"},
        "python_dataset": {"kind": "python", "function": "my_data:dataset"},
    }


def _config(data, **train):
    return {
        "model": {"trunk": {"mlp": {"units": [16]}},
                  "heads": {h: {"optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}}}
                            for h in HEADS}},
        "data": data, "seed": 3,
        "train": {"steps": 50, "batch_size": 16, **train},
        "log": {"tensorboard": False},
    }


def _trained_weights(raw):
    runner = supervised.prepare(from_dict(raw, allow_import=["my_data"]))
    trainer = mh.Trainer(runner.model, runner.objectives)
    trainer.fit(runner.data.train, 50, batch_size=16, seed=0, verbose=False)
    return runner.data, [v.numpy() for v in runner.model.trainable_variables]


def test_every_source_reads_the_same_arrays_and_trains_bitwise_identically(tmp_path, monkeypatch):
    sources = _sources(tmp_path, monkeypatch)
    reference_data, reference = _trained_weights(_config(sources["npz"]))
    x, y = _arrays()
    # the holdout keeps the file order: train + eval rows are all rows, split by a seeded draw
    assert len(reference_data.x_train) == 96 and len(reference_data.x_eval) == 24
    assert {tuple(r) for r in np.concatenate([reference_data.x_train, reference_data.x_eval])} == \
        {tuple(r) for r in x}
    for name in ("csv", "tfrecord", "python", "python_dataset"):
        data, weights = _trained_weights(_config(sources[name]))
        np.testing.assert_array_equal(data.x_train, reference_data.x_train, err_msg=name)
        for h in HEADS:
            np.testing.assert_array_equal(data.y_eval[h], reference_data.y_eval[h], err_msg=name)
        for a, b in zip(weights, reference):
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_tfds_source_trains_like_the_npz_source(tmp_path, monkeypatch):
    sources = _sources(tmp_path, monkeypatch)
    x, y = _arrays()
    _write_tfds(tmp_path / "tfds", x, y)
    tfds_source = {"kind": "tfds", "name": "tiny_multi_task", "data_dir": str(tmp_path / "tfds")}
    reference_data, reference = _trained_weights(_config(sources["npz"]))
    data, weights = _trained_weights(_config(tfds_source))
    np.testing.assert_array_equal(data.x_eval, reference_data.x_eval)
    for a, b in zip(weights, reference):
        np.testing.assert_array_equal(a, b)
    for section, message in [({**tfds_source, "train": "validation"}, "data.train: 'tiny_multi_task' has no split"),
                             ({**tfds_source, "name": "nothing_here"}, "data.name: no tensorflow_datasets dataset")]:
        with pytest.raises(ConfigError, match=message):
            mh.load_data(section, heads=HEADS)


def test_python_api_reads_like_the_config(tmp_path, monkeypatch):
    sources = _sources(tmp_path, monkeypatch)
    data = mh.load_data(sources["csv"], heads=HEADS, seed=3)
    runner = supervised.prepare(from_dict(_config(sources["csv"])))
    np.testing.assert_array_equal(data.x_eval, runner.data.x_eval)
    assert data.kinds == {"y1": "regression", "y2": "regression"}


def test_eval_file_and_named_inputs(tmp_path):
    x, y = _arrays()
    _write_csv(tmp_path / "train.csv", x[:100], {h: v[:100] for h, v in y.items()})
    _write_csv(tmp_path / "eval.csv", x[100:], {h: v[100:] for h, v in y.items()})
    section = {"kind": "csv", "train": str(tmp_path / "train.csv"), "eval": str(tmp_path / "eval.csv"),
               "features": {"a": ["x0", "x1"], "b": ["x2", "x3", "x4"]},
               "targets": {"y1": "t1", "y2": "t2"}}
    data = mh.load_data(section, heads=HEADS)
    assert sorted(data.x_train) == ["a", "b"] and data.x_train["b"].shape == (100, 3)
    np.testing.assert_array_equal(data.x_eval["a"], x[100:, :2])
    runner = supervised.prepare(from_dict(_config(section)))
    assert sorted(runner.model.trunk.input) == ["a", "b"] if isinstance(runner.model.trunk.input, dict) \
        else True
    out = runner.model({k: v[:3] for k, v in data.x_eval.items()})
    assert out["y1"].shape == (3, 1)


def test_crlf_csv_reads_like_lf(tmp_path):
    x, y = _arrays()
    _write_csv(tmp_path / "lf.csv", x, y)
    (tmp_path / "crlf.csv").write_bytes((tmp_path / "lf.csv").read_bytes().replace(b"\n", b"\r\n"))
    cols = {"kind": "csv", "features": [f"x{i}" for i in range(D)], "targets": {"y1": "t1", "y2": "t2"}}
    a = mh.load_data({**cols, "train": str(tmp_path / "lf.csv")}, heads=HEADS)
    b = mh.load_data({**cols, "train": str(tmp_path / "crlf.csv")}, heads=HEADS)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_eval["y2"], b.y_eval["y2"])


def test_on_nan_drop_and_keep(tmp_path):
    x, y = _arrays()
    _write_csv(tmp_path / "d.csv", x, y, extra_rows=[",".join(["1"] * D + ["n", "", "2"])])
    base = {"kind": "csv", "train": str(tmp_path / "d.csv"), "eval": str(tmp_path / "d.csv"),
            "features": [f"x{i}" for i in range(D)], "targets": {"y1": "t1", "y2": "t2"}}
    with pytest.raises(ConfigError, match=r"data.on_nonfinite: data.train has NaN or inf in the "
                                          r"labels of 'y1' \(1 rows, first row 120: NaN\)"):
        mh.load_data(base, heads=HEADS)
    assert len(mh.load_data({**base, "on_nan": "drop"}, heads=HEADS).x_train) == N
    kept = mh.load_data({**base, "on_nan": "keep"}, heads=HEADS)
    assert len(kept.x_train) == N + 1 and np.isnan(kept.y_train["y1"][-1, 0])


def _bad_cases(tmp_path):
    x, y = _arrays()
    np.savez(tmp_path / "d.npz", x=x, **y)
    np.savez(tmp_path / "short.npz", x=x, y1=y["y1"][:-3], y2=y["y2"])
    np.savez(tmp_path / "text.npz", x=np.array(["a"] * N), **y)
    np.savez(tmp_path / "y1_only.npz", x=x, y1=y["y1"])
    _write_csv(tmp_path / "ragged.csv", x, y, extra_rows=["1,2,3"])
    _write_csv(tmp_path / "word.csv", x, y, extra_rows=[",".join(["1"] * D + ["n", "abc", "2"])])
    _write_csv(tmp_path / "nan.csv", x, y, extra_rows=[",".join(["1"] * (D - 1) + ["", "n", "1", "2"])])
    _write_tfrecord(tmp_path / "d.tfrecord", x, y)
    npz, csv_ = str(tmp_path / "d.npz"), str(tmp_path / "word.csv")
    cols = {"features": [f"x{i}" for i in range(D)], "targets": {"y1": "t1", "y2": "t2"}}
    return [
        ({"kind": "npz", "train": str(tmp_path / "nope.npz")}, "data.train: no such file"),
        ({"kind": "npz", "train": npz, "features": "z"}, "data.features: data.train"),
        ({"kind": "csv", "train": csv_, **cols, "targets": {"y1": "t9", "y2": "t2"}},
         "data.targets.y1: data.train"),
        ({"kind": "csv", "train": csv_, **cols}, "column 't1'"),
        ({"kind": "csv", "train": csv_, **cols, "dtypes": {"t1": "int32"}}, "data.dtypes.t1: column 't1'"),
        ({"kind": "npz", "train": str(tmp_path / "text.npz")}, "data.features ('x' in data.train"),
        ({"kind": "npz", "train": str(tmp_path / "y1_only.npz"), "targets": {"y1": "y1"}},
         "data.targets.y2: data.train"),  # y2 reads its default, array y2: there is none
        ({"kind": "npz", "train": npz, "targets": {"y1": "y1", "y2": "y2", "y3": "y1"}},
         "data.targets.y3: the model has no head 'y3'"),
        ({"kind": "python", "function": "my_data:extra_target"}, "data.train: the data has a target 'y3'"),
        ({"kind": "csv", "train": str(tmp_path / "ragged.csv"), **cols}, "(ragged rows)"),
        ({"kind": "npz", "train": str(tmp_path / "short.npz")}, "different lengths (ragged)"),
        ({"kind": "csv", "train": str(tmp_path / "nan.csv"), **cols},
         "data.on_nonfinite: data.train has NaN or inf in the inputs"),
        ({"kind": "tfrecord", "train": str(tmp_path / "d.tfrecord")}, "data.shapes.x"),
        ({"kind": "python", "function": "no_such_module:f"}, "data.function: cannot import"),
        ({"kind": "npz"}, "data.train: required for kind npz"),
        ({"kind": "npz", "train": npz, "holdout": 1.5}, "data.holdout: must be in (0, 1)"),
        ({"kind": "npz", "train": npz, "on_nan": "ignore"}, "data.on_nan: must be one of"),
    ]


def test_bad_input_exits_2_with_one_line_naming_the_key_and_writes_nothing(tmp_path, capsys, monkeypatch):
    _write_module(tmp_path, monkeypatch)
    for i, (data, message) in enumerate(_bad_cases(tmp_path)):
        config = tmp_path / f"c{i}.yaml"
        config.write_text(yaml.safe_dump(_config(data)))
        run_dir = tmp_path / f"run{i}"
        assert main(["train", str(config), "--run-dir", str(run_dir), "--quiet", "--allow-import",
                     "my_data", "--allow-import", "no_such_module"]) == 2, message
        err = capsys.readouterr().err.strip()
        assert err.startswith("multihead: error: ") and len(err.splitlines()) == 1, err
        assert message in err, (message, err)
        assert not run_dir.exists()


def test_a_csv_run_trains_and_records_its_inputs(tmp_path, monkeypatch):
    sources = _sources(tmp_path, monkeypatch)
    config = tmp_path / "csv.yaml"
    config.write_text(yaml.safe_dump(_config(sources["csv"])))
    assert run_experiment(str(config), run_dir=str(tmp_path / "run"), quiet=True).exit_code == 0
    import json

    assert json.loads((tmp_path / "run" / "inputs.json").read_text()) == \
        {"shape": [None, D], "dtype": "float32"}
    assert os.path.exists(tmp_path / "run" / "metrics.json")


def _write_marker_module(tmp_path, name):
    """A module that leaves a file behind when it is imported."""
    marker = tmp_path / f"{name}.imported"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import pathlib
        pathlib.Path({str(marker)!r}).write_text("imported")
        from my_data import arrays
    """))
    return marker


@pytest.mark.parametrize("command", ["validate", "train"])
def test_data_kind_python_needs_allow_import_and_imports_nothing_without_it(
        tmp_path, monkeypatch, capsys, command):
    _write_module(tmp_path, monkeypatch)
    name = f"marker_{command}"
    marker = _write_marker_module(tmp_path, name)
    monkeypatch.chdir(tmp_path)  # a module in the current directory is refused like any other
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config({"kind": "python", "function": f"{name}:arrays"},
                                             steps=2)))
    extra = ["--run-dir", str(tmp_path / "run"), "--quiet"] if command == "train" else ["--build"]
    assert main([command, str(config), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"data.function: '{name}:arrays' would import" in err
    assert f"--allow-import {name}" in err
    assert not marker.exists() and name not in sys.modules
    assert not (tmp_path / "run").exists()
    # another module allowed does not allow this one
    assert main([command, str(config), *extra, "--allow-import", "my_data"]) == 2
    assert not marker.exists()
    capsys.readouterr()
    assert main([command, str(config), *extra, "--allow-import", name]) == 0
    assert marker.exists()
    if command == "validate":  # the single-task baseline validates its config again
        from multihead.experiments.run.single_task import only_head

        raw = yaml.safe_load(config.read_text())
        baseline = only_head(from_dict(raw, allow_import=[name]), "y1", allow_import=[name])
        assert baseline.data.function == f"{name}:arrays" and list(baseline.model.heads) == ["y1"]
        with pytest.raises(ConfigError, match=f"--allow-import {name}"):
            only_head(from_dict(raw, allow_import=[name]), "y1")


def test_per_head_python_sections_and_the_api_need_allow_import(tmp_path, monkeypatch):
    _write_module(tmp_path, monkeypatch)
    marker = _write_marker_module(tmp_path, "marker_api")
    section = {"kind": "python", "function": "marker_api:arrays"}
    with pytest.raises(ConfigError, match=r"^data.function: 'marker_api:arrays' would import"):
        mh.load_data(section, heads=HEADS)
    raw = _config({"per_head": {"y1": section, "y2": {"kind": "python", "function": "my_data:arrays"}}})
    with pytest.raises(ConfigError, match=r"data.per_head.y1.function: 'marker_api:arrays'"):
        from_dict(raw, allow_import=["my_data"])
    assert not marker.exists()
    data = mh.load_data(section, heads=HEADS, allow_import=["marker_api"])
    np.testing.assert_array_equal(np.sort(np.concatenate([data.x_train, data.x_eval])[:, 0]),
                                  np.sort(_arrays()[0][:, 0]))
    assert marker.exists()


def test_sweep_needs_allow_import_and_passes_it_on_to_every_trial(tmp_path, monkeypatch, capsys):
    from multihead.experiments.sweep.sweep import trial_command

    _write_module(tmp_path, monkeypatch)
    marker = _write_marker_module(tmp_path, "marker_sweep")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config({"kind": "python", "function": "marker_sweep:arrays"},
                                             steps=2)))
    sweep_dir = tmp_path / "sweep"
    assert main(["sweep", str(config), "--grid", "seed=1,2", "--sweep-dir", str(sweep_dir),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-import marker_sweep" in err
    assert not marker.exists() and not sweep_dir.exists()
    command = trial_command("base.yaml", "trials/t000", {"seed": 1}, False, ("marker_sweep", "m2"))
    assert command[command.index("train"):] == [
        "train", "base.yaml", "--quiet", "--config-inside", ".", "--run-dir", "trials/t000", "--allow-import",
        "marker_sweep", "--allow-import", "m2", "--set", "seed=1"]


def test_a_python_data_run_is_loaded_only_with_its_module_allowed(tmp_path, monkeypatch, capsys):
    """`predict` and `mh.load_run` read the run's config.yaml, which a run directory from
    someone else could point at any module: the same flag as train."""
    _write_module(tmp_path, monkeypatch)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config({"kind": "python", "function": "my_data:arrays"},
                                             steps=2)))
    run = tmp_path / "run"
    assert run_experiment(str(config), run_dir=str(run), allow_import=["my_data"],
                          quiet=True).exit_code == 0
    x, _ = _arrays()
    np.savez(tmp_path / "new.npz", x=x[:5])
    out = tmp_path / "pred.npz"
    capsys.readouterr()
    assert main(["predict", str(run), "--data", str(tmp_path / "new.npz"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-import my_data" in err and not out.exists()
    with pytest.raises(ConfigError, match="data.function: 'my_data:arrays' would import"):
        mh.load_run(run)
    assert main(["predict", str(run), "--data", str(tmp_path / "new.npz"), "--out", str(out),
                 "--allow-import", "my_data"]) == 0
    loaded = mh.load_run(run, allow_import=["my_data"])
    np.testing.assert_array_equal(np.load(out)["y1"], loaded.model(x[:5])["y1"].numpy())


WINE_COLUMNS = ["alcohol", "malic_acid", "ash", "alcalinity_of_ash", "magnesium", "total_phenols",
                "flavanoids", "nonflavanoid_phenols", "proanthocyanins", "color_intensity", "hue",
                "od280_od315", "proline", "cultivar"]


def _write_wide_csv(path, columns, rows=8):
    lines = [",".join(columns)] + [",".join(str(float(i + j)) for j in range(len(columns)))
                                   for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def test_a_misspelt_column_lists_the_files_columns_and_suggests_the_close_one(tmp_path, capsys):
    _write_wide_csv(tmp_path / "wine.csv", WINE_COLUMNS)
    config = tmp_path / "wine.yaml"
    raw = _config({"kind": "csv", "train": str(tmp_path / "wine.csv")})
    raw["model"]["heads"] = {"alcohol": {}, "cultivar": {}}  # targets: the heads' own columns
    config.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(config), "--build", "--set", "data.features=[malic_acd,ash]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "data.features: " in err and "no column 'malic_acd' (did you mean 'malic_acid'?)" in err
    assert f"it has 14 columns: {WINE_COLUMNS}" in err  # the file's own, in its order


@pytest.mark.parametrize("kind", ["csv", "npz", "tfrecord"])
def test_the_list_of_a_wide_files_columns_is_bounded(tmp_path, kind):
    columns = [f"c{i}" for i in range(30)]
    path = tmp_path / f"wide.{kind}"
    if kind == "csv":
        _write_wide_csv(path, columns)
    elif kind == "npz":
        np.savez(path, **{c: np.arange(8.0) for c in columns})
    else:
        with tf.io.TFRecordWriter(str(path)) as writer:
            feature = {c: tf.train.Feature(float_list=tf.train.FloatList(value=[1.0])) for c in columns}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    with pytest.raises(ConfigError) as err:
        mh.load_data({"kind": kind, "train": str(path), "features": ["c1", "zz"],
                      "targets": {"y1": "c2", "y2": "c3"}}, heads=HEADS)
    message = str(err.value)
    listed = columns if kind == "csv" else sorted(columns)  # npz arrays, features: no order
    what = {"csv": "column", "npz": "array", "tfrecord": "feature"}[kind]
    assert message.startswith("data.features: ") and f"no {what} 'zz'" in message
    assert f"it has 30 {what}s: {listed[:20]} ... and 10 more" in message, message


def test_partial_targets_keep_the_other_heads_default_target(tmp_path):
    x, y = _arrays()
    np.savez(tmp_path / "d.npz", x=x, y1=y["y1"], other=y["y2"])
    data = mh.load_data({"kind": "npz", "train": str(tmp_path / "d.npz"),
                         "eval": str(tmp_path / "d.npz"), "targets": {"y2": "other"}}, heads=HEADS)
    np.testing.assert_array_equal(data.y_eval["y1"], y["y1"])  # y1 still reads array y1
    np.testing.assert_array_equal(data.y_eval["y2"], y["y2"])


def test_features_all_selects_exactly_the_other_columns(tmp_path, monkeypatch):
    """`features: all` on a CSV with a weight column: every column but the targets and the
    weights, in the file's order; the arrays equal those of the explicit list, and the run's
    config.yaml lists the columns, so predict reads the same inputs."""
    import json

    x, y = _arrays()
    cols = ["w"] + [f"x{i}" for i in range(D)] + ["t1", "t2"]
    rows = [",".join(cols)] + [",".join([f"{0.5 + (i % 2):.9g}"] + [f"{v:.9g}" for v in x[i]]
                                        + [f"{y['y1'][i, 0]:.9g}", f"{y['y2'][i, 0]:.9g}"])
                               for i in range(N)]
    (tmp_path / "w.csv").write_text("\n".join(rows) + "\n")
    base = {"kind": "csv", "train": str(tmp_path / "w.csv"), "targets": {"y1": "t1", "y2": "t2"},
            "sample_weights": {"y1": "w"}}
    every = mh.load_data({**base, "features": "all"}, HEADS)
    listed = mh.load_data({**base, "features": [f"x{i}" for i in range(D)]}, HEADS)
    np.testing.assert_array_equal(every.x_train, listed.x_train)
    np.testing.assert_array_equal(every.x_eval, listed.x_eval)
    assert every.x_train.shape[1] == D
    config = tmp_path / "all.yaml"
    config.write_text(yaml.safe_dump(_config({**base, "features": "all"}, steps=4)))
    run = tmp_path / "run"
    assert run_experiment(str(config), run_dir=str(run), quiet=True).exit_code == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["features"] == [f"x{i}" for i in range(D)]
    assert json.loads((run / "inputs.json").read_text())["shape"] == [None, D]
    assert main(["predict", str(run), "--data", str(tmp_path / "w.csv"), "--out", str(tmp_path / "p.npz")]) == 0
    # only targets and weights: nothing left to read
    (tmp_path / "only.csv").write_text("w,t1,t2\n1,2,3\n")
    with pytest.raises(ConfigError, match="data.features: all: .* has no column but the targets"):
        mh.load_data({**base, "train": str(tmp_path / "only.csv"), "features": "all"}, HEADS)
