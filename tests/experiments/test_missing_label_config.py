"""`data.missing_label: {head: nan}`: NaN-marked label columns of npz and csv files train, and
the evaluation of that head is numpy's over the rows with a label."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import multihead as mh
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError, from_dict
from multihead.experiments.run import supervised

HEADS = ("y1", "y2")
N, D = 60, 4


def _files(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D)).astype(np.float32)
    y = {"y1": (x @ rng.standard_normal((D, 1))).astype(np.float32),
         "y2": np.sin(x[:, :1]).astype(np.float32)}
    y["y2"][rng.random(N) < 0.4] = np.nan  # 40% of y2's labels missing
    np.savez(tmp_path / "d.npz", x=x, **y)
    lines = [",".join([f"x{i}" for i in range(D)] + ["y1", "y2"])]
    for i in range(N):
        label = "" if np.isnan(y["y2"][i, 0]) else f"{y['y2'][i, 0]:.9g}"  # an empty cell: NaN
        lines.append(",".join([f"{v:.9g}" for v in x[i]] + [f"{y['y1'][i, 0]:.9g}", label]))
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    return x, y


def _config(data, **extra):
    return {"model": {"trunk": {"mlp": {"units": [8]}},
                      "heads": {h: {"metrics": ["mae"]} for h in HEADS}},
            "data": {"missing_label": {"y2": "nan"}, "holdout": 0.25, **data}, "seed": 1,
            "train": {"steps": 6, "batch_size": 8, "eval_every": 6}, "log": {"tensorboard": False},
            **extra}


def test_a_nan_marked_npz_column_trains_and_evaluates_over_present_rows(tmp_path):
    _files(tmp_path)
    runner = supervised.prepare(from_dict(_config({"kind": "npz", "train": str(tmp_path / "d.npz")})))
    assert np.isnan(runner.objectives["y2"].missing_label)
    trainer = mh.Trainer(runner.model, runner.objectives)
    trainer.fit(runner.data.train, 6, batch_size=8, seed=0, verbose=False)
    x, y = runner.data.eval
    assert np.isnan(y["y2"]).any()
    ev = trainer.evaluate((x, y), batch_size=5)
    pred = runner.model(x, training=False)["y2"].numpy()[:, 0]
    present = ~np.isnan(y["y2"][:, 0])
    error = pred[present] - y["y2"][present, 0]
    np.testing.assert_allclose(ev["y2"]["loss"], np.mean(error ** 2), rtol=1e-6)
    np.testing.assert_allclose(ev["y2"]["mean_absolute_error"], np.mean(np.abs(error)), rtol=1e-6)
    assert all(np.isfinite(v.numpy()).all() for v in runner.model.weights)


def test_a_nan_marked_csv_column_trains_from_a_config(tmp_path):
    _files(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config({
        "kind": "csv", "train": str(tmp_path / "d.csv"),
        "features": [f"x{i}" for i in range(D)]})))
    assert run_experiment(str(config), run_dir=str(tmp_path / "run"), quiet=True).exit_code == 0
    text = (tmp_path / "run" / "metrics.json").read_text()
    assert "NaN" not in text and json.loads(text)


def test_without_the_marker_nan_labels_are_refused_and_a_bad_marker_is_named(tmp_path):
    _files(tmp_path)
    raw = _config({"kind": "npz", "train": str(tmp_path / "d.npz")})
    raw["data"]["missing_label"] = {}
    with pytest.raises(ConfigError, match="data.on_nonfinite"):
        supervised.prepare(from_dict(raw))
    raw["data"]["missing_label"] = {"y2": "none"}
    with pytest.raises(ConfigError, match="data.missing_label.y2: expected nan or a number"):
        from_dict(raw)
    raw["data"]["missing_label"] = {"y9": "nan"}
    with pytest.raises(ConfigError, match="data.missing_label.y9: the model has no head"):
        from_dict(raw)
