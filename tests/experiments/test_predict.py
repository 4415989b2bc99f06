"""Prediction and finished runs: model/trainer predict, `.keras` round trip, `mh.load_run`
reproducing metrics.json, `multihead predict` and `multihead export` on a CSV run with
named inputs."""

import csv
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

import multihead as mh
from conftest import make_batch, make_model
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment

D = 5


def test_predict_returns_every_head_in_order_and_equals_the_inference_call():
    model = make_model(seed=1, dropout=0.5)
    trainer = mh.Trainer(model, {h: mh.Objective("mse") for h in "ab"})
    trainer.step(make_batch())
    x, y = make_batch(n=37, seed=4)
    expected = model(x, training=False)
    out = model.predict(x, batch_size=8)
    assert list(out) == ["a", "b"]
    for h in "ab":
        assert isinstance(out[h], np.ndarray) and out[h].shape == (37, 1)
        np.testing.assert_allclose(out[h], expected[h].numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(trainer.predict((x, y), batch_size=8)["a"], out["a"])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    np.testing.assert_array_equal(trainer.predict(dataset, heads=["b"])["b"], out["b"])
    assert list(trainer.predict(x, heads=["b"])) == ["b"]
    with pytest.raises(ValueError, match="predict\\(heads=...\\) names head 'z'"):
        model.predict(x, heads=["z"])


@pytest.mark.parametrize("named", [False, True])
def test_keras_file_round_trip_gives_equal_outputs(tmp_path, named):
    keras.utils.set_random_seed(0)
    if named:
        inputs = {"u": keras.Input((2,), name="u"), "v": keras.Input((3,), name="v")}
        joined = keras.layers.Concatenate()([inputs["u"], inputs["v"]])
        trunk = keras.Model(inputs, keras.layers.Dense(8, activation="relu")(joined))
        shape = {"u": (None, 2), "v": (None, 3)}
        x = {"u": np.random.default_rng(0).standard_normal((6, 2)).astype("float32"),
             "v": np.random.default_rng(1).standard_normal((6, 3)).astype("float32")}
    else:
        trunk = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.2)])
        shape = (None, 4)
        x = np.random.default_rng(0).standard_normal((6, 4)).astype("float32")
    model = mh.MultiHeadModel(trunk, {"a": keras.layers.Dense(1),
                                      "b": keras.Sequential([keras.layers.Dense(3)])}, name="mine")
    model.build(shape)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, mh.MultiHeadModel) and loaded.head_names == ("a", "b")
    assert loaded.name == "mine"
    for h, value in model.predict(x).items():
        np.testing.assert_array_equal(loaded.predict(x)[h], value)
    # the partition is computed afresh on the loaded objects
    assert [v.shape for v in loaded.var_list("b")] == [v.shape for v in model.var_list("b")]


def _csv_run(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, D)).astype(np.float32)
    y1, y2 = x[:, :2].sum(1), np.cos(x[:, 4])
    lines = ["a0,a1,b0,b1,b2,t1,t2"] + [",".join(f"{v:.9g}" for v in [*x[i], y1[i], y2[i]])
                                        for i in range(len(x))]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    config = {
        "seed": 1,
        "data": {"kind": "csv", "train": str(tmp_path / "d.csv"), "holdout": 0.25,
                 "features": {"a": ["a0", "a1"], "b": ["b0", "b1", "b2"]},
                 "targets": {"y1": "t1", "y2": "t2"}},
        "model": {"trunk": {"mlp": {"units": [16]}},
                  "heads": {"y1": {"metrics": ["mae"]}, "y2": {}}},
        "train": {"steps": 40, "batch_size": 16, "eval_every": 20},
        "log": {"every": 10, "histograms_every": 0},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert run_experiment(str(tmp_path / "c.yaml"),
                          run_dir=str(tmp_path / "run"), quiet=True).exit_code == 0
    return tmp_path / "run", x


def test_finished_csv_run_with_named_inputs(tmp_path, capsys):
    run_dir, x = _csv_run(tmp_path)
    metrics = json.loads((run_dir / "metrics.json").read_text())

    # load_run + the run's Trainer reproduce metrics.json's final evaluation exactly
    run = mh.load_run(run_dir, trainer=True)
    assert run.checkpoint.endswith("final") and run.trainer.global_step == 40
    data = mh.load_data(yaml.safe_load((run_dir / "config.yaml").read_text())["data"],
                        heads=["y1", "y2"], seed=1)
    assert run.trainer.evaluate(data.eval, batch_size=16, log=False) == metrics["eval"]
    assert mh.load_run(run_dir, checkpoint="ckpt-40").checkpoint.endswith("ckpt-40")

    # multihead predict on a CSV laid out as the training data equals model.predict
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "d.csv"),
                 "--out", str(tmp_path / "p.npz"), "--heads", "y2"]) == 0
    with np.load(tmp_path / "p.npz") as saved:
        assert saved.files == ["y2"]
        inputs = {"a": x[:, :2], "b": x[:, 2:]}
        np.testing.assert_array_equal(saved["y2"], run.model.predict(inputs)["y2"])
    np.savez(tmp_path / "in.npz", a=x[:, :2], b=x[:, 2:])
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "in.npz"),
                 "--out", str(tmp_path / "q.npz")]) == 0
    with np.load(tmp_path / "q.npz") as saved:
        np.testing.assert_array_equal(saved["y1"], run.model.predict(inputs)["y1"])

    # bad input: exit 2, one line, nothing written
    capsys.readouterr()
    for args, message in [(["--data", str(tmp_path / "none.csv")], "--data: no such file"),
                          (["--data", str(tmp_path / "in.npz"), "--heads", "zz"], "--heads 'zz'"),
                          (["--data", str(tmp_path / "in.npz"), "--checkpoint", "ckpt-7"],
                           "checkpoint 'ckpt-7': not found")]:
        assert main(["predict", str(run_dir), "--out", str(tmp_path / "bad.npz")] + args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
        assert not (tmp_path / "bad.npz").exists()

    # export: one named argument per input, outputs equal the model's
    assert main(["export", str(run_dir), str(tmp_path / "export")]) == 0
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    assert sorted(loaded.signatures) == ["serving_default", "y1", "y2"]
    served = loaded.signatures["y1"](a=tf.constant(x[:7, :2]), b=tf.constant(x[:7, 2:]))
    assert list(served) == ["y1"]
    np.testing.assert_allclose(served["y1"].numpy(), run.model.predict({k: v[:7] for k, v in
                                                                         inputs.items()})["y1"],
                               rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def per_head_run(tmp_path_factory):
    """A finished run whose head y1 reads an .npz and y2 (three classes) a .csv with the same
    four inputs: (its directory, the inputs)."""
    tmp_path = tmp_path_factory.mktemp("per_head")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((120, 4)).astype(np.float32)
    np.savez(tmp_path / "y1.npz", x=x, y1=x.sum(1))
    rows = [",".join(f"{v:.9g}" for v in row) + f",{int(row[0] > 0) + int(row[1] > 0)}" for row in x]
    (tmp_path / "y2.csv").write_text("\n".join(["f0,f1,f2,f3,cls"] + rows) + "\n")
    config = {
        "seed": 2,
        "data": {"per_head": {
            "y1": {"kind": "npz", "train": str(tmp_path / "y1.npz"), "holdout": 0.25},
            "y2": {"kind": "csv", "train": str(tmp_path / "y2.csv"), "holdout": 0.25,
                   "features": ["f0", "f1", "f2", "f3"], "targets": {"y2": "cls"}}}},
        "model": {"trunk": {"mlp": {"units": [8]}},
                  "heads": {"y1": {},
                            "y2": {"layers": {"class_name": "Dense", "config": {"units": 3}},
                                   "loss": {"class_name": "SparseCategoricalCrossentropy",
                                            "config": {"from_logits": True}}}}},
        "train": {"steps": 6, "batch_size": 16, "eval_every": 3},
        "log": {"every": 3, "histograms_every": 0},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert run_experiment(str(tmp_path / "c.yaml"),
                          run_dir=str(tmp_path / "run"), quiet=True).exit_code == 0
    return tmp_path / "run", x


def test_predict_a_per_head_run_of_two_file_kinds_to_csv_and_npz(per_head_run, tmp_path, capsys):
    run_dir, x = per_head_run
    data = run_dir.parent
    expected = mh.load_run(run_dir).model.predict(x)
    # a CSV laid out as y2's training file, written as CSV: columns by head, y2 has three
    assert main(["predict", str(run_dir), "--data", str(data / "y2.csv"),
                 "--out", str(tmp_path / "p.csv")]) == 0
    with open(tmp_path / "p.csv", newline="") as fh:
        table = list(csv.reader(fh))
    assert table[0] == ["y1", "y2_0", "y2_1", "y2_2"] and len(table) == 1 + len(x)
    values = np.array(table[1:], dtype=np.float64).astype(np.float32)  # 9 digits: float32 exact
    np.testing.assert_array_equal(values[:, :1], expected["y1"])
    np.testing.assert_array_equal(values[:, 1:], expected["y2"])
    # an .npz laid out as y1's training file (array x), one head, as .npz
    assert main(["predict", str(run_dir), "--data", str(data / "y1.npz"), "--heads", "y2",
                 "--out", str(tmp_path / "p.npz")]) == 0
    with np.load(tmp_path / "p.npz") as saved:
        assert saved.files == ["y2"]
        np.testing.assert_array_equal(saved["y2"], expected["y2"])
    capsys.readouterr()
    assert main(["predict", str(run_dir), "--data", str(data / "y1.npz"),
                 "--out", str(tmp_path / "p.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "written as .npz or .csv" in err
    assert not (tmp_path / "p.txt").exists()


def test_status_predict_and_export_name_the_end_checkpoint_alike(per_head_run, tmp_path, capsys):
    """The run ends with `checkpoints/final` (and a periodic `ckpt-6` of the same step, for
    resume): status.json, predict and export all name the one they use, `checkpoints/final`."""
    run_dir, _ = per_head_run
    assert json.loads((run_dir / "status.json").read_text())["checkpoint"] == "checkpoints/final"
    capsys.readouterr()
    assert main(["predict", str(run_dir), "--data", str(run_dir.parent / "y1.npz"),
                 "--out", str(tmp_path / "p.npz")]) == 0
    assert capsys.readouterr().out.strip().endswith("(checkpoint checkpoints/final)")
    assert main(["export", str(run_dir), str(tmp_path / "export")]) == 0
    assert " from checkpoint checkpoints/final (signatures: " in capsys.readouterr().out
    assert main(["predict", str(run_dir), "--data", str(run_dir.parent / "y1.npz"),
                 "--checkpoint", "ckpt-6", "--out", str(tmp_path / "q.npz")]) == 0
    assert capsys.readouterr().out.strip().endswith("(checkpoint checkpoints/ckpt-6)")


def test_every_checkpoint_name_the_tool_prints_is_accepted_back(tmp_path, capsys):
    """status.json, metrics.json (per-head bests), predict and export print checkpoint names
    relative to the run directory; `--checkpoint` and `load_run` take each of them back and
    load exactly that checkpoint."""
    config = {"seed": 0, "data": {"kind": "mmoe", "train_size": 128, "eval_size": 32, "input_dim": 4},
              "model": {"trunk": {"mlp": {"units": [8]}}, "heads": {"y1": {}, "y2": {}}},
              "train": {"steps": 6, "batch_size": 16, "eval_every": 2},
              "log": {"every": 3, "histograms_every": 0},
              "callbacks": {"best_checkpoint": {"per_head": True}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    assert run_experiment(str(tmp_path / "c.yaml"), run_dir=str(run), quiet=True).exit_code == 0
    metrics = json.loads((run / "metrics.json").read_text())
    printed = [json.loads((run / "status.json").read_text())["checkpoint"], "checkpoints/ckpt-6"]
    printed += [best["path"] for best in metrics["head_best_checkpoints"].values()]
    assert "best/y1/best-" in printed[2]
    np.savez(tmp_path / "x.npz", x=np.ones((3, 4), np.float32))
    for name in printed:
        loaded = mh.load_run(run, checkpoint=name)
        reader = tf.train.load_checkpoint(str(run / name))
        kernel = loaded.model.head_variables("y1")[0]  # heads/y1 is one Dense layer
        np.testing.assert_array_equal(kernel.numpy(),
                                      reader.get_tensor("heads/y1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"))
        capsys.readouterr()
        assert main(["predict", str(run), "--data", str(tmp_path / "x.npz"), "--checkpoint", name,
                     "--out", str(tmp_path / "p.npz")]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.strip().endswith(f"(checkpoint {name})")
