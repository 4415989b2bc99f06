"""What a finished `multihead train` run shows: one step axis for train and eval scalars, the
last step logged, and every head's metrics (with the constant predictor's baseline) in the
end-of-run table, `metrics.json` and `multihead report`, equal to numpy."""

import contextlib
import io
import json
import re

import numpy as np
import pytest

import multihead as mh
from multihead.cli.main import main
from multihead.monitoring.report import format_report, load_report, read_scalars

STEPS, LOG_EVERY, EVAL_EVERY = 23, 5, 10  # the last step is no multiple of either

CONFIG = f"""\
seed: 2
data: {{kind: npz, train: ROOT/train.npz, eval: ROOT/eval.npz, features: x, targets: {{r: r, c: c}}}}
model:
  trunk: {{mlp: {{units: [8], activation: relu}}}}
  heads:
    r: {{layers: [{{class_name: Dense, config: {{units: 1}}}}], loss: mse, metrics: [mae],
        optimizer: {{class_name: Adam, config: {{learning_rate: 0.01}}}}}}
    c: {{layers: [{{class_name: Dense, config: {{units: 3}}}}],
        loss: {{class_name: SparseCategoricalCrossentropy, config: {{from_logits: true}}}},
        metrics: [accuracy], optimizer: {{class_name: Adam, config: {{learning_rate: 0.01}}}}}}
train: {{steps: {STEPS}, batch_size: 16, eval_every: {EVAL_EVERY}}}
log: {{every: {LOG_EVERY}, histograms_every: 0}}
checkpoint: {{every: 0}}
"""


def _data(rng, n):
    x = rng.normal(size=(n, 4)).astype("float32")
    r = (x[:, :1] * 2 + rng.normal(size=(n, 1))).astype("float32")
    c = rng.choice(3, size=n, p=[0.5, 0.3, 0.2]).astype("int32")
    return {"x": x, "r": r, "c": c}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("summary")
    rng = np.random.default_rng(0)
    train, evaluation = _data(rng, 96), _data(rng, 40)
    np.savez(root / "train.npz", **train)
    np.savez(root / "eval.npz", **evaluation)
    (root / "exp.yaml").write_text(CONFIG.replace("ROOT", str(root)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", str(root / "exp.yaml"), "--run-dir", str(root / "run"),
                     "--quiet"]) == 0
    return root / "run", train, evaluation, out.getvalue()


def _numpy_metrics(run_dir, data):
    """Each head's loss and metric on `data`, from the final weights, in numpy."""
    outputs = mh.load_run(str(run_dir)).model.predict(data["x"])
    r, logits = np.asarray(outputs["r"], np.float64), np.asarray(outputs["c"], np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return {"r": {"loss": np.mean((r - data["r"]) ** 2),
                  "mean_absolute_error": np.mean(np.abs(r - data["r"]))},
            "c": {"loss": -np.mean(log_p[np.arange(len(data["c"])), data["c"]]),
                  "accuracy": np.mean(np.argmax(logits, axis=1) == data["c"])}}


def _numpy_baseline(train, evaluation):
    """The constant predictor's values: the train mean for MSE (its MAE on eval), the log
    prior for the cross-entropy (the majority class's accuracy)."""
    mean = train["r"].mean()
    prior = np.bincount(train["c"], minlength=3) / len(train["c"])
    return {"r": {"loss": np.mean((evaluation["r"] - mean) ** 2),
                  "mean_absolute_error": np.mean(np.abs(evaluation["r"] - mean))},
            "c": {"loss": -np.mean(np.log(prior[evaluation["c"]])),
                  "accuracy": np.mean(evaluation["c"] == np.argmax(prior))}}


def test_train_and_eval_scalars_share_the_step_axis_and_the_last_step_is_logged(run):
    run_dir = run[0]
    train, evals = read_scalars(str(run_dir / "train")), read_scalars(str(run_dir / "eval"))
    # The number of updates done: the first update, every LOG_EVERY-th and the last.
    assert list(train["loss/r"].steps) == [1, 5, 10, 15, 20, STEPS]
    assert list(evals["loss/r"].steps) == [10, 20, STEPS]
    assert train["loss/c"].steps[-1] == evals["accuracy/c"].steps[-1] == STEPS


def test_metrics_json_names_each_quantity_and_equals_numpy(run):
    run_dir, train, evaluation, _ = run
    metrics = json.loads((run_dir / "metrics.json").read_text())
    expected = _numpy_metrics(run_dir, evaluation)
    on_train = _numpy_metrics(run_dir, train)
    baseline = _numpy_baseline(train, evaluation)
    logged = read_scalars(str(run_dir / "train"))
    for head in ("r", "c"):
        for name, value in expected[head].items():
            np.testing.assert_allclose(metrics["eval"][head][name], value, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(metrics["final_train"][head][name], on_train[head][name],
                                       rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(metrics["baseline"][head][name], baseline[head][name],
                                       rtol=2e-3)
        # train/loss: the loss of the last logged batch, at the last step
        assert metrics["train"][head] == {"loss": logged[f"loss/{head}"].values[-1], "step": STEPS}
    assert metrics["evals"][-1] == {"step": STEPS, "eval": metrics["eval"]}


def _table_rows(text):
    """{(head, metric): the row's cells} of the end-of-run table."""
    rows = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 5 and cells[0] in ("r", "c"):
            rows[(cells[0], cells[1])] = cells
    return rows


def test_end_table_shows_every_metric_with_its_baseline(run):
    run_dir, train, evaluation, stdout = run
    expected = _numpy_metrics(run_dir, evaluation)
    on_train = _numpy_metrics(run_dir, train)
    baseline = _numpy_baseline(train, evaluation)
    rows = _table_rows(stdout)
    assert set(rows) == {("r", "loss"), ("r", "mean_absolute_error"), ("c", "loss"),
                         ("c", "accuracy")}
    for (head, name), cells in rows.items():
        _, _, shown_eval, shown_train, batch, shown_base, versus = cells
        assert float(shown_eval) == pytest.approx(expected[head][name], rel=1e-3)
        assert float(shown_train) == pytest.approx(on_train[head][name], rel=1e-3)
        assert float(shown_base) == pytest.approx(baseline[head][name], rel=3e-3)
        # "better than the constant baseline by x%", whichever way the metric improves
        value, base = expected[head][name], baseline[head][name]
        better = 100 * ((value - base) if name == "accuracy" else (base - value)) / abs(base)
        percent, word = versus.split("% ")
        assert float(percent) == pytest.approx(better, abs=0.3)
        assert word == ("better" if better >= 0 else "worse")
        assert (batch.endswith(f"@{STEPS}")) == (name == "loss")


def test_report_shows_every_metric_of_the_last_evaluation_with_its_baseline(run):
    run_dir, train, evaluation, _ = run
    expected = _numpy_metrics(run_dir, evaluation)
    baseline = _numpy_baseline(train, evaluation)
    report = load_report(str(run_dir))
    for head in ("r", "c"):
        summary = report.summaries[head]
        assert summary.eval_step == STEPS and summary.final_step == STEPS
        assert list(summary.eval_metrics) == list(expected[head])  # the loss first
        for name, value in expected[head].items():
            np.testing.assert_allclose(summary.eval_metrics[name], value, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(summary.baseline[name], baseline[head][name], rtol=2e-3)
    text = format_report(report)
    for head, name in (("r", "mean_absolute_error"), ("c", "accuracy")):
        line = next(line for line in text.splitlines()
                    if re.match(rf"{head}\s+{STEPS}\s+{name}\s", line))
        shown = float(line.split()[3])
        assert shown == pytest.approx(expected[head][name], rel=1e-3)
