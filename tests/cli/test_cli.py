"""The `multihead` command: train writes a complete run; bad input exits 2 and writes nothing."""

import json
import re
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "experiments", "quickstart.yaml")
SMALL = ["--set", "data.train_size=2000", "--set", "data.eval_size=500", "--set", "train.steps=30",
         "--set", "model.trunk.mlp.units=[16]"]
SMALL_SETS = SMALL[1::2]  # the same overrides, for run_experiment
TINY = {
    "seed": 0,
    "data": {"kind": "mmoe", "train_size": 64, "eval_size": 32, "input_dim": 6},
    "model": {
        "trunk": {"mlp": {"units": [4]}},
        "heads": {h: {"layers": {"class_name": "Dense", "config": {"units": 1}}} for h in ("y1", "y2")},
    },
    "train": {"steps": 4, "batch_size": 32, "eval_every": 2},
    "log": {"every": 2, "histograms_every": 0},
}


def test_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "multihead", "--help"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for command in ["train", "validate", "export", "predict", "report"]:
        assert command in out


def test_quickstart_trains_well_below_the_constant_baseline(tmp_path):
    """The quickstart config, shortened, through the real console script."""
    run_dir = tmp_path / "run"
    exe = os.path.join(os.path.dirname(sys.executable), "multihead")
    cmd = [exe if os.path.exists(exe) else "multihead", "train", QUICKSTART, "--run-dir", str(run_dir),
           "--set", "train.steps=1500", "--set", "train.eval_every=500", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 1500
    for head in ["y1", "y2"]:
        assert metrics["eval"][head]["loss"] < 0.25 * metrics["baseline"][head]["loss"]
        assert head in out.stdout  # the summary table
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["train"]["steps"] == 1500
    assert (run_dir / "checkpoints" / "final.index").exists()
    assert list((run_dir / "train").glob("events.*")) and list((run_dir / "eval").glob("events.*"))


def test_validate_checks_the_config_and_builds_with_build_without_writing(tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", QUICKSTART]) == 0
    out = capsys.readouterr().out
    assert ": ok (" in out and "the data, the model and a first step were not built (--build" in out
    assert "parameters:" not in out  # no model
    assert main(["validate", QUICKSTART, "--build"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"the data, the model and a first step built and checked in \d+\.\d s", out)
    assert "parameters:" in out
    assert os.listdir(tmp_path) == []


def test_validate_and_train_show_the_parameters_of_the_trunk_and_each_head(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    # trunk: Dense 6 -> 4, 6*4 + 4 = 28; each head: Dense 4 -> 1, 4 + 1 = 5; nothing frozen
    expected = [["trunk", "28", "0"], ["head", "y1", "5", "0"], ["head", "y2", "5", "0"],
                ["total", "38", "0"]]

    def table(text: str) -> list[list[str]]:
        lines = text.splitlines()
        start = lines.index("parameters:") + 2  # the line, then the table's header
        return [line.split() for line in lines[start:start + 4]]

    assert main(["validate", str(config), "--build"]) == 0
    assert table(capsys.readouterr().out) == expected
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    assert table(capsys.readouterr().err) == expected


@pytest.mark.parametrize("overrides,message", [
    (["train.stesp=3"], "train.stesp: unknown key (did you mean 'steps'?)"),
    (["train.steps=abc"], "train.steps: expected an integer"),
    (["model.heads.y1.loss=msee"], "model.heads.y1.loss: head 'y1': unknown loss 'msee'"),
    (["model.heads.y1.optimizer=adamm"], "unknown optimizer 'adamm'"),
    (["model.trunk={class_name: Dnse}"], "model.trunk.class_name: unknown Keras layer 'Dnse'"),
    (["data.tasks=[y1]"], "model.heads.y2: the data has no task 'y2'"),
    (["bad"], "expected KEY.PATH=VALUE"),
    (["train.epochs=2"], "train.epochs: give train.steps or train.epochs, not both"),
    (["train.steps=null", "train.epochs=0"], "train.epochs: must be >= 1"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, overrides, message):
    run_dir = tmp_path / "run"
    args = ["train", QUICKSTART, "--run-dir", str(run_dir)]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multihead: error: ") and len(err.splitlines()) == 1
    assert message in err
    assert QUICKSTART in err or "--set 'bad'" in err
    assert not run_dir.exists()


def test_train_epochs_runs_ceil_rows_over_batch_steps_each_and_shows_the_epoch(tmp_path, capsys):
    run_dir = tmp_path / "run"
    # 300 rows, batch 128: ceil(300 / 128) = 3 steps an epoch, 6 for 2 epochs.
    assert run_experiment(QUICKSTART, run_dir=str(run_dir), overrides=[
        "data.train_size=300", "data.eval_size=100", "model.trunk.mlp.units=[16]",
        "train.steps=null", "train.epochs=2"]).exit_code == 0
    assert json.loads((run_dir / "metrics.json").read_text())["steps"] == 6
    assert "epoch 2/2  step 6/6" in capsys.readouterr().err
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]
    assert (saved["steps"], saved["epochs"]) == (None, 2)


def test_missing_config_file_and_non_empty_run_dir(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read the config" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert main(["train", QUICKSTART, "--run-dir", str(tmp_path / "full")] + SMALL) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert os.listdir(tmp_path / "full") == ["keep.txt"]


def test_seeded_runs_are_reproducible(tmp_path):
    finals = []
    for name in ["a", "b"]:
        assert run_experiment(QUICKSTART, run_dir=str(tmp_path / name), overrides=SMALL_SETS,
                              quiet=True).exit_code == 0
        finals.append(json.loads((tmp_path / name / "metrics.json").read_text())["eval"])
    assert finals[0] == finals[1]
    assert np.isfinite(finals[0]["y1"]["loss"])


def test_config_trunk_aggregation_reaches_the_trainer(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = os.path.join(ROOT, "experiments", "aggregation_pcgrad.yaml")
    run_dir = tmp_path / "run"
    assert run_experiment(config, run_dir=str(run_dir), overrides=SMALL_SETS, quiet=True).exit_code == 0
    events = EventAccumulator(str(run_dir / "train"))
    events.Reload()
    tags = events.Tags()["tensors"]
    assert "agg_projections" in tags and "agg_weight/y1" in tags  # PCGrad ran
    assert "grad_norm/y1/trunk" not in tags  # heads no longer update the trunk themselves


def test_xla_run_without_tensorboard(tmp_path):
    run_dir = tmp_path / "run"
    overrides = ["train.jit_compile=true", "log.tensorboard=false", *SMALL_SETS]
    assert run_experiment(QUICKSTART, run_dir=str(run_dir), overrides=overrides, quiet=True).exit_code == 0
    assert (run_dir / "metrics.json").exists() and not (run_dir / "train").exists()
