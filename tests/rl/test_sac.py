"""SAC: the squashed-Gaussian log-density, critic, actor and temperature losses against numpy on a
fixed batch, the temperature's one-variable objective and the actor's step against hand-written
updates (the other heads bitwise unchanged), and a short Pendulum run through the CLI."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import assert_train_refuses, weights
from multihead.rl.continuous import agent_inputs
from multihead.rl.sac import sac_losses, squashed_gaussian
from test_td3 import (LOW, HIGH, GAMMA, TAU, cli_run, critic_state, fixed_batch, moved_apart, np_critic,
                      np_head, reevaluate, reaches_minus_200, small_model)

pytest.importorskip("gymnasium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "sac_pendulum.yaml")
ALPHA = 0.7  # small_model's initial temperature
KEYS = ("noise", "next_noise")


def np_policy(head, obs, noise, low=LOW, high=HIGH):
    """`(action on the bounds, log pi)` of the squashed Gaussian, float64, by the textbook formula."""
    mean, log_std = np.split(np_head(head, obs), 2, axis=1)
    log_std = np.clip(log_std, -20, 2)
    u = mean + np.exp(log_std) * noise
    log_normal = -0.5 * ((u - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
    # log(1 - tanh(u)^2) = log(sech(u)^2) = -2 log cosh(u), finite where tanh(u) rounds to 1
    log_pi = np.sum(log_normal + 2 * np.log(np.cosh(u)), axis=1)
    mid, half = (np.array(high) + low) / 2, (np.array(high) - low) / 2
    return mid + half * np.tanh(u), log_pi


def sac_setup(seed=0):
    model = small_model(seed, gaussian=True, temperature="alpha")
    target = mh.TargetNetwork(model, heads=["q1", "q2"], tau=TAU)
    moved_apart(model, target)
    model.heads["alpha"].log_alpha.assign(math.log(ALPHA))
    return model, target, sac_losses(model, target, GAMMA, LOW, HIGH)


def test_squashed_gaussian_log_density_matches_the_change_of_variables():
    rng = np.random.default_rng(0)
    params = np.concatenate([rng.standard_normal((6, 2)), [[-30.0, 0.5]] * 3 + [[1.0, 5.0]] * 3],
                            axis=1).astype("float32")  # log stds clipped to [-20, 2] on both sides
    noise = rng.standard_normal((6, 2)).astype("float32")
    action, log_pi = squashed_gaussian(params, noise)
    mean, log_std = params[:, :2].astype(np.float64), np.clip(params[:, 2:], -20, 2).astype(np.float64)
    u = mean + np.exp(log_std) * noise
    np.testing.assert_allclose(action, np.tanh(u), rtol=1e-6)
    # the density of u under N(mean, std), less log |d tanh(u) / du| = log(1 - tanh(u)^2)
    expected = np.sum(-0.5 * noise.astype(np.float64) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
                      - np.log(1 - np.tanh(u) ** 2), axis=1)
    np.testing.assert_allclose(log_pi, expected, rtol=1e-5)


@pytest.mark.parametrize("critic", ["q1", "q2"])
def test_critic_loss_is_soft_clipped_double_q(critic):
    model, target, losses = sac_setup()
    inputs, targets = fixed_batch(1, keys=KEYS)
    ours = float(losses[critic](inputs, targets, model(inputs)[critic]))
    obs, action, next_obs = (np.float64(inputs["obs"]), np.float64(inputs["action"]),
                             np.float64(targets["next_obs"]))
    next_action, next_log_pi = np_policy(model.heads["actor"], next_obs, targets["next_noise"])
    soft = np.minimum(np_critic(target.heads["q1"], next_obs, next_action),
                      np_critic(target.heads["q2"], next_obs, next_action)) - ALPHA * next_log_pi
    y = targets["reward"] + GAMMA * (1 - targets["terminated"]) * soft
    expected = np.mean((np_critic(model.heads[critic], obs, action) - y) ** 2)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)


def test_actor_loss_is_alpha_log_pi_minus_min_q():
    model, _, losses = sac_setup()
    inputs, targets = fixed_batch(2, keys=KEYS)
    ours = float(losses["actor"](inputs, targets, model(inputs)["actor"]))
    obs = np.float64(inputs["obs"])
    action, log_pi = np_policy(model.heads["actor"], obs, targets["noise"])
    q = np.minimum(np_critic(model.heads["q1"], obs, action), np_critic(model.heads["q2"], obs, action))
    np.testing.assert_allclose(ours, np.mean(ALPHA * log_pi - q), rtol=1e-5)


def test_temperature_loss_and_its_one_variable_objective():
    model, target, losses = sac_setup()
    inputs, targets = fixed_batch(3, keys=KEYS)
    _, log_pi = np_policy(model.heads["actor"], np.float64(inputs["obs"]), targets["noise"])
    target_entropy = -2.0  # -(action dimensions)
    expected = -np.mean(math.log(ALPHA) * (log_pi + target_entropy))
    # a mean of terms of either sign: compared at the float32 precision of its terms (~1e-6)
    np.testing.assert_allclose(float(losses["alpha"](inputs, targets, model(inputs)["alpha"])),
                               expected, rtol=1e-5, atol=1e-6)

    objectives = {h: mh.Objective(losses[h], keras.optimizers.SGD(0.1), trains_trunk=False)
                  for h in model.head_names}
    trainer = mh.Trainer(model, objectives, target_networks=[target])
    (log_alpha,) = model.var_list("alpha")  # the temperature's var_list: one variable
    assert log_alpha is model.heads["alpha"].log_alpha
    others = weights([v for h in ("q1", "q2", "actor") for v in model.var_list(h)])
    trainer.step((inputs, targets), heads=["alpha"])
    # d loss / d log_alpha = -mean(log pi + target entropy): SGD adds 0.1 * mean(log pi - 2)
    np.testing.assert_allclose(float(log_alpha), math.log(ALPHA) + 0.1 * np.mean(log_pi + target_entropy),
                               rtol=1e-5)
    for a, b in zip(weights([v for h in ("q1", "q2", "actor") for v in model.var_list(h)]), others):
        np.testing.assert_array_equal(a, b)


def test_actor_step_leaves_critics_temperature_and_slots_bitwise_and_follows_a_hand_written_tape():
    model, target, losses = sac_setup()
    objectives = {h: mh.Objective(losses[h], keras.optimizers.SGD(0.1) if h == "actor"
                                  else keras.optimizers.Adam(1e-2), trains_trunk=False)
                  for h in model.head_names}
    trainer = mh.Trainer(model, objectives, schedule="sequential", target_networks=[target])
    trainer.step(fixed_batch(4, keys=KEYS))  # every head once: Adam slots are not zero
    inputs, targets = fixed_batch(5, keys=KEYS)
    before = critic_state(model, trainer, heads=("q1", "q2", "alpha"))
    actor_vars = model.var_list("actor")
    alpha = float(tf.exp(model.heads["alpha"].log_alpha))
    with tf.GradientTape() as tape:  # by hand: mean(alpha log pi(a|s) - min Q(s, a)), a = f(z)
        squashed, log_pi = squashed_gaussian(model.heads["actor"](inputs), targets["noise"])
        action = (np.array(HIGH) + LOW) / 2 + (np.array(HIGH) - LOW) / 2 * squashed
        pair = agent_inputs(inputs["obs"], tf.cast(action, tf.float32))
        q = tf.minimum(model.heads["q1"](pair)[:, 0], model.heads["q2"](pair)[:, 0])
        loss = tf.reduce_mean(alpha * log_pi - q)
    expected = [v.numpy() - 0.1 * g.numpy() for v, g in zip(actor_vars, tape.gradient(loss, actor_vars))]
    result = trainer.step((inputs, targets), heads=["actor"])
    assert result.updated == ("actor",)
    for a, b in zip(critic_state(model, trainer, heads=("q1", "q2", "alpha")), before):
        np.testing.assert_array_equal(a, b)
    for v, e in zip(actor_vars, expected):
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-5, atol=1e-6)


SMOKE = ["train.steps=300", "sac.start_steps=100", "sac.learning_starts=100", "train.batch_size=32",
         "train.eval_every=150", "env.eval_episodes=2", "log.every=50",
         "model.heads.q1.layers.mlp.units=[16]", "model.heads.q2.layers.mlp.units=[16]",
         "model.heads.actor.layers.mlp.units=[16]"]


def test_pendulum_smoke_run_through_the_cli_writes_metrics_of_its_evaluations(tmp_path):
    run_dir = tmp_path / "run"
    metrics = cli_run(CONFIG, SMOKE, run_dir)
    assert metrics["task"] == "sac" and metrics["env_steps"] == 300
    assert metrics["updates"] == 200 == metrics["target_updates"]
    assert [e["env_steps"] for e in metrics["evals"]] == [150, 300]
    assert set(metrics["final_loss"]) == {"q1", "q2", "actor", "alpha"}

    def act_of(model):  # the deterministic policy: tanh(mean) on the bounds
        return lambda obs: 2.0 * np.tanh(np_head(model.heads["actor"], np.float64(obs))[:, :1])

    assert reevaluate(CONFIG, SMOKE, run_dir, act_of) == pytest.approx(metrics["eval_mean_return"], rel=1e-4)


@pytest.mark.parametrize("override,message", [
    ("sac.initial_alpha=0", "sac.initial_alpha: must be > 0, got 0"),
    ("sac.temperature_head=temp", "sac.temperature_head: the model has no head 'temp'"),
    ("model.heads.alpha.loss=mae", "model.heads.alpha.loss: set by task sac; leave it out"),
    ("sac.tau=2", "sac.tau: must satisfy 0 < tau <= 1, got 2"),
    ("td3.tau=0.1", "td3: only used with task td3"),
])
def test_bad_config_is_one_line_error_exit_2_nothing_written(tmp_path, capsys, override, message):
    assert_train_refuses(CONFIG, override, message, tmp_path, capsys)


@pytest.mark.slow
def test_committed_config_reaches_minus_200_within_20k_steps_on_2_of_3_seeds():
    """The result of benchmarks/rl_pendulum.py --tasks sac (minutes per seed on 2 cores)."""
    assert sum(reaches_minus_200(CONFIG, seed) for seed in (0, 1, 2)) >= 2
