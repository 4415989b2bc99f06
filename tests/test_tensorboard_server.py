"""A real TensorBoard server serves the per-head tags and values the Monitor wrote."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

import multihead as mh
from conftest import make_batch, make_model

HEADS = ("y1", "y2")
STARTUP_TIMEOUT_S = 90


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
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"tensorboard exited with code {proc.returncode}: "
                                 f"{log.read().decode(errors='replace')[-2000:]}")
        try:
            tags = _get(port, "/data/plugin/scalars/tags")
            if tag in tags.get("train", {}):
                return tags
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
            pass  # not listening yet
        time.sleep(0.5)
    raise AssertionError(f"tensorboard did not serve {tag!r} within {STARTUP_TIMEOUT_S} s")


def test_tensorboard_serves_per_head_tags_and_values(tmp_path):
    run = tmp_path / "run"
    trainer = mh.Trainer(make_model(HEADS), {"y1": mh.Objective("mse", "adam"),
                                             "y2": mh.Objective("mse", "sgd", every=2)},
                         log_dir=str(run), log_every=1, histograms_every=2)
    losses = {h: {} for h in HEADS}  # what the trainer returned, to compare with what is served
    for s in range(4):
        result = trainer.step(make_batch(HEADS, seed=s))
        for head, loss in result.losses.items():
            losses[head][result.step] = loss
    trainer.monitor.write_config("seed: 0\ntrain: {steps: 4}\n")
    trainer.close()

    port = _free_port()
    log = open(tmp_path / "tensorboard.log", "w+b")  # a file, not a pipe: it can never fill up
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(run), "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        tags = _wait_for_tags(port, proc, "grad_cosine/y1/y2", log)
        expected = {f"{kind}/{h}" for kind in ("loss", "lr", "update_ratio") for h in HEADS}
        expected |= {f"grad_norm/{h}/{part}" for h in HEADS for part in ("trunk", "head")}
        expected |= {"grad_cosine/y1/y2"}
        assert expected <= set(tags["train"])
        for head in HEADS:
            served = _get(port, "/data/plugin/scalars/scalars", run="train", tag=f"loss/{head}")
            steps = [int(step) for _, step, _ in served]
            assert steps == sorted(losses[head])  # y2 (every=2): steps 0 and 2 only
            np.testing.assert_allclose([value for _, _, value in served],
                                       [losses[head][s] for s in steps], rtol=1e-6)
        cosines = _get(port, "/data/plugin/scalars/scalars", run="train", tag="grad_cosine/y1/y2")
        assert [int(step) for _, step, _ in cosines] == [0, 2]
        assert all(-1.0 <= value <= 1.0 for _, _, value in cosines)
        histograms = _get(port, "/data/plugin/histograms/tags")["train"]
        assert any(tag.startswith("grad_hist/y1/") for tag in histograms)
        assert "config" in _get(port, "/data/plugin/text/tags")["train"]
        layout = _get(port, "/data/plugin/custom_scalars/layout")
        assert [category["title"] for category in layout["category"]] == list(HEADS)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()
