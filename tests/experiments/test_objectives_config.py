"""`objectives:` in a config: a standalone objective that reads two heads (ESMM's CTCVR),
a head with no loss of its own, trunk_scale; and their one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError, from_dict

N, D = 80, 4


def _data(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D)).astype(np.float32)
    ctr = (rng.random((N, 1)) < 0.5).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, ctr=ctr, ctcvr=ctr * (x[:, :1] > 0))
    return x


def _config(tmp_path, **changes):
    sigmoid = {"class_name": "Dense", "config": {"units": 1, "activation": "sigmoid"}}
    config = {
        "seed": 1,
        "data": {"kind": "npz", "train": str(tmp_path / "d.npz"), "holdout": 0.25,
                 "targets": {"ctr": "ctr", "ctcvr": "ctcvr"}},
        "model": {"trunk": {"mlp": {"units": [8]}},
                  "heads": {"ctr": {"layers": sigmoid, "loss": "binary_crossentropy"},
                            "cvr": {"layers": sigmoid, "loss": None}}},
        "objectives": {"ctcvr": {"loss": "binary_crossentropy", "reads": ["ctr", "cvr"],
                                 "combine": "product",
                                 "trains": ["trunk", "heads/ctr", "heads/cvr"]}},
        "train": {"steps": 4, "batch_size": 8}, "log": {"tensorboard": False},
    }
    for path, value in changes.items():
        *keys, last = path.split(".")
        node = config
        for key in keys:
            node = node[key]
        if value is None and last != "loss":
            node.pop(last)
        else:
            node[last] = value
    return config


def test_a_standalone_objective_trains_and_is_evaluated_from_a_config(tmp_path):
    x = _data(tmp_path)
    path = tmp_path / "esmm.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path)))
    assert run_experiment(str(path), run_dir=str(tmp_path / "run")).exit_code == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["eval"]) >= {"ctr", "ctcvr"} and "cvr" not in metrics["eval"]
    from multihead.experiments.run.load import load_run
    model = load_run(tmp_path / "run").model
    out = model.predict(x)
    assert np.all((out["cvr"] > 0) & (out["cvr"] < 1))
    assert np.isfinite(metrics["eval"]["ctcvr"]["loss"])


@pytest.mark.parametrize("changes,message", [
    ({"objectives.ctcvr.reads": ["ctr", "cvx"]},
     "objectives.ctcvr.reads\\[1\\]: the model has no head 'cvx'"),
    ({"objectives.ctcvr.combine": None}, "objectives.ctcvr.combine: missing"),
    ({"objectives.ctcvr.trains": ["trunk", "heads/ctr"]},
     "model.heads.cvr.loss: null, and no objective trains the head"),
    ({"objectives.ctcvr.trains": ["trunk", "heads/zz"]},
     "objectives.ctcvr.trains\\[1\\]: unknown part 'heads/zz'"),
    ({"objectives.ctr": {"loss": "mse", "reads": ["ctr"]}},
     "objectives.ctr: 'ctr' is a head"),
    ({"model.heads.ctr.trunk_scale": "x"}, "model.heads.ctr.trunk_scale"),
])
def test_bad_objective_configs_get_one_line_naming_the_key(tmp_path, changes, message):
    _data(tmp_path)
    with pytest.raises(ConfigError, match=message) as err:
        from_dict(_config(tmp_path, **changes))
    assert "\n" not in str(err.value)


def test_an_aggregation_rule_names_a_standalone_objectives_own_key(tmp_path):
    # Trunk aggregation needs every objective that trains the trunk updated every step:
    # the error names objectives.ctcvr.every, not a head's key.
    _data(tmp_path)
    config = _config(tmp_path, **{"objectives.ctcvr.every": 2})
    config["train"]["trunk"] = {"optimizer": "adam", "aggregator": "mgda"}
    with pytest.raises(ConfigError, match="objectives.ctcvr.every") as err:
        from_dict(config)
    assert "\n" not in str(err.value)
