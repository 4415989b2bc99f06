"""A real TensorBoard server serves the per-head tags and values the Monitor wrote, and a
resumed run's steps once, with both of its loaders (Python and the Rust data server)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import keras
import numpy as np
import pytest
from conftest import make_batch, make_model

import multihead as mh

HEADS = ("y1", "y2")
STARTUP_TIMEOUT_S = 240  # a loaded 2-core machine has taken over 90 s to start one


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(port: int, path: str, **params: str):
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}{query}", timeout=10) as response:
        return json.loads(response.read())


def _wait_for_tags(port: int, proc: subprocess.Popen, tag: str, log) -> dict:
    """Polls the scalars tag listing until the train run's `tag` is loaded."""
    return _wait_until(port, proc, log, lambda: _get(port, "/data/plugin/scalars/tags"),
                       lambda tags: tag in tags.get("train", {}), f"the tag {tag!r}")


def _wait_until(port: int, proc: subprocess.Popen, log, fetch, done, what: str):
    """Polls `fetch()` until `done(result)`, while the server runs, for at most STARTUP_TIMEOUT_S."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    result = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"tensorboard exited with code {proc.returncode}: "
                                 f"{log.read().decode(errors='replace')[-2000:]}")
        try:
            result = fetch()
            if done(result):
                return result
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError, KeyError):
            pass  # not listening yet, or the run not loaded yet
        time.sleep(0.5)
    raise AssertionError(f"tensorboard did not serve {what} within {STARTUP_TIMEOUT_S} s "
                         f"(last answer: {result!r})")


@contextlib.contextmanager
def _tensorboard(logdir, tmp_path, *flags: str):
    """A TensorBoard server on a free 127.0.0.1 port: yields (port, process, log); always stopped."""
    port = _free_port()
    with open(tmp_path / "tensorboard.log", "w+b") as log:  # a file, not a pipe: it never fills up
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
             "--port", str(port), *flags],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            yield port, proc, log
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


def test_tensorboard_serves_per_head_tags_and_values(tmp_path):
    run = tmp_path / "run"
    trainer = mh.Trainer(make_model(HEADS), {"y1": mh.Objective("mse", "adam"),
                                             "y2": mh.Objective("mse", "sgd", every=2)},
                         log_dir=str(run), log_every=1, histograms_every=2)
    losses = {h: {} for h in HEADS}  # what the trainer returned, to compare with what is served
    for s in range(4):
        result = trainer.step(make_batch(HEADS, seed=s))
        for head, loss in result.losses.items():
            losses[head][result.step + 1] = loss  # logged at the number of updates done
    trainer.monitor.write_config("seed: 0\ntrain: {steps: 4}\n")
    trainer.close()

    with _tensorboard(run, tmp_path) as (port, proc, log):
        tags = _wait_for_tags(port, proc, "grad_cosine/y1/y2", log)
        expected = {f"{kind}/{h}" for kind in ("loss", "lr", "update_ratio") for h in HEADS}
        expected |= {f"grad_norm/{h}/{part}" for h in HEADS for part in ("trunk", "head")}
        expected |= {"grad_cosine/y1/y2"}
        assert expected <= set(tags["train"])
        for head in HEADS:
            served = _get(port, "/data/plugin/scalars/scalars", run="train", tag=f"loss/{head}")
            steps = [int(step) for _, step, _ in served]
            assert steps == sorted(losses[head])  # y2 (every=2): steps 1 and 3 only
            np.testing.assert_allclose([value for _, _, value in served],
                                       [losses[head][s] for s in steps], rtol=1e-6)
        cosines = _get(port, "/data/plugin/scalars/scalars", run="train", tag="grad_cosine/y1/y2")
        assert [int(step) for _, step, _ in cosines] == [1, 3]
        assert all(-1.0 <= value <= 1.0 for _, _, value in cosines)
        histograms = _get(port, "/data/plugin/histograms/tags")["train"]
        assert any(tag.startswith("grad_hist/y1/") for tag in histograms)
        assert "config" in _get(port, "/data/plugin/text/tags")["train"]
        layout = _get(port, "/data/plugin/custom_scalars/layout")
        assert [category["title"] for category in layout["category"]] == list(HEADS)


def _served(port: int, run: str, tag: str) -> list[tuple[int, float]]:
    return [(int(step), value) for _, step, value in
            _get(port, "/data/plugin/scalars/scalars", run=run, tag=tag)]


def _last_step(points: list[tuple[int, float]]) -> int | None:
    return max((step for step, _ in points), default=None)


@pytest.mark.parametrize("load_fast", ["false", "true"])  # the Python loader; the Rust data server
def test_a_resumed_run_shows_each_step_once(tmp_path, load_fast):
    """A run stopped at step 17 (checkpoint at 10) and resumed to 20 shows steps 1..20 once
    (TensorBoard's step is the number of updates done; `History.train` keys the update by the
    step counter it was taken at, one less).

    The stopped run evaluated at 5, 10, 15 and 17; the resumed one evaluates every
    10 steps, so the eval run must show 5, 10 and 20: the evaluations after the
    checkpoint belong to the lost run.
    """
    logs, data = tmp_path / "logs", make_batch(HEADS, n=40, seed=7)

    def run(steps, eval_every, restore):
        keras.utils.set_random_seed(0)
        trainer = mh.Trainer(make_model(HEADS, seed=1),
                             {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in HEADS},
                             log_dir=str(logs), log_every=1, histograms_every=0)
        manager = mh.CheckpointManager(tmp_path / "ckpt", trainer.model, trainer, every=10)
        if restore:
            assert manager.restore_latest() == 10
        history = trainer.fit(data, steps, batch_size=8, eval_data=data, eval_every=eval_every,
                              verbose=False, checkpoints=manager)
        trainer.close()  # the stopped run's events after step 10 reach the disk, as before a crash
        return dict(history.train["y1"])

    stopped = run(17, eval_every=5, restore=False)
    resumed = run(10, eval_every=10, restore=True)
    expected = {**{s: v for s, v in stopped.items() if s < 10}, **resumed}
    assert sorted(expected) == list(range(20))

    with _tensorboard(logs, tmp_path, f"--load_fast={load_fast}", "--reload_interval=1") as (
            port, proc, log):
        served = _wait_until(port, proc, log, lambda: _served(port, "train", "loss/y1"),
                             lambda points: _last_step(points) == 20, "train steps up to 20")
        evals = _wait_until(port, proc, log, lambda: _served(port, "eval", "loss/y1"),
                            lambda points: _last_step(points) == 20, "the eval at step 20")
    assert [s for s, _ in served] == list(range(1, 21))  # each step once, in order
    np.testing.assert_allclose([v for _, v in served], [expected[s - 1] for s in range(1, 21)],
                               rtol=1e-6)
    assert [s for s, _ in evals] == [5, 10, 20]


# -- Custom Scalars: every chart has a line --------------------------------------------


def _trunk_gradients(model, batch):
    """Each head's gradient of its MSE on the trunk variables, flattened (float64), by hand."""
    import tensorflow as tf

    x, y = batch
    with tf.GradientTape(persistent=True) as tape:
        out = model(x)
        losses = {h: tf.reduce_mean(tf.square(y[h] - out[h])) for h in y}
    return {h: np.concatenate([g.numpy().astype(np.float64).ravel()
                               for g in tape.gradient(loss, model.trunk_variables)])
            for h, loss in losses.items()}


def _mgda_weights(ga, gb):
    # min over w in [0, 1] of |w g_a + (1 - w) g_b|^2: w = (g_b - g_a).g_b / |g_a - g_b|^2, clipped
    w = float(np.clip((gb - ga) @ gb / ((ga - gb) @ (ga - gb)), 0.0, 1.0))
    return [w, 1.0 - w]


def _pcgrad_weights(ga, gb):
    # Two conflicting gradients, each projected once onto the other's normal plane:
    # d = (1 - g_a.g_b / |g_a|^2) g_a + (1 - g_a.g_b / |g_b|^2) g_b
    dot = ga @ gb
    return [1 - dot / (ga @ ga), 1 - dot / (gb @ gb)]


@pytest.mark.parametrize("rule", ["per_head", "mgda", "pcgrad"])
def test_every_custom_scalars_chart_has_a_line(tmp_path, rule):
    """Each chart of the served layout matches a tag of the train run, one tag per chart, and
    an aggregated run's section serves the aggregation weights computed by hand for the first
    update (logged at step 1)."""
    heads = ("y1", "y2") if rule != "per_head" else ("y1", "y2", "y3")
    x, y = make_batch(heads, seed=3)
    y["y2"] = -y["y1"]  # opposite targets: the trunk gradients conflict (PCGrad projects both)
    model = make_model(heads, seed=2)
    by_hand = _trunk_gradients(model, (x, y))  # at the weights step 0 starts from
    run = tmp_path / "run"
    objectives = {h: mh.Objective("mse", "sgd") for h in heads}
    if rule == "per_head":
        objectives["y3"] = mh.Objective("mse", keras.optimizers.SGD(clipnorm=0.1))
    trainer = mh.Trainer(model, objectives, trunk=None if rule == "per_head" else {"aggregator": rule},
                         log_dir=str(run), log_every=2, histograms_every=0)
    for _ in range(3):
        trainer.step((x, y))
    trainer.close()

    with _tensorboard(run, tmp_path) as (port, proc, log):
        layout = _wait_until(port, proc, log, lambda: _get(port, "/data/plugin/custom_scalars/layout"),
                             lambda served: served.get("category"), "the Custom Scalars layout")
        charts = [(c["title"], chart) for c in layout["category"] for chart in c["chart"]]
        for section, chart in charts:
            (regex,) = chart["multiline"]["tag"]  # one line per chart: no two lines share a colour
            served = _get(port, "/data/plugin/custom_scalars/scalars", run="train", tag=regex)
            assert list(served["tag_to_events"]), (section, chart["title"])
            (tag,) = served["tag_to_events"]
            assert tag in chart["title"]  # the title names its line
        sections = [c["title"] for c in layout["category"]]
        weights = {h: _served(port, "train", f"agg_weight/{h}") for h in heads if rule != "per_head"}
    if rule == "per_head":
        assert sections == list(heads)
        titles = {c["title"] for _, c in charts}
        assert {"y1, y3: trunk gradient cosine (grad_cosine/y1/y3)",
                "y3: trunk gradient norm after clipping (grad_norm_clipped/y3/trunk)"} <= titles
        return
    assert sections == list(heads) + ["trunk aggregation"]
    titles = {c["title"] for s, c in charts if s == "trunk aggregation"}
    assert {"aggregated trunk gradient norm (agg_update_norm)", "y1: aggregation weight (agg_weight/y1)",
            "y1, y2: trunk gradient cosine fed to the aggregator (agg_cosine/y1/y2)"} <= titles
    assert ("PCGrad projections (agg_projections)" in titles) == (rule == "pcgrad")
    expected = (_mgda_weights if rule == "mgda" else _pcgrad_weights)(by_hand["y1"], by_hand["y2"])
    # logged after update 1 (the first, taken at the weights by_hand saw) and update 2
    assert [s for s, _ in weights["y1"]] == [1, 2]
    np.testing.assert_allclose([weights[h][0][1] for h in heads], expected, rtol=1e-4)
