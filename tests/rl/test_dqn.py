"""DQN: TD targets against numpy, the loss inside the compiled step against a hand-written
loop, the replay buffer, and a short CartPole run through the CLI."""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from multihead.experiments.run import runner as tasks
from conftest import assert_train_refuses
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import load_config
from multihead.rl.dqn import dqn_loss, linear_epsilon, td_target

pytest.importorskip("gymnasium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "dqn_cartpole.yaml")


def test_td_target_dqn_and_double_dqn_against_numpy():
    r = np.array([1.0, 0.5, -1.0], "float32")
    term = np.array([0.0, 1.0, 0.0], "float32")
    q_target = np.array([[1.0, 3.0], [2.0, 0.0], [4.0, -2.0]], "float32")
    q_online = np.array([[5.0, 0.0], [0.0, 1.0], [-1.0, 2.0]], "float32")
    # DQN: 1 + 0.9 * 3 = 3.7;  terminal: 0.5;  -1 + 0.9 * 4 = 2.6
    np.testing.assert_allclose(td_target(r, term, q_target, 0.9), [3.7, 0.5, 2.6], rtol=1e-6)
    # double: online picks a=0 -> Q'=1: 1 + 0.9 = 1.9;  terminal 0.5;  picks a=1 -> -1 + 0.9 * -2 = -2.8
    np.testing.assert_allclose(td_target(r, term, q_target, 0.9, q_online), [1.9, 0.5, -2.8], rtol=1e-6)


def test_linear_epsilon():
    # 1.0 + (4000 / 10000) * (0.05 - 1.0) = 1.0 - 0.38 = 0.62
    assert linear_epsilon(4000, 1.0, 0.05, 10000) == pytest.approx(0.62)
    assert linear_epsilon(0, 1.0, 0.05, 10000) == 1.0
    assert linear_epsilon(50000, 1.0, 0.05, 10000) == pytest.approx(0.05)


def _transitions(seed, n=32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 5)).astype("float32"),
            {"action": rng.integers(0, 2, n), "reward": rng.standard_normal(n).astype("float32"),
             "next_obs": rng.standard_normal((n, 5)).astype("float32"),
             "terminated": (rng.random(n) < 0.2).astype("float32")})


def _q_model(seed):
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(16, activation="relu")]),
                              {"q": keras.layers.Dense(2)})
    model.build((None, 5))
    return model


@pytest.mark.parametrize("double", [False, True])
def test_dqn_step_with_target_network_equals_hand_written_loop(double):
    gamma, k, steps = 0.95, 2, 5
    ours = _q_model(3)
    target = mh.TargetNetwork(ours, heads=["q"], every=k)
    trainer = mh.Trainer(ours, {"q": mh.Objective(dqn_loss(ours, target, "q", gamma, double, "huber"),
                                                  keras.optimizers.Adam(1e-2))})
    for i in range(steps):
        trainer.step(_transitions(i))
        target.update()

    ref, ref_target = _q_model(3), _q_model(3)
    opt = keras.optimizers.Adam(1e-2)
    opt.build(ref.var_list("q"))
    huber = keras.losses.Huber()
    for i in range(steps):
        x, t = _transitions(i)
        next_t = ref_target(t["next_obs"])["q"].numpy()
        if double:
            best = np.argmax(ref(t["next_obs"])["q"].numpy(), axis=1)
            next_v = next_t[np.arange(len(best)), best]
        else:
            next_v = next_t.max(axis=1)
        y = t["reward"] + gamma * (1 - t["terminated"]) * next_v
        with tf.GradientTape() as tape:
            q = ref(x, training=True)["q"]
            q_sa = tf.gather(q, t["action"], axis=1, batch_dims=1)
            loss = huber(y[:, None], q_sa[:, None])
        opt.apply_gradients(zip(tape.gradient(loss, ref.var_list("q")), ref.var_list("q")))
        if (i + 1) % k == 0:
            for s, d in zip(ref.weights, ref_target.weights):
                d.assign(s)
    for a, b in zip(ours.weights, ref.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-5)
    for a, b in zip(target.target_weights, ref_target.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-5)
    assert target.num_syncs == steps // k


def test_replay_buffer_keeps_the_last_capacity_transitions_and_samples_them():
    buf = mh.ReplayBuffer(4, (2,), seed=0)
    for i in range(6):  # 0 and 1 are overwritten by 4 and 5
        buf.add(np.full(2, i), i % 2, float(i), np.full(2, i + 1), i == 5)
    assert len(buf) == 4
    batch = buf.sample(200)
    assert set(batch.reward.tolist()) == {2.0, 3.0, 4.0, 5.0}
    np.testing.assert_array_equal(batch.obs[:, 0], batch.reward)  # rows stay aligned
    np.testing.assert_array_equal(batch.next_obs[:, 0], batch.reward + 1)
    np.testing.assert_array_equal(batch.action, batch.reward.astype(int) % 2)
    np.testing.assert_array_equal(batch.terminated, (batch.reward == 5.0).astype("float32"))
    again = mh.ReplayBuffer(4, (2,), seed=0)
    for i in range(6):
        again.add(np.full(2, i), i % 2, float(i), np.full(2, i + 1), i == 5)
    np.testing.assert_array_equal(again.sample(200).reward, batch.reward)  # seeded, no global RNG


def _events_tags(directory):
    tags = set()
    for path in glob.glob(os.path.join(directory, "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    return tags


@pytest.mark.parametrize("schedule,expect_syncs", [("every", (300 - 100) // 50), ("tau", None)])
def test_cartpole_smoke_run_from_a_config(tmp_path, schedule, expect_syncs):
    run_dir = tmp_path / "run"
    sets = ["train.steps=300", "dqn.learning_starts=100", "env.eval_episodes=3", "log.every=20",
            "model.trunk.mlp.units=[32]"]
    sets += ["dqn.target_every=50"] if schedule == "every" else ["dqn.target_every=null", "dqn.target_tau=0.01"]
    assert run_experiment(CONFIG, run_dir=str(run_dir), overrides=sets, quiet=True).exit_code == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["env_steps"] == 300
    assert metrics["updates"] == 200 == metrics["target_updates"]  # env steps 101..300
    assert metrics["target_syncs"] == expect_syncs
    assert np.isfinite(metrics["final_loss"]) and np.isfinite(metrics["mean_loss_last_100"])
    assert metrics["episodes"] >= 1 and metrics["eval_episodes"] == 3
    assert (run_dir / "config.yaml").exists()
    assert (run_dir / "checkpoints" / "final.index").exists()
    fresh = tasks.prepare(load_config(CONFIG, sets))  # same architecture, untrained
    mh.restore_checkpoint(str(run_dir / "checkpoints" / "final"), fresh.model,
                          parts=["targets/q"], targets={"q": fresh.target})
    assert int(fresh.target.counter) == metrics["target_updates"]  # the sync counter was saved
    assert {"loss/q", "episode/return", "episode/length"} <= _events_tags(run_dir / "train")
    assert "episode/return" in _events_tags(run_dir / "eval")


@pytest.mark.parametrize("override,message", [
    ("dqn.target_tau=1.5", "dqn.target_tau: must satisfy 0 < tau <= 1, got 1.5"),
    ("dqn.target_tau=0", "dqn.target_tau: must satisfy 0 < tau <= 1, got 0.0"),
    ("dqn.head=value", "dqn.head: the model has no head 'value'"),
    ("model.heads.q.layers={class_name: Dense, config: {units: 3}}",
     "model.heads.q.layers: the Q head must output 2 values per example, it outputs shape (3,)"),
    ("env.id=NoSuchEnv-v0", "env.id: 'NoSuchEnv-v0' is not a registered gymnasium environment"),
    ("env.id=Pendulum-v1", "env.id: 'Pendulum-v1' has action space Box(-2.0, 2.0, (1,), float32); "
                           "the dqn and actor_critic tasks need a Discrete one"),
    ("model.heads.q.loss=msee", "model.heads.q.loss"),
    ("model.heads.q.metrics=[mae]", "model.heads.q.metrics: not used by task dqn"),
])
def test_bad_config_is_one_line_error_exit_2_nothing_written(tmp_path, capsys, override, message):
    assert_train_refuses(CONFIG, override, message, tmp_path, capsys)


@pytest.mark.slow
def test_committed_config_solves_cartpole_seed_0():
    """The result benchmark for one seed (about 30k env steps, 1-2 minutes on 2 cores)."""
    from multihead.experiments.run import runner as tasks
    from multihead.experiments.config.schema import load_config

    metrics = tasks.prepare(load_config(CONFIG)).run(None, verbose=False)
    assert metrics["solved_at_env_steps"] is not None and metrics["eval_mean_return"] >= 475


def test_replay_buffer_stores_continuous_actions():
    buf = mh.ReplayBuffer(3, (2,), seed=0, action_shape=(2,), action_dtype="float32")
    for i in range(3):
        buf.add(np.full(2, i), np.array([i, -i], "float32") / 4, float(i), np.full(2, i + 1), False)
    batch = buf.sample(50)
    assert batch.action.shape == (50, 2) and batch.action.dtype == np.float32
    np.testing.assert_array_equal(batch.action, np.stack([batch.reward, -batch.reward], 1) / 4)
