"""What `Trainer` refuses, `multihead validate` refuses first: each of the Trainer's refusals
of names and schedules, written as a config, exits 2 with one line naming the key, and
`from_dict` raises it. `--only-head` drops what the kept head does not need (trunk taps of
dropped heads), so `validate --only-head` and `train --only-head` agree."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import yaml

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.config.schema import ConfigError, from_dict
from multihead.experiments.run.single_task import only_head

INF_SCHEDULE = {"class_name": "ExponentialDecay",
                "config": {"initial_learning_rate": float("inf"), "decay_steps": 10,
                           "decay_rate": 0.5}}


def _files(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4)).astype("float32")
    np.savez(tmp_path / "d.npz", x=x, y1=x[:, :1], y2=x[:, 1:2])


def _config(tmp_path, objective_name=None, **patch):
    raw = {"model": {"trunk": {"mlp": {"units": [8]}}, "heads": {"y1": {}, "y2": {}}},
           "data": {"kind": "npz", "train": str(tmp_path / "d.npz")},
           "train": {"steps": 2, "batch_size": 8}, "log": {"tensorboard": False}}
    if objective_name is not None:  # a standalone objective; its labels read column y1
        raw["objectives"] = {objective_name: {"reads": ["y1", "y2"], "combine": "sum"}}
        raw["data"]["targets"] = {objective_name: "y1"}
    for key, value in patch.items():
        node = raw
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return raw


def _model():
    return mh.MultiHeadModel(keras.layers.Dense(8), {"y1": keras.layers.Dense(1),
                                                     "y2": keras.layers.Dense(1)})


def _trainer_with(name=None, trunk="per_head", schedule="simultaneous", **objective):
    objectives = {"y1": mh.Objective("mse", **objective), "y2": mh.Objective("mse")}
    if name is not None:
        objectives[name] = mh.Objective("mse", reads=["y1", "y2"], combine="sum")
    return mh.Trainer(_model(), objectives, trunk=trunk, schedule=schedule)


BAD_NAMES = ["../x", "a/b", "", "a\nb", "ab\n"]

#: (id, the Trainer's refusal in Python, the same input as config keys, a word the line names)
REFUSALS = [
    *[(f"objective name {n!r}", lambda n=n: _trainer_with(name=n), {"objective_name": n},
       "objectives") for n in BAD_NAMES],
    ("weight schedule with inf", lambda: _trainer_with(weight=INF_SCHEDULE),
     {"model.heads.y1.weight": INF_SCHEDULE}, "model.heads.y1.weight"),
    ("trunk_scale schedule with inf", lambda: _trainer_with(trunk_scale=INF_SCHEDULE),
     {"model.heads.y1.trunk_scale": INF_SCHEDULE}, "model.heads.y1.trunk_scale"),
    ("unknown schedule", lambda: _trainer_with(schedule="sequental"),
     {"train.schedule": "sequental"}, "train.schedule"),
    ("aggregated trunk with the sequential schedule",
     lambda: _trainer_with(trunk={"aggregator": "mean"}, schedule="sequential"),
     {"train.trunk": {"aggregator": "mean"}, "train.schedule": "sequential"}, "sequential"),
]


@pytest.mark.parametrize("refused, patch, named", [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_validate_refuses_what_the_trainer_refuses_with_one_line(tmp_path, capsys, refused,
                                                                 patch, named):
    with pytest.raises((ValueError, TypeError)):
        refused()
    _files(tmp_path)
    raw = _config(tmp_path, **patch)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        from_dict(raw)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err


def test_an_objective_name_with_a_trailing_newline_is_refused_by_the_trainer():
    with pytest.raises(ValueError, match="objective name 'ab\\\\n' is not allowed"):
        _trainer_with(name="ab\n")


def _tapped(tmp_path):
    _files(tmp_path)
    raw = _config(tmp_path)
    raw["model"]["trunk"] = [{"class_name": "Dense", "config": {"units": 8}},
                             {"class_name": "Dense", "config": {"units": 8}}]
    return raw


def test_only_head_drops_the_trunk_taps_of_the_dropped_heads(tmp_path):
    raw = _tapped(tmp_path)
    raw["model"]["taps"] = {"y2": 0}
    assert only_head(from_dict(raw), "y1").model.taps == {}
    raw["model"]["taps"] = {"y1": 0, "y2": 1}
    assert only_head(from_dict(raw), "y1").model.taps == {"y1": 0}


def test_validate_only_head_checks_the_baseline_train_only_head_trains(tmp_path, capsys):
    raw = _tapped(tmp_path)
    raw["model"]["taps"] = {"y2": 0}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(path), "--only-head", "y1"]) == 0
    assert "heads y1," in capsys.readouterr().out
    assert main(["validate", str(path), "--only-head", "y3"]) == 2
    assert "--only-head 'y3': the model has no head 'y3'" in capsys.readouterr().err


@pytest.mark.parametrize("marker", [1e300, -1e39, float("inf")])
def test_a_missing_label_beyond_float32_names_the_key_and_the_range(tmp_path, capsys, marker):
    _files(tmp_path)
    raw = _config(tmp_path, **{"data.missing_label": {"y2": marker}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "data.missing_label.y2: must be nan or a number in [-3.4028235e+38, 3.4028235e+38]" \
        in err, err
    with pytest.raises(ValueError, match=r"Objective.missing_label: must be nan or a number in"):
        mh.Objective("mse", missing_label=marker)
