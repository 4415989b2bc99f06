"""A user-defined stateful aggregator and a user-defined loss weighting, written against the
public API only (the two classes of docs/own-methods.md): they train through `Trainer` and through
a config, their state is checkpointed, and a resumed run equals the uninterrupted one bitwise
(in process; the SIGKILL + `--resume` version is slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from aggregation.docs_methods import docs_methods
from conftest import make_model

import multihead as mh
from multihead.io.manager import CheckpointManager

HEADS = ("a", "b")
DATA = mh.mmoe_synthetic(tasks=list(HEADS), train_size=200, eval_size=40, input_dim=5, seed=1)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _trainer(seed):
    norm_balance, first_loss = docs_methods()
    model = make_model(seed=seed)
    keras.utils.set_random_seed(0)
    policy = mh.TrunkPolicy("adam", aggregator=norm_balance(decay=0.8),
                            loss_weighting=first_loss(), seed=3)
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in HEADS},
                      trunk=policy)


def _fit(trainer, steps, manager=None):
    return trainer.fit(DATA.train, steps, batch_size=16, verbose=False, checkpoints=manager)


def test_user_methods_train_and_hold_their_state():
    trainer = _trainer(seed=0)
    _fit(trainer, 6)
    norm = trainer.trunk_update.aggregator_state.norm_ema.numpy()
    first = trainer.trunk_update.weighting.first.numpy()
    assert np.all(norm > 0) and np.all(first > 0)
    assert trainer.trace_count == 1


def test_a_user_loss_weighting_instance_serves_one_trainer():
    _, first_loss = docs_methods()
    weighting = first_loss()
    policy = mh.TrunkPolicy(loss_weighting=weighting)
    mh.Trainer(make_model(), {h: mh.Objective("mse", "sgd") for h in HEADS}, trunk=policy)
    with pytest.raises(ValueError, match="already built for 2 heads.*its own instance"):
        mh.Trainer(make_model(), {h: mh.Objective("mse", "sgd") for h in HEADS}, trunk=policy)


def test_user_methods_resume_bitwise_in_process(tmp_path):
    """Stop at 17 (checkpoint at 10), restore into fresh objects and fresh method instances,
    train on to 25: every variable equals the uninterrupted run's."""
    full = _trainer(seed=0)
    _fit(full, 25)
    first = _trainer(seed=0)
    _fit(first, 17, CheckpointManager(tmp_path, first.model, first, every=10))
    resumed = _trainer(seed=5)
    assert CheckpointManager(tmp_path, resumed.model, resumed, every=10).restore_latest() == 10
    _fit(resumed, 15)
    assert np.any(full.trunk_update.aggregator_state.norm_ema.numpy() != 0)
    for a, b in zip(list(full.trunk_update.variables) + list(full.model.variables),
                    list(resumed.trunk_update.variables) + list(resumed.model.variables)):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)


CONFIG = """\
seed: 0
data: {kind: mmoe, train_size: 256, eval_size: 64, input_dim: 8}
model:
  trunk: {mlp: {units: [16], activation: relu}}
  heads:
    a: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
    b: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
train:
  steps: STEPS
  batch_size: 32
  eval_every: 25
  trunk:
    optimizer: adam
    aggregator: {class_name: docs>NormBalance, config: {decay: 0.8}}
    loss_weighting: {class_name: docs>FirstLossNormalisation, config: {}}
log: {every: 5, histograms_every: 0}
checkpoint: {every: 25, keep: 2}
"""


def _state_keys(prefix):
    return set(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())


def test_user_methods_train_through_a_config(tmp_path):
    from multihead.experiments.run.experiment import run_experiment

    docs_methods()   # registers the classes, as a user's import would
    config = tmp_path / "exp.yaml"
    config.write_text(CONFIG.replace("STEPS", "30"))
    run = tmp_path / "run"
    assert run_experiment(str(config), run_dir=str(run), quiet=True).exit_code == 0
    text = (run / "metrics.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    keys = _state_keys(tf.train.latest_checkpoint(str(run / "checkpoints")))
    assert "trunk_update/aggregator_state/norm_ema/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "trunk_update/weighting/first/.ATTRIBUTES/VARIABLE_VALUE" in keys


def test_a_config_names_only_registered_classes(tmp_path):
    from multihead.experiments.config.errors import ConfigError
    from multihead.experiments.config.schema import from_dict, parse_yaml

    raw = parse_yaml(CONFIG.replace("STEPS", "5").replace("docs>NormBalance", "os>system"))
    with pytest.raises(ConfigError, match="train.trunk.aggregator: 'os>system' is not a registered"):
        from_dict(raw)


_LAUNCHER = """\
import sys
sys.path.insert(0, {tests!r})
from aggregation.docs_methods import docs_methods
docs_methods()
from multihead.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_user_methods_sigkill_then_resume_equal_the_uninterrupted_run(tmp_path):
    from test_resume import _env, _killed_after_a_checkpoint, _tensors

    launcher = tmp_path / "launch.py"
    launcher.write_text(_LAUNCHER.format(tests=TESTS))
    config = tmp_path / "exp.yaml"
    config.write_text(CONFIG.replace("STEPS", "1000000"))
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    killed_at = _killed_after_a_checkpoint(config, stopped, launcher=(str(launcher),))
    total = (killed_at // 25 + 2) * 25

    def cli(*args):
        result = subprocess.run([sys.executable, str(launcher), *args], env=_env(),
                                capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, result.stderr[-2000:]

    cli("train", str(config), "--resume", str(stopped), "--set", f"train.steps={total}", "--quiet")
    cli("train", str(config), "--run-dir", str(full), "--set", f"train.steps={total}", "--quiet")
    resumed_state = _tensors(str(stopped / "checkpoints" / f"ckpt-{total}"))
    full_state = _tensors(str(full / "checkpoints" / f"ckpt-{total}"))
    assert set(resumed_state) == set(full_state)
    key = "trunk_update/aggregator_state/norm_ema/.ATTRIBUTES/VARIABLE_VALUE"
    assert np.any(full_state[key] != 0)
    for name, value in full_state.items():
        np.testing.assert_array_equal(resumed_state[name], value, err_msg=name)
    json.loads((full / "metrics.json").read_text())
