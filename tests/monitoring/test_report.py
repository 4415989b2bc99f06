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
from multihead.cli import main as cli
from multihead.monitoring import tags
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
            losses[head][result.step + 1] = loss  # logged at the number of updates done
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
    assert sorted(raw["grad_cosine/a/c"]) == [1, 3, 5]  # c is updated on every 2nd step only
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


def _write_scalars(log_dir, by_step: dict[int, dict[str, float]]) -> None:
    writer = tf.summary.create_file_writer(str(log_dir))
    for step, values in by_step.items():
        with writer.as_default(step=step):
            for tag, value in values.items():
                tf.summary.scalar(tag, value)
    writer.close()


def test_heads_and_pairs_are_read_through_the_tag_schema(tmp_path):
    """Heads come from `loss/<head>` only, pairs from `<kind>/<a>/<b>`; head names may hold `__`."""
    run = tmp_path / "run"
    _write_scalars(run / "train", {
        0: {tags.loss("x__y"): 1.0, tags.loss("z"): 2.0, tags.lr("z"): 0.1,
            tags.variable_grad_norm("z", "trunk/0/kernel"): 3.0,
            tags.trunk_grad_norm("x__y"): 1.0, tags.trunk_grad_norm("z"): 1.0,
            tags.grad_cosine("x__y", "z"): -0.5},
        1: {tags.loss("x__y"): 0.5, tags.loss("z"): 1.0, tags.grad_cosine("x__y", "z"): 0.1},
    })
    report = load_report(run)
    assert report.heads == ("x__y", "z")
    assert report.conflict["x__y"]["z"] == report.conflict["z"]["x__y"] == pytest.approx(-0.2)  # (-0.5+0.1)/2


def test_aggregated_trunk_conflict_comes_from_agg_cosine(tmp_path):
    """One trunk optimizer: no head logs a trunk gradient norm, the aggregation logs the cosines."""
    run = tmp_path / "run"
    _write_scalars(run / "train", {
        step: {tags.loss("a"): 1.0, tags.loss("b"): 1.0, tags.loss("c"): 1.0,
               tags.head_grad_norm("a"): 1.0, tags.agg_trunk_grad_norm("a"): 2.0,
               tags.agg_trunk_grad_norm("b"): 2.0, tags.agg_cosine("a", "b"): cos}
        for step, cos in ((0, -0.4), (1, -0.2))
    })
    report = load_report(run)
    assert report.conflict["a"]["b"] == report.conflict["b"]["a"] == pytest.approx(-0.3)  # (-0.4-0.2)/2
    assert report.conflict["a"]["a"] == report.conflict["b"]["b"] == 1.0
    assert report.conflict["c"]["c"] is None and report.conflict["a"]["c"] is None  # c: no trunk gradient


def _aggregated_run(tmp_path, capsys, objectives, aggregator):
    """Three logged steps under `aggregator`: (the raw train scalars, `report --json`)."""
    trainer = mh.Trainer(make_model(HEADS, seed=1), objectives, trunk={"aggregator": aggregator},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0)
    for s in range(3):
        trainer.step(make_batch(HEADS, seed=s))
    trainer.close()
    return _raw_scalars(str(tmp_path / "train")), _report_json(capsys, str(tmp_path))


def test_aggregated_trunk_run_reports_the_logged_cosines(tmp_path, capsys):
    """End to end with a trunk aggregator: the conflict matrix is the mean of the raw
    `agg_cosine/<a>/<b>` events the step wrote."""
    raw, data = _aggregated_run(tmp_path, capsys, {h: mh.Objective("mse") for h in HEADS}, "mean")
    for x, y in itertools.combinations(HEADS, 2):
        assert tags.agg_cosine(x, y) in raw, sorted(raw)
        mean = np.mean(list(raw[tags.agg_cosine(x, y)].values()))
        assert data["conflict"][x][y] == pytest.approx(mean, rel=1e-9)


def test_aggregated_run_reports_the_weights_and_why_the_trunk_norm_is_empty(tmp_path, capsys):
    """MGDA over a and b (c does not train the trunk): the aggregation weights, the norms fed
    to the aggregator and the aggregated norm are the means of the raw events, and each
    empty cell is explained."""
    raw, data = _aggregated_run(tmp_path, capsys,
                                {"a": mh.Objective("mse"), "b": mh.Objective("mse"),
                                 "c": mh.Objective("mse", trains_trunk=False)}, "mgda")
    mean = {tag: np.mean(list(raw[tag].values())) for tag in raw}
    for head in ("a", "b"):
        row = data["heads"][head]
        assert row["mean_agg_weight"] == pytest.approx(mean[tags.agg_weight(head)], rel=1e-9)
        assert row["mean_agg_trunk_grad_norm"] == pytest.approx(
            mean[tags.agg_trunk_grad_norm(head)], rel=1e-9)
        assert row["mean_trunk_grad_norm"] is None
    assert sum(data["heads"][h]["mean_agg_weight"] for h in "ab") == pytest.approx(1.0, abs=1e-5)
    assert data["heads"]["c"]["mean_agg_weight"] is None
    assert data["mean_agg_update_norm"] == pytest.approx(mean[tags.AGG_UPDATE_NORM], rel=1e-9)
    assert data["empty"]["trunk grad norm"]["a"].startswith("aggregated")
    assert "c" in data["empty"]["agg weight, agg trunk grad norm"]
    assert "trains_trunk=False" in data["empty"]["trunk grad norm"]["c"]

    assert cli.main(["report", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("head "))
    assert "agg weight" in header and "agg trunk grad norm" in header
    row_a = next(line for line in lines if line.startswith("a "))
    assert f"{mean[tags.agg_weight('a')]:.4g}" in row_a.split()
    assert any(line.startswith("trunk grad norm: -  for a, b: aggregated") for line in lines)
    assert any(line.startswith("trunk grad norm: -  for c: the head does not train the trunk")
               for line in lines)
    assert any(line.startswith("agg weight, agg trunk grad norm: -  for c: the head is not "
                               "aggregated") for line in lines)
    aggregated = next(line for line in lines if line.startswith("aggregated trunk gradient norm"))
    assert aggregated.endswith(f": {mean[tags.AGG_UPDATE_NORM]:.4g}")


def test_report_runs_without_tensorflow(run, capsys):
    """`multihead report` reads the events in Python (TensorBoard's protos): in a process
    where importing TensorFlow fails, it gives the same JSON as in this one."""
    import subprocess
    import sys

    run_dir = run[0]
    expected = _report_json(capsys, run_dir)
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from multihead.cli.main import main\n"
            f"code = main(['report', {str(run_dir)!r}, '--json'])\n"
            "assert 'tensorflow' not in sys.modules or sys.modules['tensorflow'] is None\n"
            "raise SystemExit(code)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == expected
