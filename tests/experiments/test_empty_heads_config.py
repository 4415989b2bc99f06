"""A head with nothing to learn from in a split (every sample weight 0, or every label
missing) is refused by `multihead validate` and `train` with one line naming the head and
the key, exit 2, nothing written; `data.allow_empty_heads: [head]` runs it anyway.

Without the check such a head "trains": all-zero weights give an eval loss and MAE of 0
(reported as 0.000 of the baseline, a perfect fit), all-missing labels a NaN eval loss."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.config.schema import ConfigError, from_dict
from multihead.experiments.run import supervised

N, D = 32, 3


def _write(tmp_path, name, y2, w=None):
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal((N, D)).astype("float32")
    arrays = {"x": x, "y1": x[:, :1].copy(), "y2": y2.astype("float32")}
    if w is not None:
        arrays["w"] = w.astype("float32")
    np.savez(tmp_path / f"{name}.npz", **arrays)


def _config(tmp_path, **data):
    return {"model": {"trunk": {"mlp": {"units": [8]}},
                      "heads": {"y1": {}, "y2": {"metrics": ["mae"]}}},
            "data": {"kind": "npz", "train": str(tmp_path / "train.npz"),
                     "eval": str(tmp_path / "eval.npz"), **data},
            "train": {"steps": 2, "batch_size": 8}, "log": {"tensorboard": False}}


def _labels(missing=None):
    y = np.linspace(-1, 1, N)[:, None]
    if missing is not None:
        y[:] = missing
    return y


ONES, ZEROS = np.ones(N), np.zeros(N)

#: (id, train file (y2, w), eval file (y2, w), data keys, what the line names)
CASES = [
    ("zero weights in train", (_labels(), ZEROS), (_labels(), ONES), {"sample_weights": {"y2": "w"}},
     "data.sample_weights.y2: every sample weight of head 'y2' in data.train is 0"),
    ("zero weights in eval", (_labels(), ONES), (_labels(), ZEROS), {"sample_weights": {"y2": "w"}},
     "data.sample_weights.y2: every sample weight of head 'y2' in data.eval is 0"),
    ("every label NaN in train", (_labels(np.nan), None), (_labels(), None),
     {"missing_label": {"y2": "nan"}},
     "data.missing_label.y2: every label of head 'y2' in data.train is missing"),
    ("every label -1 in eval", (_labels(), None), (_labels(-1.0), None),
     {"missing_label": {"y2": -1}},
     "data.missing_label.y2: every label of head 'y2' in data.eval is missing"),
    ("weights only on missing rows", (_labels(), ONES),
     (np.where(np.arange(N)[:, None] % 2, np.nan, 0.5), np.arange(N) % 2),
     {"missing_label": {"y2": "nan"}, "sample_weights": {"y2": "w"}},
     "data.sample_weights.y2: every sample weight of the rows with a label of head 'y2' in "
     "data.eval is 0"),
]


def _files(tmp_path, train, evaluation):
    _write(tmp_path, "train", *train)
    _write(tmp_path, "eval", *evaluation)


@pytest.mark.parametrize("train, evaluation, data, line", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_head_with_nothing_to_learn_is_refused_by_validate_and_train(
        tmp_path, capsys, train, evaluation, data, line):
    _files(tmp_path, train, evaluation)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path, **data)))
    capsys.readouterr()
    assert main(["validate", str(path), "--build"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err and "data.allow_empty_heads" in err, err
    run_dir = tmp_path / "run"
    assert main(["train", str(path), "--run-dir", str(run_dir), "--quiet"]) == 2
    assert line in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.parametrize("train, evaluation, data", [c[1:4] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_allow_empty_heads_runs_such_a_head_anyway(tmp_path, train, evaluation, data):
    _files(tmp_path, train, evaluation)
    runner = supervised.prepare(from_dict(_config(tmp_path, allow_empty_heads=["y2"], **data)))
    assert set(runner.data.y_train) == {"y1", "y2"}


def test_the_held_out_eval_split_is_checked_too(tmp_path):
    y2 = _labels()
    y2[1:] = np.nan  # one labelled row: it lands in train or in the held-out eval, not both
    _write(tmp_path, "train", y2)
    raw = _config(tmp_path, missing_label={"y2": "nan"}, holdout=0.25)
    del raw["data"]["eval"]
    with pytest.raises(ConfigError, match=r"head 'y2' in (data\.train|the eval split \(held "
                                          r"out of data\.train\)) is missing"):
        supervised.prepare(from_dict(raw))


def test_allow_empty_heads_names_heads_of_the_model(tmp_path):
    _files(tmp_path, (_labels(), None), (_labels(), None))
    with pytest.raises(ConfigError, match=r"data\.allow_empty_heads\[0\]: the model has no head "
                                          r"'y3'"):
        from_dict(_config(tmp_path, allow_empty_heads=["y3"]))
