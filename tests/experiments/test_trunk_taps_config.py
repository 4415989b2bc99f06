"""`model.taps` in a config: a tapped head trains as `multihead train` runs it, the blocks it
trains are reported, and bad taps fail with the key path."""

import json
import os

import numpy as np
import pytest

from conftest import assert_train_refuses
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.build.builders import build_model
from multihead.experiments.config.schema import ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "trunk_taps.yaml")
TINY = ["train.steps=4", "train.eval_every=4", "train.batch_size=16", "data.train_size=64",
        "data.eval_size=32", "log.tensorboard=false"]


@pytest.mark.parametrize("trunk", ["per_head", "{aggregator: mgda}"])
def test_a_tapped_head_trains_from_a_config(trunk, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_experiment(CONFIG, run_dir=str(run_dir),
                          overrides=TINY + [f"train.trunk={trunk}"]).exit_code == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 4
    assert all(np.isfinite(m["loss"]) for m in metrics["eval"].values())
    err = capsys.readouterr().err
    assert "trunk blocks:\nhead  trunk blocks trained\ny1    block1, block2, block3\ny2    block1\n" in err


def test_config_taps_build_the_tapped_var_list():
    model = build_model(load_config(CONFIG, overrides=["model.taps.y2=1"]), (None, 100))
    assert model.taps == {"y2": "block2"}
    blocks = model.trunk.layers
    assert [id(v) for v in model.var_list("y2")] == [id(v) for v in (
        blocks[0].trainable_variables + blocks[1].trainable_variables
        + model.heads["y2"].trainable_variables)]


@pytest.mark.parametrize("override, message", [
    ("model.taps.y2=block7", "model.taps.y2: the trunk has no block 'block7' (did you mean "
                             "'block3'?); its blocks are ['block1', 'block2', 'block3']"),
    ("model.taps.y3=block1", "model.taps.y3: the model has no head 'y3'"),
    ("train.trunk={aggregator: mgda, rep_grad: true}",
     "train.trunk.rep_grad: train.trunk.rep_grad: true combines the heads' gradients at one shared trunk "
     "output, but heads ['y2'] read trunk taps"),
])
def test_bad_taps_are_refused_with_the_key_path(override, message, tmp_path, capsys):
    assert_train_refuses(CONFIG, override, message, tmp_path, capsys)


def test_taps_need_a_trunk_of_blocks():
    config = load_config(CONFIG, overrides=["model.trunk={mlp: {units: [8]}}", "model.taps.y2=0"])
    build_model(config, (None, 100))  # an mlp is a Sequential of Dense blocks: index taps work
    config = load_config(CONFIG, overrides=["model.trunk={class_name: Dense, config: {units: 8}}"])
    with pytest.raises(ConfigError, match=r"^model.taps.y2: trunk taps need a trunk built from "
                                          r"named blocks \(a keras.Sequential\), but the trunk is a Dense$"):
        build_model(config, (None, 100))
