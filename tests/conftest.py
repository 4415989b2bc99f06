"""Shared fixtures: small deterministic models and batches."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import multihead as mh  # noqa: E402


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
