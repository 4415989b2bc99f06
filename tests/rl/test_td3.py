"""TD3: critic and actor losses against numpy on a fixed batch, the actor step reading the critic
without moving it (against a hand-written GradientTape), delayed actor and target updates with
exact Polyak targets, and a short Pendulum run through the CLI whose evaluation is repeated by hand."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import assert_train_refuses, weights
from multihead.experiments.run.experiment import run_experiment
from multihead.rl.continuous import agent_inputs, agent_model
from multihead.rl.td3 import td3_losses

gymnasium = pytest.importorskip("gymnasium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "td3_pendulum.yaml")
LOW, HIGH = [-2.0, -1.0], [2.0, 3.0]  # two action dimensions, asymmetric bounds
GAMMA, SIGMA, CLIP, TAU = 0.9, 0.4, 0.3, 0.25


# -- numpy references of the heads (float64) ---------------------------------------------


ACTIVATIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}


def np_head(head, x):
    """`out(body(x))` of a head whose body is Dense layers with tanh or relu."""
    h = x
    for dense in head.body.layers:
        h = ACTIVATIONS[dense.activation.__name__](
            h @ dense.kernel.numpy().astype(np.float64) + dense.bias.numpy())
    return h @ head.out.kernel.numpy().astype(np.float64) + head.out.bias.numpy()


def np_actor(head, obs, low=LOW, high=HIGH):
    mid, half = (np.array(high) + low) / 2, (np.array(high) - low) / 2
    return mid + half * np.tanh(np_head(head, obs))


def np_critic(head, obs, action):
    return np_head(head, np.concatenate([obs, action], axis=1))[:, 0]


def small_model(seed, gaussian=False, temperature=None, low=LOW, high=HIGH):
    keras.utils.set_random_seed(seed)
    bodies = {h: keras.Sequential([keras.layers.Dense(8, activation="tanh")])
              for h in ("q1", "q2", "actor")}
    return agent_model(3, low, high, bodies, "actor", gaussian, temperature, initial_alpha=0.7)


def fixed_batch(seed, n=16, action_dim=2, keys=("noise",)):
    rng = np.random.default_rng(seed)
    inputs = agent_inputs(rng.standard_normal((n, 3)).astype("float32"),
                          rng.uniform(-1, 1, (n, action_dim)).astype("float32"))
    targets = {"reward": rng.standard_normal(n).astype("float32"),
               "next_obs": rng.standard_normal((n, 3)).astype("float32"),
               "terminated": (rng.random(n) < 0.3).astype("float32")}
    for key in keys:
        targets[key] = (3 * rng.standard_normal((n, action_dim))).astype("float32")  # some clipped
    return inputs, targets


def moved_apart(model, target):
    """Moves the online weights away from the target copy, so a loss that read the wrong one fails."""
    for i, v in enumerate(model.weights):
        v.assign(v + 0.05 * (i % 3 + 1))
    assert any(not np.array_equal(a, b) for a, b in zip(weights(target.target_weights),
                                                        weights(target.source_weights)))


def td3_setup(seed=0):
    model = small_model(seed)
    target = mh.TargetNetwork(model, heads=["actor", "q1", "q2"], tau=TAU, every=2)
    moved_apart(model, target)
    return model, target, td3_losses(model, target, GAMMA, SIGMA, CLIP, LOW, HIGH)


# -- losses against numpy ------------------------------------------------------------------


@pytest.mark.parametrize("critic", ["q1", "q2"])
def test_critic_loss_is_clipped_double_q_with_smoothed_target_action(critic):
    model, target, losses = td3_setup()
    inputs, targets = fixed_batch(1)
    q = model(inputs)[critic]
    ours = float(losses[critic](inputs, targets, q))

    obs, action, next_obs = (np.float64(inputs["obs"]), np.float64(inputs["action"]),
                             np.float64(targets["next_obs"]))
    half = (np.array(HIGH) - LOW) / 2
    eps = np.clip(SIGMA * targets["noise"], -CLIP, CLIP) * half
    next_action = np.clip(np_actor(target.heads["actor"], next_obs) + eps, LOW, HIGH)
    next_q = np.minimum(np_critic(target.heads["q1"], next_obs, next_action),
                        np_critic(target.heads["q2"], next_obs, next_action))
    y = targets["reward"] + GAMMA * (1 - targets["terminated"]) * next_q
    expected = np.mean((np_critic(model.heads[critic], obs, action) - y) ** 2)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)


def test_actor_loss_is_minus_mean_q1_of_the_actors_action():
    model, _, losses = td3_setup()
    inputs, targets = fixed_batch(2)
    ours = float(losses["actor"](inputs, targets, model(inputs)["actor"]))
    obs = np.float64(inputs["obs"])
    expected = -np.mean(np_critic(model.heads["q1"], obs, np_actor(model.heads["actor"], obs)))
    np.testing.assert_allclose(ours, expected, rtol=1e-5)


# -- the actor step: reads the critic, trains only the actor -------------------------------


def sgd_trainer(model, losses, target, every=1, schedule="sequential"):
    objectives = {h: mh.Objective(losses[h], keras.optimizers.SGD(0.1) if h == "actor"
                                  else keras.optimizers.Adam(1e-2), trains_trunk=False,
                                  every=every if h == "actor" else 1)
                  for h in model.head_names}
    return mh.Trainer(model, objectives, schedule=schedule, target_networks=[target])


def critic_state(model, trainer, heads=("q1", "q2")):
    return weights([v for h in heads for v in model.var_list(h)]
                   + [v for h in heads for v in trainer.optimizers[h].variables])


def test_actor_step_leaves_critics_and_their_slots_bitwise_and_follows_a_hand_written_tape():
    model, target, losses = td3_setup()
    trainer = sgd_trainer(model, losses, target)
    trainer.step(fixed_batch(3))  # every head once: the critics' Adam slots are not zero
    inputs, targets = fixed_batch(4)
    critics_before = critic_state(model, trainer)
    actor_vars = model.var_list("actor")
    with tf.GradientTape() as tape:  # by hand: -mean Q1(s, pi(s)) over the actor's variables
        action = model.heads["actor"](inputs)
        q1 = model.heads["q1"](agent_inputs(inputs["obs"], action))
        loss = -tf.reduce_mean(q1)
    expected = [v.numpy() - 0.1 * g.numpy() for v, g in zip(actor_vars, tape.gradient(loss, actor_vars))]

    result = trainer.step((inputs, targets), heads=["actor"])
    assert result.updated == ("actor",)
    # float32 rounding of a mean whose terms cancel: bounded by the terms' size, not the mean's
    scale = float(tf.reduce_mean(tf.abs(q1)))
    assert result.losses["actor"] == pytest.approx(float(loss), rel=1e-6, abs=1e-5 * scale)
    for a, b in zip(critic_state(model, trainer), critics_before):
        np.testing.assert_array_equal(a, b)
    assert [id(v) for v in trainer.optimizers["actor"]._trainable_variables] == [id(v) for v in actor_vars]
    for v, e in zip(actor_vars, expected):
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-6, atol=1e-7)


# -- delayed actor updates, Polyak targets after every second update -----------------------


def test_actor_updates_on_every_second_step_and_targets_are_exact_polyak_averages_after_them():
    model, target, losses = td3_setup()
    trainer = sgd_trainer(model, losses, target, every=2)
    for step in range(4):
        actor_before = weights(model.var_list("actor"))
        target_before = weights(target.target_weights)
        result = trainer.step(fixed_batch(10 + step))
        actor_moved = any(not np.array_equal(a, b) for a, b in zip(weights(model.var_list("actor")),
                                                                     actor_before))
        assert ("actor" in result.updated) == actor_moved == (step % 2 == 0)
        assert {"q1", "q2"} <= set(result.updated)
        now = weights(target.target_weights)
        if step % 2 == 0:  # update() calls 1, 3: not due
            for a, b in zip(now, target_before):
                np.testing.assert_array_equal(a, b)
        else:  # calls 2, 4: tau * (online weights after this step) + (1 - tau) * old, in float32
            for new, old, src in zip(now, target_before, weights(target.source_weights)):
                np.testing.assert_array_equal(
                    new, np.float32(TAU) * src + (np.float32(1.0) - np.float32(TAU)) * old)
    assert int(target.counter) == 4


# -- the task through the CLI --------------------------------------------------------------


SMOKE = ["train.steps=300", "td3.start_steps=100", "td3.learning_starts=100", "train.batch_size=32",
         "train.eval_every=150", "env.eval_episodes=2", "log.every=50",
         "model.heads.q1.layers.mlp.units=[16]", "model.heads.q2.layers.mlp.units=[16]",
         "model.heads.actor.layers.mlp.units=[16]"]


def cli_run(config, sets, run_dir):
    assert run_experiment(config, run_dir=str(run_dir), overrides=sets, quiet=True).exit_code == 0
    return json.loads((run_dir / "metrics.json").read_text())


def reevaluate(config, sets, run_dir, act_of):
    """The final evaluation repeated by hand: the saved model in fresh Pendulum episodes seeded
    as the run's evaluations are (10,000 + seed + i), acting with `act_of(model)`."""
    from multihead.experiments.config.schema import load_config
    from multihead.experiments.run import runner as tasks

    fresh = tasks.prepare(load_config(config, sets)).model
    mh.restore_checkpoint(str(run_dir / "checkpoints" / "final"), fresh)
    act, returns = act_of(fresh), []
    for i in range(2):
        env = gymnasium.make("Pendulum-v1")
        obs, _ = env.reset(seed=10_000 + 0 + i)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(act(obs[None].astype("float32"))[0].astype("float32"))
            total, done = total + r, term or trunc
        returns.append(total)
    return float(np.mean(returns))


def test_pendulum_smoke_run_through_the_cli_writes_metrics_of_its_evaluations(tmp_path):
    run_dir = tmp_path / "run"
    metrics = cli_run(CONFIG, SMOKE, run_dir)
    assert metrics["task"] == "td3" and metrics["env_steps"] == 300
    assert metrics["updates"] == 200 == metrics["target_updates"]  # env steps 101..300
    assert [e["env_steps"] for e in metrics["evals"]] == [150, 300]
    assert metrics["eval_episodes"] == 2 and metrics["episodes"] == 1  # 200-step episodes
    assert set(metrics["final_loss"]) == {"q1", "q2", "actor"}
    act_of = lambda m: lambda obs: np_actor(m.heads["actor"], np.float64(obs), [-2.0], [2.0])  # noqa: E731
    assert reevaluate(CONFIG, SMOKE, run_dir, act_of) == pytest.approx(metrics["eval_mean_return"], rel=1e-4)


@pytest.mark.parametrize("override,message", [
    ("td3.critic_heads=[q1]", "td3.critic_heads: name two heads (the twin critics), got ['q1']"),
    ("td3.tau=0", "td3.tau: must satisfy 0 < tau <= 1, got 0.0"),
    ("model.trunk={mlp: {units: [8]}}", "model.trunk: task td3 needs {class_name: Identity}"),
    ("env.id=CartPole-v1", "env.id: 'CartPole-v1' has action space Discrete(2); the td3 and sac "
                           "tasks need a Box one"),
    ("model.heads.actor.loss=huber", "model.heads.actor.loss: set by task td3; leave it out"),
    ("model.heads.q1.every=2", "model.heads.q1.every: the critics update on every step"),
    ("td3.actor_head=pi", "td3.actor_head: the model has no head 'pi'"),
    ("td3.policy_noise=-1", "td3.policy_noise"),
])
def test_bad_config_is_one_line_error_exit_2_nothing_written(tmp_path, capsys, override, message):
    assert_train_refuses(CONFIG, override, message, tmp_path, capsys)


def reaches_minus_200(config, seed):
    """Whether an evaluation (10 episodes) of the committed config reaches a mean return of -200
    within its 20,000 environment steps."""
    from multihead.experiments.config.schema import load_config
    from multihead.experiments.run import runner as tasks

    metrics = tasks.prepare(load_config(config, [f"seed={seed}"])).run(None, verbose=False)
    assert metrics["env_steps"] <= 20_000 and metrics["eval_episodes"] == 10
    return any(e["mean_return"] >= -200 for e in metrics["evals"])


@pytest.mark.slow
def test_committed_config_reaches_minus_200_within_20k_steps_on_2_of_3_seeds():
    """The result of benchmarks/rl_pendulum.py --tasks td3 (minutes per seed on 2 cores)."""
    assert sum(reaches_minus_200(CONFIG, seed) for seed in (0, 1, 2)) >= 2
