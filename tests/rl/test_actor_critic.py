"""A2C: n-step returns and the policy-gradient loss against numpy, the two heads' updates
(each its own optimizer on its own var_list, V_target read inside the compiled step) against
a hand-written loop, and a short CartPole run through the CLI."""

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
from multihead.rl.actor_critic import actor_critic_losses, nstep_returns, policy_gradient_loss

pytest.importorskip("gymnasium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "a2c_cartpole.yaml")
T, K, GAMMA = 3, 2, 0.5


def _returns_reference(r, term, ended, next_v, gamma):
    """The textbook backward loop, in float64."""
    out = np.zeros_like(r, dtype=np.float64)
    for k in range(r.shape[1]):
        running = next_v[-1, k]
        for t in reversed(range(r.shape[0])):
            if ended[t, k] or t == r.shape[0] - 1:
                running = next_v[t, k]
            running = r[t, k] + gamma * (1 - term[t, k]) * running
            out[t, k] = running
    return out


def test_nstep_returns_with_termination_and_truncation():
    r = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], "float32")
    term = np.array([[0, 0], [1, 0], [0, 0]], "float32")  # env 0 terminates at t=1
    ended = np.array([[0, 1], [1, 0], [0, 0]], "float32")  # env 1 is truncated at t=0
    next_v = np.array([[9.0, 4.0], [9.0, 9.0], [2.0, 6.0]], "float32")
    # env 0: R2 = 1 + .5*2 = 2;  R1 = 1 (terminal);  R0 = 1 + .5*R1 = 1.5
    # env 1: R2 = 1 + .5*6 = 4;  R1 = 1 + .5*R2 = 3;  R0 = 1 + .5*4 (truncated: V(final obs)) = 3
    expected = [[1.5, 3.0], [1.0, 3.0], [2.0, 4.0]]
    np.testing.assert_allclose(nstep_returns(r, term, ended, next_v, GAMMA), expected, rtol=1e-6)
    rng = np.random.default_rng(0)
    r, v = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    term = (rng.random((6, 4)) < 0.2).astype("float32")
    ended = np.maximum(term, rng.random((6, 4)) < 0.2)
    np.testing.assert_allclose(nstep_returns(r, term, ended, v, 0.9),
                               _returns_reference(r, term, ended, v, 0.9), rtol=1e-5, atol=1e-6)


def test_policy_gradient_loss_against_numpy():
    logits = np.array([[0.0, np.log(3.0)], [0.0, 0.0]], "float32")  # pi = (.25, .75), (.5, .5)
    action, adv = np.array([1, 0]), np.array([2.0, -1.0], "float32")
    # -mean(log .75 * 2, log .5 * -1) - 0.1 * mean(H1, H2), H = -sum p log p
    h1 = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    h2 = np.log(2.0)
    expected = -np.mean([np.log(0.75) * 2.0, np.log(0.5) * -1.0]) - 0.1 * np.mean([h1, h2])
    assert float(policy_gradient_loss(logits, action, adv, 0.1)) == pytest.approx(expected, rel=1e-6)


def _model(seed):
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(16, activation="tanh")]),
                              {"policy": keras.layers.Dense(2), "value": keras.layers.Dense(1)})
    model.build((None, 4))
    return model


def _rollout(seed):
    rng = np.random.default_rng(seed)
    term = (rng.random((T, K)) < 0.3).astype("float32")
    return (rng.standard_normal((T * K, 4)).astype("float32"),
            {"action": rng.integers(0, 2, T * K), "reward": rng.standard_normal((T, K)).astype("float32"),
             "terminated": term, "ended": np.maximum(term, rng.random((T, K)) < 0.3).astype("float32"),
             "next_obs": rng.standard_normal((T * K, 4)).astype("float32")})


def test_a2c_heads_update_like_a_hand_written_loop_with_value_target():
    """Seed 001 as a training loop: policy and V share the trunk, each head has its own Adam on
    trunk + head, returns bootstrap from V_target = copy of trunk + V synced every 2 updates."""
    steps, every, ent = 5, 2, 0.01
    ours = _model(7)
    v_target = mh.TargetNetwork(ours, heads=["value"], every=every)
    policy_loss, value_loss = actor_critic_losses(ours, "policy", "value", GAMMA, ent, v_target)
    opts = {"policy": keras.optimizers.Adam(1e-2), "value": keras.optimizers.Adam(1e-2)}
    trainer = mh.Trainer(ours, {"policy": mh.Objective(policy_loss, opts["policy"]),
                                "value": mh.Objective(value_loss, opts["value"], weight=0.5)})
    for i in range(steps):
        trainer.step(_rollout(i))
        v_target.update()
    for head in ("policy", "value"):  # each optimizer built on exactly trunk + its head
        assert [id(v) for v in opts[head]._trainable_variables] == [id(v) for v in ours.var_list(head)]

    ref, ref_target = _model(7), _model(7)
    ref_opts = {"policy": keras.optimizers.Adam(1e-2), "value": keras.optimizers.Adam(1e-2)}
    for h in ref_opts:
        ref_opts[h].build(ref.var_list(h))
    for i in range(steps):
        x, t = _rollout(i)
        next_v = ref_target(t["next_obs"])["value"].numpy().reshape(T, K)
        returns = _returns_reference(t["reward"], t["terminated"], t["ended"], next_v, GAMMA)
        returns = returns.reshape(-1).astype("float32")
        with tf.GradientTape(persistent=True) as tape:
            out = ref(x, training=True)
            adv = returns - tf.stop_gradient(out["value"][:, 0])
            log_pi = tf.nn.log_softmax(out["policy"])
            pg = -tf.reduce_mean(tf.gather(log_pi, t["action"], axis=1, batch_dims=1) * adv)
            entropy = tf.reduce_mean(-tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=1))
            losses = {"policy": pg - ent * entropy,
                      "value": 0.5 * tf.reduce_mean(tf.square(returns - out["value"][:, 0]))}
        for h in ref_opts:
            grads = tape.gradient(losses[h], ref.var_list(h))
            ref_opts[h].apply_gradients(zip(grads, ref.var_list(h)))
        if (i + 1) % every == 0:
            for s, d in zip(ref.trunk.weights + ref.heads["value"].weights,
                            ref_target.trunk.weights + ref_target.heads["value"].weights):
                d.assign(s)
    for a, b in zip(ours.weights, ref.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-5)
    for a, b in zip(v_target.target_weights, ref_target.trunk.weights + ref_target.heads["value"].weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-5)


def _events_tags(directory):
    tags = set()
    for path in glob.glob(os.path.join(directory, "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    return tags


def test_cartpole_smoke_run_from_a_config(tmp_path):
    run_dir = tmp_path / "run"
    sets = ["train.steps=400", "train.eval_every=200", "actor_critic.num_envs=4",
            "actor_critic.n_steps=5", "actor_critic.value_target_every=5", "env.eval_episodes=3",
            "log.every=5", "model.trunk.mlp.units=[32]"]
    assert run_experiment(CONFIG, run_dir=str(run_dir), overrides=sets, quiet=True).exit_code == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["env_steps"] == 400 and metrics["updates"] == 400 // (4 * 5) == 20
    assert metrics["target_syncs"] == 20 // 5
    assert all(np.isfinite(v) for v in metrics["final_loss"].values())
    assert [e["env_steps"] for e in metrics["evals"]] == [200, 400]
    assert (run_dir / "checkpoints" / "final.index").exists()
    fresh = tasks.prepare(load_config(CONFIG, sets))  # same architecture, untrained
    mh.restore_checkpoint(str(run_dir / "checkpoints" / "final"), fresh.model,
                          parts=["targets/value"], targets={"value": fresh.value_target})
    assert int(fresh.value_target.counter) == metrics["target_updates"]  # the sync counter was saved
    assert {"loss/policy", "loss/value", "episode/return", "episode/length"} <= _events_tags(run_dir / "train")


@pytest.mark.parametrize("override,message", [
    ("model.heads.policy.loss=huber", "model.heads.policy.loss: the policy head's loss is set by the task"),
    ("actor_critic.value_target_tau=2.0", "actor_critic.value_target_tau: must satisfy 0 < tau <= 1"),
    ("actor_critic.value_head=v", "actor_critic.value_head: the model has no head 'v'"),
    ("model.heads.value.layers={class_name: Dense, config: {units: 2}}",
     "the value head must output 1 value per example, it outputs shape (2,)"),
    ("dqn={}", "dqn: only used with task dqn"),
])
def test_bad_config_is_one_line_error_exit_2_nothing_written(tmp_path, capsys, override, message):
    assert_train_refuses(CONFIG, override, message, tmp_path, capsys)


@pytest.mark.slow
def test_committed_config_solves_cartpole_seed_0():
    """The result benchmark for one seed (about 100k env steps, under a minute on 2 cores)."""
    from multihead.experiments.run import runner as tasks
    from multihead.experiments.config.schema import load_config

    metrics = tasks.prepare(load_config(CONFIG)).run(None, verbose=False)
    assert metrics["solved_at_env_steps"] is not None and metrics["eval_mean_return"] >= 475
