"""Shared fixtures: small deterministic models and batches."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import multihead as mh  # noqa: E402

# TensorFlow, Keras and multihead leave ~400k objects after import, which every full garbage
# collection would scan again; tracing hundreds of graphs triggers many such collections.
# Freezing them (they live as long as the process anyway) took tests/core from 276 s to
# 232 s on two workers (`-p` a gc.callbacks counter: 38-42 s per worker in gc before, 20-24 s after).
gc.collect()
gc.freeze()


def make_model(heads=("a", "b"), seed: int = 0, input_dim: int = 5, width: int = 8,
               dropout: float = 0.0) -> mh.MultiHeadModel:
    """A small built model; equal seeds give bitwise-equal initial weights."""
    keras.utils.set_random_seed(seed)
    trunk_layers = [keras.layers.Dense(width, activation="tanh")]
    if dropout:
        trunk_layers.append(keras.layers.Dropout(dropout))
    trunk_layers.append(keras.layers.Dense(width, activation="tanh"))
    model = mh.MultiHeadModel(
        trunk=keras.Sequential(trunk_layers),
        heads={h: keras.Sequential([keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
               for h in heads},
    )
    model.build((None, input_dim))
    return model


def make_tapped(tap="conv1", seed: int = 0, input_dim: int = 5) -> mh.MultiHeadModel:
    """A built model with a trunk tap: trunk conv1 -> drop (no variables) -> conv2 -> conv3;
    head `main` reads the trunk's output, head `aux` block `tap`."""
    keras.utils.set_random_seed(seed)
    trunk = keras.Sequential([keras.layers.Dense(8, activation="tanh", name="conv1"),
                              keras.layers.Dropout(0.0, name="drop"),
                              keras.layers.Dense(8, activation="tanh", name="conv2"),
                              keras.layers.Dense(6, activation="tanh", name="conv3")])
    model = mh.MultiHeadModel(trunk, {h: keras.layers.Dense(1) for h in ("main", "aux")},
                              taps={"aux": tap})
    model.build((None, input_dim))
    return model


def make_batch(heads=("a", "b"), n: int = 16, input_dim: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, input_dim)).astype("float32")
    y = {h: rng.standard_normal((n, 1)).astype("float32") for h in heads}
    return x, y


def weights(variables) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


@pytest.fixture
def model_factory():
    return make_model


@pytest.fixture
def batch_factory():
    return make_batch


def assert_train_refuses(config, override: str, message: str, tmp_path, capsys) -> None:
    """`multihead train config --set override` exits 2 with one line holding `message` and
    leaves no run directory."""
    from multihead.cli.main import main

    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--set", override]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not run_dir.exists()


#: The start of a script that runs under a `MirroredStrategy` over two logical CPU devices in
#: a fresh Python (logical devices must be set before TensorFlow runs anything, so not in the
#: test's process). It defines `tf`, `keras`, `np`, `mh`, `scope`, `make_model`, `make_batch`,
#: `strategy`, `OUT` (a directory of the test's) and `done(result)`, which hands `result`
#: (JSON) back to `run_mirrored`.
MIRRORED_SCRIPT = r'''
import json, os, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
sys.path.insert(0, sys.argv[1])
import multihead as mh
from multihead.step.distribute import make_strategy, scope
from conftest import make_model, make_batch
OUT = sys.argv[2]
strategy = make_strategy("mirrored")

def done(result):
    with open(os.path.join(OUT, "result.json"), "w") as f:
        json.dump(result, f)
'''


def run_mirrored(body: str, out_dir, timeout: float = 600):
    """Runs `MIRRORED_SCRIPT + body` in a fresh Python (at most `timeout` seconds, killed
    after) with `OUT = out_dir`, and returns what it passed to `done`."""
    tests = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(out_dir, "mirrored.py")
    with open(script, "w") as f:
        f.write(MIRRORED_SCRIPT + body)
    try:
        proc = subprocess.run([sys.executable, script, tests, str(out_dir)], capture_output=True,
                              text=True, timeout=timeout, cwd=os.path.dirname(tests),
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the mirrored script did not finish in {timeout} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(out_dir, "result.json")) as f:
        return json.load(f)
