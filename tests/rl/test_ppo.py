"""PPO: GAE, advantage normalization, explained variance and the losses (clipped surrogate,
value loss and its clipped variant, Categorical and diagonal-Gaussian entropy) against numpy
written here; a PPO update leaves what an objective does not train (variables and optimizer
slots) bitwise unchanged, and equals a hand-written GradientTape loop in both optimizer
styles; short CartPole and Pendulum runs through the CLI write the logged statistics."""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import assert_train_refuses
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import load_config
from multihead.experiments.run import runner as tasks
from multihead.rl.driver import Experience
from multihead.rl.ppo import (
    Categorical,
    DiagonalGaussian,
    GaussianPolicyHead,
    approx_kl,
    clip_fraction,
    clipped_surrogate,
    combined_prediction,
    explained_variance,
    gae,
    minibatches,
    normalize,
    ppo_losses,
    prepare_rollout,
    value_loss,
)

gymnasium = pytest.importorskip("gymnasium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "experiments", "ppo_cartpole.yaml")
PENDULUM = os.path.join(ROOT, "experiments", "ppo_pendulum.yaml")


# -- advantages ---------------------------------------------------------------------------


def _gae_reference(r, v, next_v, term, ended, gamma, lam):
    """One environment at a time: TD errors, then the discounted sum of them up to the episode's
    end (the textbook definition), in float64."""
    T, K = r.shape
    adv = np.zeros((T, K))
    for k in range(K):
        for t in range(T):
            total, discount = 0.0, 1.0
            for u in range(t, T):
                delta = r[u, k] + gamma * (0.0 if term[u, k] else next_v[u, k]) - v[u, k]
                total += discount * delta
                if ended[u, k]:
                    break
                discount *= gamma * lam
            adv[t, k] = total
    return adv, adv + v


def test_gae_with_termination_and_truncation():
    r = np.ones((3, 2), "float32")
    v = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "float32")
    next_v = np.array([[3.0, 9.0], [7.0, 6.0], [8.0, 10.0]], "float32")
    term = np.array([[0, 0], [1, 0], [0, 0]], "float32")   # env 0 terminates at t=1
    ended = np.array([[0, 1], [1, 0], [0, 0]], "float32")  # env 1 is truncated at t=0
    gamma, lam = 0.5, 0.5
    # env 0: d2 = 1 + .5*8 - 5 = 0; d1 = 1 - 3 = -2 (terminal); d0 = 1 + .5*3 - 1 = 1.5
    #        A2 = 0, A1 = -2, A0 = 1.5 + .25 * -2 = 1.0
    # env 1: d2 = 1 + .5*10 - 6 = 0; d1 = 1 + .5*6 - 4 = 0; d0 = 1 + .5*9 - 2 = 3.5 (truncated:
    #        bootstraps from the final observation, A does not run on): A = 3.5, 0, 0
    adv, ret = gae(r, v, next_v, term, ended, gamma, lam)
    np.testing.assert_allclose(adv, [[1.0, 3.5], [-2.0, 0.0], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(ret, adv + v, rtol=1e-6)
    rng = np.random.default_rng(0)
    r, v, next_v = rng.standard_normal((3, 8, 5))
    term = (rng.random((8, 5)) < 0.2).astype("float32")
    ended = np.maximum(term, rng.random((8, 5)) < 0.2)
    for gamma, lam in [(0.99, 0.95), (0.9, 1.0), (0.98, 0.0)]:
        ours = gae(r, v, next_v, term, ended, gamma, lam)
        for a, b in zip(ours, _gae_reference(r, v, next_v, term, ended, gamma, lam)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_advantage_normalization_and_explained_variance():
    a = np.array([1.0, 2.0, 3.0, 6.0], "float32")
    # mean 3, population variance (4 + 1 + 0 + 9) / 4 = 3.5
    np.testing.assert_allclose(normalize(a), (a - 3.0) / (np.sqrt(3.5) + 1e-8), rtol=1e-6)
    returns, values = np.array([1.0, 2.0, 3.0, 6.0]), np.array([1.0, 3.0, 3.0, 5.0])
    # Var(returns) = 3.5, returns - values = (0, -1, 0, 1): variance 0.5 -> 1 - 0.5 / 3.5
    assert explained_variance(returns, values) == pytest.approx(1 - 0.5 / 3.5)
    assert explained_variance(returns, returns) == 1.0
    assert np.isnan(explained_variance(np.ones(4), values))


# -- losses -------------------------------------------------------------------------------


def test_clipped_surrogate_and_diagnostics_against_numpy():
    rng = np.random.default_rng(1)
    old = rng.standard_normal(64).astype("float32")
    new = (old + 0.3 * rng.standard_normal(64)).astype("float32")
    adv = rng.standard_normal(64).astype("float32")
    ratio = np.exp(new.astype(np.float64) - old)
    for eps in (0.1, 0.2):
        expected = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
        assert float(clipped_surrogate(new, old, adv, eps)) == pytest.approx(expected, rel=1e-5)
        assert float(clip_fraction(new, old, eps)) == pytest.approx(np.mean(np.abs(ratio - 1) > eps))
    assert float(approx_kl(new, old)) == pytest.approx(np.mean(ratio - 1 - np.log(ratio)), rel=1e-5)
    # one row by hand: rho = 1.5, A = 2, eps = 0.2 -> -min(3, 2.4) = -2.4; A = -2 -> -min(-3, -2.4) = 3
    assert float(clipped_surrogate([np.log(1.5)], [0.0], [2.0], 0.2)) == pytest.approx(-2.4)
    assert float(clipped_surrogate([np.log(1.5)], [0.0], [-2.0], 0.2)) == pytest.approx(3.0)


def test_value_loss_plain_and_clipped_against_numpy():
    value, returns, old = np.array([1.0, 3.0, -1.0]), np.array([2.0, 0.0, 0.0]), np.array([0.5, 2.0, 0.0])
    assert float(value_loss(value, returns, old)) == pytest.approx(np.mean((value - returns) ** 2))
    # eps_v = 0.2: V_clip = (0.7, 2.2, -0.2); errors (1, 9, 1) vs (1.69, 4.84, 0.04) -> max (1.69, 9, 1)
    assert float(value_loss(value, returns, old, 0.2)) == pytest.approx((1.69 + 9 + 1) / 3, rel=1e-6)


def test_categorical_and_gaussian_log_prob_and_entropy_against_numpy():
    logits = np.array([[0.0, np.log(3.0)], [0.0, 0.0]], "float32")  # pi = (.25, .75), (.5, .5)
    np.testing.assert_allclose(Categorical.log_prob(logits, [1, 0]), np.log([0.75, 0.5]), rtol=1e-6)
    np.testing.assert_allclose(Categorical.entropy(logits),
                               [-(0.25 * np.log(0.25) + 0.75 * np.log(0.75)), np.log(2.0)], rtol=1e-6)
    rng = np.random.default_rng(2)
    mean, log_std = rng.standard_normal((2, 5, 3))
    action = rng.standard_normal((5, 3))
    params = np.concatenate([mean, log_std], axis=-1).astype("float32")
    std = np.exp(log_std)
    density = np.exp(-0.5 * ((action - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi))
    np.testing.assert_allclose(DiagonalGaussian.log_prob(params, action), np.log(density).sum(-1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(DiagonalGaussian.entropy(params),
                               (0.5 * np.log(2 * np.pi * np.e * std ** 2)).sum(-1), rtol=1e-5)


def test_sampling_follows_the_distributions():
    rng = np.random.default_rng(3)
    logits = np.tile(np.log([[0.2, 0.8]]), (20000, 1))
    assert Categorical.sample(logits, rng).mean() == pytest.approx(0.8, abs=0.01)
    params = np.tile([[1.0, -3.0, np.log(0.5), np.log(2.0)]], (20000, 1))
    draws = DiagonalGaussian.sample(params, rng)
    np.testing.assert_allclose(draws.mean(0), [1.0, -3.0], atol=0.05)
    np.testing.assert_allclose(draws.std(0), [0.5, 2.0], atol=0.05)
    np.testing.assert_array_equal(DiagonalGaussian.mode(params[:1]), [[1.0, -3.0]])


# -- one update ---------------------------------------------------------------------------

OBS, ACTIONS, B = 4, 2, 32


def _model(seed, gaussian=False):
    keras.utils.set_random_seed(seed)
    policy = (GaussianPolicyHead(keras.layers.Dense(ACTIONS), ACTIONS, -0.5) if gaussian
              else keras.layers.Dense(ACTIONS))
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(16, activation="tanh")]),
                              {"policy": policy, "value": keras.layers.Dense(1)})
    model.build((None, OBS))
    return model


def _batch(seed, gaussian=False):
    rng = np.random.default_rng(seed)
    action = (rng.standard_normal((B, ACTIONS)) if gaussian else rng.integers(0, ACTIONS, B))
    return (rng.standard_normal((B, OBS)).astype("float32"),
            {"action": action.astype("float32") if gaussian else action,
             "log_prob": (rng.standard_normal(B) - 1.0).astype("float32"),
             "advantage": rng.standard_normal(B).astype("float32"),
             "returns": rng.standard_normal(B).astype("float32"),
             "value": rng.standard_normal(B).astype("float32")})


def _snapshot(variables):
    return [v.numpy().copy() for v in variables]


def _slots(optimizer):
    return [v.numpy().copy() for v in optimizer.variables if "iteration" not in v.path]


@pytest.mark.parametrize("gaussian", [False, True], ids=["categorical", "gaussian"])
@pytest.mark.parametrize("resting", ["policy", "value"])
def test_an_objectives_step_leaves_what_it_does_not_train_bitwise_unchanged(gaussian, resting):
    """Separate optimizers: on a step where only the other objective updates (`every=2`, step 1),
    the resting head's variables and its optimizer's slots are bitwise unchanged; the trained
    head and the shared trunk move. The Gaussian's log std belongs to the policy head."""
    model = _model(0, gaussian)
    clip = tf.Variable(0.2)
    losses = ppo_losses(DiagonalGaussian if gaussian else Categorical, "policy", "value", clip,
                        ent_coef=0.01, clip_range_vf=0.5)
    opts = {"policy": keras.optimizers.Adam(1e-2), "value": keras.optimizers.Adam(1e-2)}
    trainer = mh.Trainer(model, {h: mh.Objective(losses[h], opts[h], every=2 if h == resting else 1,
                                                 weight=0.5 if h == "value" else 1.0)
                                 for h in ("policy", "value")})
    for head in ("policy", "value"):  # each optimizer built on exactly trunk + its head
        assert [id(v) for v in opts[head]._trainable_variables] == [id(v) for v in model.var_list(head)]
    if gaussian:
        log_std = model.heads["policy"].log_std
        assert any(v is log_std for v in model.var_list("policy"))
        assert not any(v is log_std for v in model.var_list("value"))
    trainer.step(_batch(0, gaussian))
    active = "value" if resting == "policy" else "policy"
    rest_vars, rest_slots = _snapshot(model.head_variables(resting)), _slots(opts[resting])
    moving_vars, trunk = _snapshot(model.head_variables(active)), _snapshot(model.trunk_variables)
    result = trainer.step(_batch(1, gaussian))
    assert result.updated == (active,)
    for a, b in zip(rest_vars + rest_slots, _snapshot(model.head_variables(resting)) + _slots(opts[resting])):
        np.testing.assert_array_equal(a, b)
    assert all(not np.array_equal(a, b) for a, b in zip(moving_vars, _snapshot(model.head_variables(active))))
    assert any(not np.array_equal(a, b) for a, b in zip(trunk, _snapshot(model.trunk_variables)))


def _reference_losses(model, x, t, gaussian, eps, ent, eps_v):
    """The PPO losses written out with a plain forward pass."""
    out = model(x, training=True)
    params, v = out["policy"], out["value"][:, 0]
    if gaussian:
        mean, log_std = tf.split(params, 2, axis=-1)
        log_prob = tf.reduce_sum(-0.5 * tf.square((t["action"] - mean) / tf.exp(log_std)) - log_std
                                 - 0.5 * np.log(2 * np.pi), axis=-1)
        entropy = tf.reduce_sum(log_std + 0.5 * np.log(2 * np.pi * np.e), axis=-1)
    else:
        log_pi = tf.nn.log_softmax(params)
        log_prob = tf.gather(log_pi, t["action"], axis=1, batch_dims=1)
        entropy = -tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=-1)
    adv = (t["advantage"] - t["advantage"].mean()) / (t["advantage"].std() + 1e-8)
    ratio = tf.exp(log_prob - t["log_prob"])
    pg = -tf.reduce_mean(tf.minimum(ratio * adv, tf.clip_by_value(ratio, 1 - eps, 1 + eps) * adv))
    v_clip = t["value"] + tf.clip_by_value(v - t["value"], -eps_v, eps_v)
    vl = tf.reduce_mean(tf.maximum(tf.square(v - t["returns"]), tf.square(v_clip - t["returns"])))
    return pg - ent * tf.reduce_mean(entropy), vl


@pytest.mark.parametrize("gaussian", [False, True], ids=["categorical", "gaussian"])
@pytest.mark.parametrize("separate", [True, False], ids=["separate", "combined"])
def test_ppo_updates_equal_a_hand_written_loop(gaussian, separate):
    """Three minibatch steps: separate (each head's Adam on trunk + head, the value loss weighted
    0.5) or combined (one Adam on trunk + both heads, policy + 0.5 * value)."""
    eps, ent, eps_v, steps = 0.2, 0.01, 0.3, 3
    dist = DiagonalGaussian if gaussian else Categorical
    ours = _model(5, gaussian)
    losses = ppo_losses(dist, "policy", "value", tf.Variable(eps), ent, eps_v, separate=separate,
                        vf_coef=0.5)
    if separate:
        objectives = {"policy": mh.Objective(losses["policy"], keras.optimizers.Adam(1e-2)),
                      "value": mh.Objective(losses["value"], keras.optimizers.Adam(1e-2), weight=0.5)}
    else:
        objectives = {"policy": mh.Objective(losses["policy"], keras.optimizers.Adam(1e-2),
                                             reads=["policy", "value"],
                                             combine=combined_prediction("policy", "value"))}
    trainer = mh.Trainer(ours, objectives)
    if not separate:  # one optimizer on trunk + both heads
        built = {id(v) for v in objectives["policy"].optimizer._trainable_variables}
        assert built == {id(v) for v in ours.trainable_variables}
    for i in range(steps):
        trainer.step(_batch(i, gaussian))

    ref = _model(5, gaussian)
    heads = ("policy", "value") if separate else ("all",)
    var_lists = {"policy": ref.var_list("policy"), "value": ref.var_list("value"),
                 "all": ref.trainable_variables}
    ref_opts = {h: keras.optimizers.Adam(1e-2) for h in heads}
    for h in heads:
        ref_opts[h].build(var_lists[h])
    for i in range(steps):
        x, t = _batch(i, gaussian)
        with tf.GradientTape(persistent=True) as tape:
            pl, vl = _reference_losses(ref, x, t, gaussian, eps, ent, eps_v)
            loss = {"policy": pl, "value": 0.5 * vl, "all": pl + 0.5 * vl}
        for h in heads:
            grads = tape.gradient(loss[h], var_lists[h])
            ref_opts[h].apply_gradients(zip(grads, var_lists[h]))
        del tape
    for a, b in zip(ours.weights, ref.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=2e-5)


# -- rollouts -----------------------------------------------------------------------------


def test_prepare_rollout_against_numpy():
    """A fixed rollout of T=5 steps in K=3 environments: the log-probabilities of the acting
    policy, GAE advantages and returns, and the explained variance, recomputed here."""
    T, K, gamma, lam = 5, 3, 0.9, 0.8
    model = _model(2)
    rng = np.random.default_rng(4)
    obs, next_obs = rng.standard_normal((2, T, K, OBS)).astype("float32")
    term = (rng.random((T, K)) < 0.2).astype("float32")
    ended = np.maximum(term, rng.random((T, K)) < 0.2).astype("float32")
    reward = rng.standard_normal((T, K)).astype("float32")
    actions = [rng.integers(0, ACTIONS, K) for _ in range(T)]
    steps = [Experience(obs[t], actions[t], reward[t], next_obs[t], term[t], ended[t]) for t in range(T)]
    rollout = prepare_rollout(steps, actions, lambda x: model(x, training=False), Categorical,
                              "policy", "value", gamma, lam)
    out = {k: v.numpy().astype(np.float64) for k, v in model(obs.reshape(T * K, OBS)).items()}
    value = out["value"][:, 0].reshape(T, K)
    next_value = model(next_obs.reshape(T * K, OBS))["value"].numpy()[:, 0].reshape(T, K)
    adv, ret = _gae_reference(reward, value, next_value, term, ended, gamma, lam)
    logits = out["policy"]
    log_prob = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    a = np.concatenate(actions)
    np.testing.assert_array_equal(rollout.obs, obs.reshape(T * K, OBS))
    np.testing.assert_array_equal(rollout.targets["action"], a)
    np.testing.assert_allclose(rollout.targets["log_prob"], log_prob[np.arange(T * K), a], rtol=1e-5)
    np.testing.assert_allclose(rollout.targets["advantage"], adv.reshape(-1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rollout.targets["returns"], ret.reshape(-1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rollout.targets["value"], value.reshape(-1), rtol=1e-5)
    assert rollout.explained_variance == pytest.approx(1 - np.var(ret - value) / np.var(ret), rel=1e-4)
    batches = minibatches(T * K, 4, np.random.default_rng(0))
    assert [len(b) for b in batches] == [4, 4, 4, 3]
    assert sorted(np.concatenate(batches)) == list(range(T * K))


# -- runs through the CLI -----------------------------------------------------------------


def _scalars(directory):
    """tag -> [(step, value)] of the event files in `directory`."""
    found = {}
    for path in glob.glob(os.path.join(directory, "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                value = tf.make_ndarray(v.tensor) if v.HasField("tensor") else np.array(v.simple_value)
                if value.ndim == 0 and value.dtype.kind == "f":  # scalars, not histograms or text
                    found.setdefault(v.tag, []).append((event.step, float(value)))
    return found


def _cli(config, sets, run_dir):
    assert run_experiment(config, run_dir=str(run_dir), overrides=sets, quiet=True).exit_code == 0
    return json.loads((run_dir / "metrics.json").read_text())


CARTPOLE_SMOKE = ["train.steps=512", "train.eval_every=256", "ppo.num_envs=4", "ppo.n_steps=32",
                  "ppo.n_epochs=2", "train.batch_size=64", "env.eval_episodes=2", "log.every=4"]


@pytest.mark.parametrize("separate", [True, False], ids=["separate", "combined"])
def test_cartpole_smoke_run_through_the_cli_logs_the_update_statistics(tmp_path, separate):
    run_dir = tmp_path / "run"
    metrics = _cli(CARTPOLE, CARTPOLE_SMOKE + [f"ppo.separate_optimizers={str(separate).lower()}"],
                   run_dir)
    rollouts = 512 // (4 * 32)
    assert metrics["task"] == "ppo" and metrics["env_steps"] == 512
    assert metrics["updates"] == rollouts * 2 * (128 // 64)  # epochs * minibatches per rollout
    assert set(metrics["final_loss"]) == ({"policy", "value"} if separate else {"policy"})
    assert all(np.isfinite(v) for v in metrics["final_loss"].values())
    assert [e["env_steps"] for e in metrics["evals"]] == [256, 512]
    assert (run_dir / "checkpoints" / "final.index").exists()
    scalars = _scalars(run_dir / "train")
    for tag in ("ppo/approx_kl", "ppo/clip_fraction", "ppo/explained_variance", "ppo/entropy",
                "ppo/clip_range"):
        assert [s for s, _ in scalars[tag]] == [128 * (i + 1) for i in range(rollouts)], tag
    last = metrics["last_update"]
    for key in ("approx_kl", "clip_fraction", "explained_variance", "entropy"):
        assert scalars[f"ppo/{key}"][-1][1] == pytest.approx(last[key], rel=1e-6)
    assert last["approx_kl"] >= 0 and 0 <= last["clip_fraction"] <= 1 and last["explained_variance"] <= 1
    # linear decay: after the last rollout, 1 - 512 / 512 = 0; after the first, 1 - 128 / 512
    assert [v for _, v in scalars["ppo/clip_range"]] == pytest.approx([0.2 * (1 - i / 4) for i in (1, 2, 3, 4)])
    assert [v for _, v in scalars["ppo/epochs"]] == [2, 2, 2, 2]
    heads = ["policy", "value"] if separate else ["policy"]
    assert {f"loss/{h}" for h in heads} <= set(scalars)
    # the learning rate decays as the clip range: update steps 1-4 are rollout 1, 5-8 rollout 2, ...
    for h in heads:
        logged = scalars[f"lr/{h}"]
        assert len(logged) >= 4 and logged[-1][0] == 16
        assert [v for _, v in logged] == pytest.approx([1e-3 * (1 - np.ceil(s / 4) / 4) for s, _ in logged])


def test_target_kl_stops_an_update_after_the_epoch_that_exceeds_it(tmp_path):
    run_dir = tmp_path / "run"
    metrics = _cli(CARTPOLE, CARTPOLE_SMOKE + ["ppo.n_epochs=3", "ppo.target_kl=1e-12",
                                              "ppo.learning_rate_decay=constant"], run_dir)
    # every epoch moves the policy (KL > 1.5e-12; a constant learning rate, so the last rollout's
    # is not 0): one epoch of 2 minibatches per rollout
    assert metrics["updates"] == 4 * 1 * 2 and metrics["last_update"]["epochs"] == 1
    assert metrics["last_update"]["approx_kl"] > 1.5e-12


def test_pendulum_smoke_run_through_the_cli_trains_the_log_std(tmp_path):
    run_dir = tmp_path / "run"
    sets = ["train.steps=400", "train.eval_every=400", "ppo.num_envs=2", "ppo.n_steps=100",
            "ppo.n_epochs=2", "train.batch_size=50", "env.eval_episodes=1",
            "ppo.separate_optimizers=false", "ppo.clip_range_vf=0.5", "ppo.log_std_init=-0.5"]
    metrics = _cli(PENDULUM, sets, run_dir)
    assert metrics["env_steps"] == 400 and metrics["updates"] == 2 * 2 * 4
    fresh = tasks.prepare(load_config(PENDULUM, sets))
    log_std = fresh.model.heads["policy"].log_std
    np.testing.assert_array_equal(log_std.numpy(), [-0.5])
    mh.restore_checkpoint(str(run_dir / "checkpoints" / "final"), fresh.model)
    assert log_std.numpy()[0] != -0.5  # trained with the policy objective
    assert {"ppo/approx_kl", "ppo/explained_variance"} <= set(_scalars(run_dir / "train"))


@pytest.mark.parametrize("override,message", [
    ("model.heads.policy.loss=huber", "model.heads.policy.loss: the policy head's loss is set by the task"),
    ("model.heads.value.loss=huber", "model.heads.value.loss: PPO's value loss is the squared error"),
    ("train.batch_size=1024", "train.batch_size: the minibatch (1024) is larger than a rollout"),
    ("ppo.value_head=v", "ppo.value_head: the model has no head 'v'"),
    ("model.heads.value.layers={class_name: Dense, config: {units: 2}}",
     "the value head must output 1 value per example, it outputs shape (2,)"),
    ("ppo.clip_range_decay=cosine", "ppo.clip_range_decay"),
    ("model.heads.value.optimizer={class_name: Adam, config: {learning_rate: {module: "
     "keras.optimizers.schedules, class_name: ExponentialDecay, config: {initial_learning_rate: 0.001, decay_steps: 10, decay_rate: 0.9}}}}",
     "model.heads.value.optimizer: ppo.learning_rate_decay: linear scales a constant learning rate"),
    ("td3={}", "td3: only used with task td3"),
])
def test_bad_config_is_one_line_error_exit_2_nothing_written(tmp_path, capsys, override, message):
    assert_train_refuses(CARTPOLE, override, message, tmp_path, capsys)


@pytest.mark.slow
def test_committed_config_solves_cartpole_on_2_of_3_seeds():
    """PPO with the RL Zoo's settings reaches a mean evaluation return >= 475 (20 episodes)
    within 100,000 environment steps on at least 2 of seeds 0, 1, 2 (a few minutes each on
    2 cores)."""
    solved = []
    for seed in (0, 1, 2):
        metrics = tasks.prepare(load_config(CARTPOLE, [f"seed={seed}"])).run(None, verbose=False)
        solved.append((metrics["solved_at_env_steps"] or float("inf")) <= 100_000 + 256)  # + one rollout
        if sum(solved) >= 2:
            break
    assert sum(solved) >= 2, solved


@pytest.mark.slow
def test_committed_pendulum_config_reaches_sb3s_return():
    """PPO on Pendulum-v1 with the committed config ends 100k environment steps at a mean
    evaluation return >= -400, the low end of what SB3's PPO reaches there at that budget
    (docs/rl.md; -200 to -400), seed 0 (about 4 minutes on 2 cores)."""
    metrics = tasks.prepare(load_config(PENDULUM, ["seed=0"])).run(None, verbose=False)
    returns = [e["mean_return"] for e in metrics["evals"]]
    assert metrics["env_steps"] >= 100_000 and returns[-1] >= -400, returns

