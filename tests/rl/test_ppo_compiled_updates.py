"""PPO's update as one compiled multi-step call (`PPORunner.compiled_updates`, the default)
against one `Trainer.step` per minibatch (`compiled_updates=False`): the same run bitwise.

The reference is the per-minibatch loop kept beside the compiled one: every variable of the
final checkpoint (weights, optimizer slots and iterations, step counter, the host state with
the generators and the losses), the update statistics (KL, clip fraction, explained
variance) and every TensorBoard scalar (per-head losses, gradient norms, learning rates, the
`ppo/` statistics) must be equal, not close.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from multihead.experiments.config.schema import load_config
from multihead.experiments.run import runner as tasks
from multihead.experiments.run.rl import RLRun
from multihead.rl.ppo import Rollout, minibatches, update_batches
from test_ppo import _scalars as scalar_events

gymnasium = pytest.importorskip("gymnasium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "experiments", "ppo_cartpole.yaml")
PENDULUM = os.path.join(ROOT, "experiments", "ppo_pendulum.yaml")

# 3 rollouts of 4 x 32 = 128 rows; scalars every 3 update steps and gradient histograms every
# 5, so logging steps fall inside the compiled calls and split them.
SMOKE = ["train.steps=384", "train.eval_every=384", "ppo.num_envs=4", "ppo.n_steps=32",
         "ppo.n_epochs=3", "env.eval_episodes=1", "log.every=3", "log.histograms_every=5",
         "log.variable_norms=true"]


def _scalars(directory):
    """(tag, step) -> value of the scalar summaries in `directory`'s event files, timings left out."""
    return {(tag, step): value for tag, pairs in scalar_events(directory).items()
            if "per_sec" not in tag and "time" not in tag for step, value in pairs}


def _checkpoint(directory):
    """Every tensor of the latest checkpoint in `directory` (the run's state with its host
    state: generators, losses, episode statistics), by its path in the object graph; left out
    are the graph itself (it holds the variables' Keras names, which count up per process)
    and the wall-clock time of the save."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(directory))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name not in ("_CHECKPOINTABLE_OBJECT_GRAPH", "run/saved_at/.ATTRIBUTES/VARIABLE_VALUE")}


def _run(config, sets, run_dir, compiled, monkeypatch):
    """Runs the config; returns the metrics, the final checkpoint's tensors, the scalars and
    the trainer's trace count after each compiled update call."""
    traces = []
    original = RLRun.train_steps

    def counting(self, iterator, max_steps):
        out = original(self, iterator, max_steps)
        traces.append(self.trainer.trace_count)
        return out

    monkeypatch.setattr(RLRun, "train_steps", counting)
    runner = tasks.prepare(load_config(config, sets))
    runner.compiled_updates = compiled
    metrics = runner.run(str(run_dir), verbose=False)
    return metrics, _checkpoint(str(run_dir / "checkpoints")), _scalars(run_dir / "train"), traces


@pytest.mark.parametrize("config,sets,calls_per_update", [
    (CARTPOLE, ["train.batch_size=64"], 1),                                   # 2 batches of 64
    (CARTPOLE, ["train.batch_size=48", "ppo.separate_optimizers=false"], 1),  # 48, 48, 32
    (CARTPOLE, ["train.batch_size=64", "ppo.target_kl=10.0"], 3),             # a call per epoch
    (PENDULUM, ["train.batch_size=64", "ppo.clip_range_vf=0.5"], 1),
], ids=["divisible", "smaller_last_batch_combined", "target_kl", "gaussian"])
def test_compiled_updates_equal_one_step_per_minibatch_bitwise(tmp_path, monkeypatch, config, sets,
                                                               calls_per_update):
    sets = SMOKE + sets
    ref_metrics, ref_ckpt, ref_scalars, _ = _run(config, sets, tmp_path / "ref", False, monkeypatch)
    metrics, ckpt, scalars, traces = _run(config, sets, tmp_path / "new", True, monkeypatch)

    assert len(traces) == 3 * calls_per_update  # 3 rollouts
    assert metrics["updates"] == ref_metrics["updates"] > 0
    assert metrics["last_update"] == ref_metrics["last_update"]  # KL, clip fraction, EV, ...
    assert metrics["final_loss"] == ref_metrics["final_loss"]
    assert [e["mean_return"] for e in metrics["evals"]] == [e["mean_return"] for e in ref_metrics["evals"]]
    assert set(ckpt) == set(ref_ckpt)
    for name, value in ref_ckpt.items():
        np.testing.assert_array_equal(ckpt[name], value, err_msg=name)
    assert {"host/loop/.ATTRIBUTES/loop", "optimizers/policy/_variables/2/.ATTRIBUTES/VARIABLE_VALUE",
            "optimizers/policy/_iterations/.ATTRIBUTES/VARIABLE_VALUE"} <= set(ckpt)  # slots, host state
    assert {t for t, _ in ref_scalars} >= {"ppo/approx_kl", "ppo/clip_fraction", "ppo/explained_variance",
                                           "loss/policy", "grad_norm/policy/head", "lr/policy"}
    assert scalars == ref_scalars
    # The first compiled call traces (a monitored and an unmonitored variant); later
    # rollouts' datasets and iterators find those traces.
    assert traces[-1] == traces[calls_per_update - 1]


def test_update_batches_are_the_minibatches_in_order_with_the_same_draws():
    rows, batch = 10, 4
    obs = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    targets = {"action": np.arange(rows), "log_prob": -np.arange(rows, dtype=np.float32)}
    rollout = Rollout(obs, targets, 0.0)
    rng, ref_rng = np.random.default_rng(7), np.random.default_rng(7)
    got = [(x.numpy(), {k: v.numpy() for k, v in t.items()})
           for x, t in update_batches(rollout, batch, rng, epochs=3)]
    expected = [b for _ in range(3) for b in minibatches(rows, batch, ref_rng)]
    assert [len(x) for x, _ in got] == [4, 4, 2] * 3
    for (x, t), rows_of in zip(got, expected):
        np.testing.assert_array_equal(x, obs[rows_of])
        for k in targets:
            np.testing.assert_array_equal(t[k], targets[k][rows_of])
    assert rng.bit_generator.state == ref_rng.bit_generator.state
