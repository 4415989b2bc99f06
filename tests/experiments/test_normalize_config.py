"""`data.normalize: standard`: the training split's per-feature statistics equal sklearn's
`StandardScaler` fitted on that split, the run records them, and every way back to the model
(`predict`, `load_run`, `export`, a `.keras` file) applies them: its outputs on raw inputs
equal the trunk and heads applied to sklearn-scaled inputs."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from sklearn.preprocessing import StandardScaler

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError, from_dict
from multihead.experiments.run import supervised

HEADS = ("y1", "y2")


def _arrays(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal([10.0, -300.0, 0.0, 5.0], [2.0, 80.0, 1e-2, 1.0], (rows, 4)).astype(np.float32)
    x[:, 3] = 5.0  # constant in the training split: scale 1, no NaN
    y = {"y1": (x[:, :1] / 2.0).astype(np.float32), "y2": (x[:, 1:2] / 80.0).astype(np.float32)}
    return x, y


def _config(tmp_path, **data):
    return {"model": {"trunk": {"mlp": {"units": [8], "activation": "tanh"}},
                      "heads": {h: {} for h in HEADS}},
            "data": {"kind": "npz", "train": str(tmp_path / "train.npz"),
                     "eval": str(tmp_path / "eval.npz"), "normalize": "standard", **data},
            "seed": 1, "train": {"steps": 6, "batch_size": 8, "eval_every": 6},
            "log": {"tensorboard": False}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("normalize")
    x, y = _arrays(40, seed=0)
    x_eval, y_eval = _arrays(16, seed=1)
    x_eval[:, 3] = 9.0  # the eval split differs: the statistics must not read it
    np.savez(tmp / "train.npz", x=x, **y)
    np.savez(tmp / "eval.npz", x=x_eval, **y_eval)
    (tmp / "c.yaml").write_text(yaml.safe_dump(_config(tmp)))
    assert run_experiment(str(tmp / "c.yaml"), run_dir=str(tmp / "run"), quiet=True).exit_code == 0
    return tmp, StandardScaler().fit(x), x_eval


def _scaled_forward(model, scaled):
    """The trunk and heads on already scaled inputs: the model without its preprocess."""
    feats = model.trunk(tf.constant(scaled, tf.float32))
    return {h: model.heads[h](feats).numpy() for h in HEADS}


def test_the_recorded_statistics_equal_standard_scaler_on_the_train_split(run):
    tmp, scaler, _ = run
    record = json.loads((tmp / "run" / "inputs.json").read_text())["normalize"]
    np.testing.assert_allclose(record["mean"], scaler.mean_, rtol=1e-12)
    np.testing.assert_allclose(record["scale"], scaler.scale_, rtol=1e-12)
    assert record["scale"][3] == 1.0
    assert yaml.safe_load((tmp / "run" / "config.yaml").read_text())["data"]["normalize"] == "standard"


def test_predict_load_run_keras_files_and_exports_apply_the_scaling(run, capsys):
    tmp, scaler, x = run
    loaded = mh.load_run(tmp / "run")
    expected = _scaled_forward(loaded.model, scaler.transform(x))
    # the constant training feature is 9 here, 4 away from its mean: x - mean, no blow-up
    assert np.isfinite(scaler.transform(x)).all()
    for head in HEADS:
        np.testing.assert_allclose(loaded.model.predict(x)[head], expected[head], rtol=1e-5, atol=1e-6)
    np.savez(tmp / "in.npz", x=x)
    assert main(["predict", str(tmp / "run"), "--data", str(tmp / "in.npz"),
                 "--out", str(tmp / "p.npz")]) == 0
    with np.load(tmp / "p.npz") as saved:
        for head in HEADS:
            np.testing.assert_allclose(saved[head], expected[head], rtol=1e-5, atol=1e-6)
    loaded.model.save(str(tmp / "m.keras"))
    from_file = keras.models.load_model(str(tmp / "m.keras"))
    assert main(["export", str(tmp / "run"), str(tmp / "export")]) == 0
    served = tf.saved_model.load(str(tmp / "export"))(tf.constant(x))
    for head in HEADS:
        np.testing.assert_allclose(from_file.predict(x)[head], expected[head], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(served[head].numpy(), expected[head], rtol=1e-5, atol=1e-6)


def test_resume_refuses_changed_statistics(run, capsys):
    """(Last of the tests on `run`: it rewrites the run's training file.)"""
    tmp, _, _ = run
    assert run_experiment(str(tmp / "c.yaml"), resume=str(tmp / "run"), overrides=["train.steps=8"],
                          quiet=True).exit_code == 0  # the same data: resumes
    x, y = _arrays(40, seed=5)  # other training data under the same file name
    np.savez(tmp / "train.npz", x=x, **y)
    assert main(["train", str(tmp / "c.yaml"), "--resume", str(tmp / "run"), "--quiet",
                 "--set", "train.steps=12"]) == 2
    assert "data.normalize: the training split's statistics differ" in capsys.readouterr().err


@pytest.mark.parametrize("data, message", [
    ({"normalize": "minmax"}, "data.normalize: must be one of ['standard']"),
    ({"normalize": True, "per_head": {"y1": {"kind": "mmoe"}, "y2": {"kind": "mmoe"}},
      "kind": "mmoe", "train": None, "eval": None}, "data.normalize: not supported with data.per_head"),
])
def test_bad_normalize_keys_are_refused(tmp_path, data, message):
    raw = _config(tmp_path, **data)
    raw["data"] = {k: v for k, v in raw["data"].items() if v is not None}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_dict(raw)


def test_true_means_standard_and_a_holdout_split_is_scaled_by_its_train_rows(tmp_path):
    x, y = _arrays(50, seed=2)
    np.savez(tmp_path / "train.npz", x=x, **y)
    raw = _config(tmp_path, normalize=True)
    del raw["data"]["eval"]  # a holdout of train: the statistics read the rows kept for training
    runner = supervised.prepare(from_dict(raw))
    scaler = StandardScaler().fit(runner.data.x_train)
    assert len(runner.data.x_train) < len(x)
    np.testing.assert_allclose(runner.standardization.mean, scaler.mean_, rtol=1e-12)
    np.testing.assert_allclose(runner.standardization.scale, scaler.scale_, rtol=1e-12)
