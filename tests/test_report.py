"""`multihead report`: numbers checked against the trainer's own results and the raw events."""

from __future__ import annotations

import collections
import glob
import itertools
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model
from multihead.experiments import cli
from multihead.monitoring.report import DPI, FIGSIZE, load_report

HEADS = ("a", "b", "c")
STEPS = 6


def _raw_scalars(log_dir: str) -> dict[str, dict[int, float]]:
    """tag -> step -> value, read with tf.data from the TFRecord files (not report.py)."""
    out: dict[str, dict[int, float]] = collections.defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                if array.ndim == 0 and array.dtype.kind == "f":
                    out[value.tag][event.step] = float(array)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run with heads a, b (every step) and c (every 2nd step), losses as returned."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    trainer = mh.Trainer(make_model(HEADS, seed=5),
                         {"a": mh.Objective("mse", "adam"), "b": mh.Objective("mse", "sgd"),
                          "c": mh.Objective("mae", "adam", every=2)},
                         log_dir=str(run_dir), log_every=1, histograms_every=0)
    losses = {h: {} for h in HEADS}
    for s in range(STEPS):
        result = trainer.step(make_batch(HEADS, seed=s))
        for head, loss in result.losses.items():
            losses[head][result.step] = loss
    evaluation = trainer.evaluate(make_batch(HEADS, n=32, seed=99))
    trainer.close()
    return str(run_dir), losses, evaluation


def _report_json(capsys, run_dir: str) -> dict:
    assert cli.main(["report", run_dir, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_report_matches_the_trainer_and_the_raw_events(run, capsys):
    run_dir, losses, evaluation = run
    data = _report_json(capsys, run_dir)
    raw = _raw_scalars(os.path.join(run_dir, "train"))
    assert list(data["heads"]) == list(HEADS)
    for head in HEADS:
        row = data["heads"][head]
        final_step = max(losses[head])
        best_step = min(losses[head], key=losses[head].get)
        assert (row["final_step"], row["best_step"]) == (final_step, best_step)
        np.testing.assert_allclose(row["final_loss"], losses[head][final_step], rtol=1e-6)
        np.testing.assert_allclose(row["best_loss"], losses[head][best_step], rtol=1e-6)
        np.testing.assert_allclose(row["eval_loss"], evaluation[head]["loss"], rtol=1e-6)
        for key, tag in (("mean_trunk_grad_norm", f"grad_norm/{head}/trunk"),
                         ("mean_head_grad_norm", f"grad_norm/{head}/head"),
                         ("mean_update_ratio", f"update_ratio/{head}")):
            np.testing.assert_allclose(row[key], np.mean(list(raw[tag].values())), rtol=1e-9)
    assert sorted(raw["grad_cosine/a/c"]) == [0, 2, 4]  # c is updated on even steps only
    for x, y in itertools.combinations(HEADS, 2):
        mean = np.mean(list(raw[f"grad_cosine/{x}/{y}"].values()))
        assert data["conflict"][x][y] == pytest.approx(mean, rel=1e-9)
        assert data["conflict"][y][x] == data["conflict"][x][y]       # symmetric
    assert [data["conflict"][h][h] for h in HEADS] == [1.0, 1.0, 1.0]


def test_text_report_has_one_row_per_head_and_the_conflict_matrix(run, capsys):
    run_dir, losses, _ = run
    assert cli.main(["report", run_dir]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("head "))
    assert "trunk grad norm" in lines[header] and "eval loss" in lines[header]
    assert [line.split()[0] for line in lines[header + 1:header + 4]] == list(HEADS)
    report = load_report(run_dir)
    matrix_row = next(line for line in lines if line.startswith("a ") and "+1.000" in line)
    assert f"{report.conflict['a']['b']:+.3f}" in matrix_row


def test_png_has_the_documented_size(run, tmp_path, capsys):
    run_dir, _, _ = run
    png = tmp_path / "report.png"
    assert cli.main(["report", run_dir, "--png", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI)) == (1500, 450)
    assert [p.name for p in tmp_path.iterdir()] == ["report.png"]  # no temporary file left


def test_head_without_trunk_gradient_has_no_conflict_entries(tmp_path, capsys):
    trainer = mh.Trainer(make_model(("a", "b")), {"a": mh.Objective("mse"),
                                                  "b": mh.Objective("mse", trains_trunk=False)},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0)
    trainer.step(make_batch(("a", "b")))
    trainer.close()
    data = _report_json(capsys, str(tmp_path))
    assert data["heads"]["b"]["mean_trunk_grad_norm"] is None
    assert data["conflict"]["a"]["b"] is None and data["conflict"]["b"]["b"] is None


@pytest.mark.parametrize("case", ["empty", "missing", "no_losses", "png_dir"])
def test_bad_run_dir_is_a_one_line_error_with_exit_code_2(tmp_path, capsys, case, run):
    target, args = tmp_path / "runs", []
    if case == "empty":
        target.mkdir()
        expected = "has no TensorBoard event files"
    elif case == "missing":
        expected = "does not exist"
    elif case == "no_losses":
        writer = tf.summary.create_file_writer(str(target / "train"))
        with writer.as_default(step=0):
            tf.summary.scalar("accuracy", 0.5)
        writer.close()
        expected = "no loss/<head> scalars"
    else:
        target = run[0]
        args = ["--png", str(tmp_path / "nowhere" / "r.png")]
        expected = "does not exist"
    assert cli.main(["report", str(target), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and expected in captured.err
    assert not (tmp_path / "nowhere").exists()
