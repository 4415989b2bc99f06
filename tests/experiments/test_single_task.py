"""`multihead train CONFIG --only-head HEAD`: the single-task baseline of a multi-task config
trains exactly what a hand-written single-head config trains, on the same data."""

from __future__ import annotations

import json

import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError, from_dict
from multihead.experiments.run.single_task import only_head

TINY = {
    "seed": 3,
    "data": {"kind": "mmoe", "train_size": 256, "eval_size": 64, "input_dim": 8},
    "model": {
        "trunk": {"mlp": {"units": [8]}},
        "heads": {
            "y1": {"layers": {"class_name": "Dense", "config": {"units": 1}}, "metrics": ["mae"],
                   "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}}},
            "y2": {"layers": {"class_name": "Dense", "config": {"units": 1}},
                   "optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.05}}},
        },
    },
    "train": {"steps": 12, "batch_size": 32, "eval_every": 6,
              "trunk": {"aggregator": "pcgrad", "optimizer": "adam"}},
    "log": {"every": 6, "histograms_every": 0},
    "callbacks": {"reduce_lr_on_plateau": {"y1": {"factor": 0.5}, "y2": {"factor": 0.5}}},
}
TIMING = ("wall_time_s", "steps_per_s", "segments")  # measurements of time


def _numbers(run_dir) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {k: v for k, v in metrics.items() if k not in TIMING}


def test_only_head_trains_what_a_hand_written_single_head_config_trains(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    by_hand = {**TINY, "model": {**TINY["model"], "heads": {"y2": TINY["model"]["heads"]["y2"]}},
               "data": {**TINY["data"], "tasks": ["y1", "y2"]},  # the same generated data
               "train": {**TINY["train"], "trunk": "per_head"},
               "callbacks": {"reduce_lr_on_plateau": {"y2": {"factor": 0.5}}}}
    (tmp_path / "by_hand.yaml").write_text(yaml.safe_dump(by_hand))
    assert run_experiment(str(config),
                          run_dir=str(tmp_path / "only"), only_head="y2", quiet=True).exit_code == 0
    assert run_experiment(str(tmp_path / "by_hand.yaml"),
                          run_dir=str(tmp_path / "hand"), quiet=True).exit_code == 0
    assert run_experiment(str(config), run_dir=str(tmp_path / "multi"), quiet=True).exit_code == 0
    only, hand, multi = (_numbers(tmp_path / d) for d in ("only", "hand", "multi"))
    assert list(only["eval"]) == ["y2"]
    assert only == hand  # bitwise: every loss and metric of the run
    # the same eval labels as the multi-task run: the constant baseline is a function of them
    assert only["baseline"]["y2"] == multi["baseline"]["y2"]
    saved = yaml.safe_load((tmp_path / "only" / "config.yaml").read_text())
    assert list(saved["model"]["heads"]) == ["y2"] and saved["train"]["trunk"] == "per_head"


def test_only_head_keeps_the_head_and_names_bad_heads():
    config = from_dict(TINY)
    single = only_head(config, "y1")
    assert list(single.model.heads) == ["y1"]
    assert single.model.heads["y1"] == config.model.heads["y1"]
    assert [e.head for e in single.callbacks.reduce_lr_on_plateau] == ["y1"]
    assert list(config.model.heads) == ["y1", "y2"]  # the input is not changed
    with pytest.raises(ConfigError, match=r"--only-head 'y11': the model has no head 'y11' "
                                          r"\(did you mean 'y1'\?\)"):
        only_head(config, "y11")
    stopping = from_dict({**TINY, "callbacks": {"early_stopping": {"monitor": "eval/y2/loss"}}})
    with pytest.raises(ConfigError, match="callbacks.early_stopping.monitor is 'eval/y2/loss'"):
        only_head(stopping, "y1")


def test_cli_only_head_bad_head_exits_2_and_writes_nothing(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert main(["train", str(config), "--only-head", "y9", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--only-head 'y9'" in err and str(config) in err
    assert not (tmp_path / "r").exists()
