"""Proximal policy optimization (PPO; Schulman et al., 2017, arXiv:1707.06347) as research
losses of a `MultiHeadModel`, with GAE (Schulman et al., 2016, arXiv:1506.02438).

A policy head gives the parameters of the action distribution (`Categorical` logits, or the
mean and log standard deviation of a `DiagonalGaussian`, whose log std is one variable of
the head: `GaussianPolicyHead`) and a value head `V(s)`. A rollout's advantages and returns
are computed once on the host (`prepare_rollout`, `gae`); then several epochs over minibatches
of the rollout (`minibatches`), each minibatch one train step:

* policy: `-mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A)) - c_e mean(H(pi(.|s)))`,
  `rho = pi(a|s) / pi_old(a|s)` (`clipped_surrogate`, `entropy`);
* value: `mean((V(s) - R)^2)`, or with `clip_range_vf` the larger of that and the error of
  `V_old + clip(V - V_old, -eps_v, eps_v)` (`value_loss`, as OpenAI baselines' ppo2).

`ppo_losses` gives them as one objective per head (each with its own optimizer on its own
var_list) or as one combined objective `policy + c_v value` that reads both heads.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import keras
import numpy as np
import tensorflow as tf

from multihead._autograph import plain
from multihead.objectives.objective import HeadLoss
from multihead.rl.actor_critic import sample_actions
from multihead.rl.driver import Experience


# -- advantages ---------------------------------------------------------------------------


def gae(reward: np.ndarray, value: np.ndarray, next_value: np.ndarray, terminated: np.ndarray,
        ended: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates and returns of a rollout of `T` steps in `K` environments.

    Backwards over time, with `V(s_{t+1})` = `next_value[t]` (the value of the observation
    that followed step `t`, the final observation where the episode ended):

        delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - ended_t) * A_{t+1}        (A_T = 0)

    so a time-limit truncation bootstraps from its final observation, a termination does
    not, and no advantage runs across an episode's end. The returns are `A_t + V(s_t)`.

    Args:
        reward, value, next_value, terminated, ended: `(T, K)` arrays.
        gamma: discount.
        lam: the GAE parameter lambda (1: Monte-Carlo returns, 0: one-step TD).

    Returns:
        `(advantages, returns)`, `(T, K)` float32 each.
    """
    reward, value, next_value = (np.asarray(a, np.float64) for a in (reward, value, next_value))
    keep = 1.0 - np.asarray(terminated, np.float64)
    go_on = 1.0 - np.asarray(ended, np.float64)
    delta = reward + gamma * keep * next_value - value
    advantage = np.zeros_like(delta)
    following = np.zeros(delta.shape[1:])
    for t in reversed(range(delta.shape[0])):
        following = delta[t] + gamma * lam * go_on[t] * following
        advantage[t] = following
    return advantage.astype(np.float32), (advantage + value).astype(np.float32)


def normalize(advantage: Any, epsilon: float = 1e-8) -> tf.Tensor:
    """`(A - mean(A)) / (std(A) + epsilon)` over a minibatch (population std)."""
    advantage = tf.cast(advantage, tf.float32)
    mean, var = tf.nn.moments(advantage, axes=[0])
    return (advantage - mean) / (tf.sqrt(var) + epsilon)


def explained_variance(returns: np.ndarray, values: np.ndarray) -> float:
    """`1 - Var(returns - values) / Var(returns)`: 1 for a perfect value function, 0 for a
    constant one, negative for one worse than a constant; nan when the returns are constant."""
    returns, values = np.asarray(returns, np.float64).ravel(), np.asarray(values, np.float64).ravel()
    var = np.var(returns)
    return float("nan") if var == 0 else float(1.0 - np.var(returns - values) / var)


# -- action distributions -----------------------------------------------------------------


class Categorical:
    """A distribution over `n` discrete actions, parameterised by logits `(B, n)`."""

    @staticmethod
    def log_prob(params: Any, action: Any) -> tf.Tensor:
        log_pi = tf.nn.log_softmax(tf.cast(params, tf.float32))
        return tf.gather(log_pi, tf.cast(action, tf.int32), axis=-1, batch_dims=1)

    @staticmethod
    def entropy(params: Any) -> tf.Tensor:
        log_pi = tf.nn.log_softmax(tf.cast(params, tf.float32))
        return -tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=-1)

    #: One action per row, by inverting the CDF with one uniform draw (float64).
    sample = staticmethod(sample_actions)

    @staticmethod
    def mode(params: np.ndarray) -> np.ndarray:
        return np.argmax(params, axis=-1)


class DiagonalGaussian:
    """A Gaussian with diagonal covariance over `d` action dimensions, parameterised by
    `(B, 2 d)`: the means, then the log standard deviations. Actions are not squashed: the
    environment receives them clipped to its bounds, the losses see them as sampled."""

    @staticmethod
    def log_prob(params: Any, action: Any) -> tf.Tensor:
        mean, log_std = tf.split(tf.cast(params, tf.float32), 2, axis=-1)
        z = (tf.cast(action, tf.float32) - mean) * tf.exp(-log_std)
        return tf.reduce_sum(-0.5 * tf.square(z) - log_std - 0.5 * math.log(2.0 * math.pi), axis=-1)

    @staticmethod
    def entropy(params: Any) -> tf.Tensor:
        _, log_std = tf.split(tf.cast(params, tf.float32), 2, axis=-1)
        return tf.reduce_sum(log_std + 0.5 * (1.0 + math.log(2.0 * math.pi)), axis=-1)

    @staticmethod
    def sample(params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mean, log_std = np.split(np.asarray(params, np.float64), 2, axis=-1)
        return (mean + np.exp(log_std) * rng.standard_normal(mean.shape)).astype(np.float32)

    @staticmethod
    def mode(params: np.ndarray) -> np.ndarray:
        return np.split(np.asarray(params), 2, axis=-1)[0].astype(np.float32)


Distribution = type[Categorical] | type[DiagonalGaussian]


@keras.saving.register_keras_serializable(package="multihead")
class GaussianPolicyHead(keras.layers.Layer):
    """`body(x)` as the means of a diagonal Gaussian, with a state-independent log standard
    deviation: one variable `log_std` of the head (in its var_list), output beside the
    means as `(B, 2 d)`.

    Args:
        body: layers ending in `d` outputs (the means).
        action_dim: `d`.
        log_std_init: the log standard deviation to start from.
    """

    def __init__(self, body: keras.layers.Layer, action_dim: int, log_std_init: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.body = body
        self.action_dim = int(action_dim)
        self.log_std_init = float(log_std_init)
        self.log_std = self.add_weight(shape=(self.action_dim,), name="log_std",
                                       initializer=keras.initializers.Constant(self.log_std_init))

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        mean = self.body(inputs, training=training)
        log_std = tf.broadcast_to(tf.cast(tf.convert_to_tensor(self.log_std), mean.dtype), tf.shape(mean))
        return tf.concat([mean, log_std], axis=-1)

    def compute_output_shape(self, input_shape: Any) -> Any:
        shape = self.body.compute_output_shape(input_shape)
        return tuple(shape[:-1]) + (2 * self.action_dim,)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "body": keras.layers.serialize(self.body),
                "action_dim": self.action_dim, "log_std_init": self.log_std_init}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        config["body"] = keras.layers.deserialize(config["body"])
        return cls(**config)


# -- losses -------------------------------------------------------------------------------


def clipped_surrogate(log_prob: Any, old_log_prob: Any, advantage: Any, clip_range: Any) -> tf.Tensor:
    """`-mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))`, `rho = exp(log_prob - old_log_prob)`."""
    ratio = tf.exp(log_prob - tf.cast(old_log_prob, tf.float32))
    advantage = tf.cast(advantage, tf.float32)
    clipped = tf.clip_by_value(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return -tf.reduce_mean(tf.minimum(ratio * advantage, clipped * advantage))


def value_loss(value: Any, returns: Any, old_value: Any, clip_range_vf: Any = None) -> tf.Tensor:
    """`mean((V - R)^2)`; with `clip_range_vf`, `mean(max((V - R)^2, (V_clip - R)^2))`,
    `V_clip = V_old + clip(V - V_old, -eps_v, eps_v)` (OpenAI baselines' ppo2)."""
    value, returns = tf.cast(value, tf.float32), tf.cast(returns, tf.float32)
    error = tf.square(value - returns)
    if clip_range_vf is None:
        return tf.reduce_mean(error)
    old_value = tf.cast(old_value, tf.float32)
    clipped = old_value + tf.clip_by_value(value - old_value, -clip_range_vf, clip_range_vf)
    return tf.reduce_mean(tf.maximum(error, tf.square(clipped - returns)))


def approx_kl(log_prob: Any, old_log_prob: Any) -> tf.Tensor:
    """`mean((rho - 1) - log rho)`: an unbiased, non-negative estimate of KL(pi_old || pi)
    from actions drawn by pi_old (Schulman's k3 estimator, as Stable-Baselines3 logs it)."""
    log_ratio = tf.cast(log_prob, tf.float32) - tf.cast(old_log_prob, tf.float32)
    return tf.reduce_mean(tf.exp(log_ratio) - 1.0 - log_ratio)


def clip_fraction(log_prob: Any, old_log_prob: Any, clip_range: Any) -> tf.Tensor:
    """The fraction of rows whose ratio lies outside `[1 - eps, 1 + eps]`."""
    ratio = tf.exp(tf.cast(log_prob, tf.float32) - tf.cast(old_log_prob, tf.float32))
    return tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > clip_range, tf.float32))


#: The keys of a PPO minibatch's targets: the rollout's actions, their log-probabilities
#: under the policy that acted, the advantages, the returns and the values of that time.
BATCH_KEYS = ("action", "log_prob", "advantage", "returns", "value")


def ppo_losses(distribution: Distribution, policy_head: str, value_head: str,
               clip_range: tf.Variable, ent_coef: float, clip_range_vf: float | None = None,
               normalize_advantages: bool = True, separate: bool = True,
               vf_coef: float = 0.5) -> dict[str, HeadLoss]:
    """The research losses of a PPO minibatch `(obs, {action, log_prob, advantage, returns, value})`.

    Args:
        distribution: `Categorical` or `DiagonalGaussian`, of the policy head's output.
        policy_head, value_head: the heads.
        clip_range: `eps`, a variable (the caller may decay it between updates).
        ent_coef: weight `c_e` of the entropy bonus.
        clip_range_vf: `eps_v` of the clipped value loss; None: unclipped.
        normalize_advantages: normalize the advantages of each minibatch (`normalize`).
        separate: True: `{policy_head: policy loss, value_head: value loss}`, one objective per
            head (the value loss is weighted by its objective's `weight`). False:
            `{policy_head: policy loss + vf_coef * value loss}`, one objective that reads the
            prediction `combined_prediction` of both heads.
        vf_coef: `c_v`, the value loss's weight in the combined objective.
    """

    def policy_part(targets: Any, params: Any) -> tf.Tensor:
        advantage = targets["advantage"]
        if normalize_advantages:
            advantage = normalize(advantage)
        log_prob = distribution.log_prob(params, targets["action"])
        surrogate = clipped_surrogate(log_prob, targets["log_prob"], advantage, clip_range)
        return surrogate - ent_coef * tf.reduce_mean(distribution.entropy(params))

    def value_part(targets: Any, value: Any) -> tf.Tensor:
        return value_loss(value[:, 0], targets["returns"], targets["value"], clip_range_vf)

    if separate:  # no Python branch on a tensor: traced without autograph
        return {policy_head: plain(lambda inputs, targets, params: policy_part(targets, params)),
                value_head: plain(lambda inputs, targets, value: value_part(targets, value))}

    def combined(inputs: Any, targets: Any, prediction: Any) -> tf.Tensor:
        params, value = prediction[:, :-1], prediction[:, -1:]
        return policy_part(targets, params) + vf_coef * value_part(targets, value)

    return {policy_head: plain(combined)}


def combined_prediction(policy_head: str, value_head: str) -> Callable[[Mapping[str, Any]], tf.Tensor]:
    """What the combined objective reads: `concat(policy output, V(s))`, `(B, P + 1)`."""
    return lambda outputs: tf.concat([tf.cast(outputs[policy_head], tf.float32),
                                      tf.cast(outputs[value_head], tf.float32)], axis=-1)


def rollout_statistics(distribution: Distribution, params: Any, action: Any, old_log_prob: Any,
                       clip_range: float) -> dict[str, float]:
    """`approx_kl`, `clip_fraction` and `entropy` of the policy `params` (after an update) on
    the rollout that `old_log_prob`'s policy acted."""
    log_prob = distribution.log_prob(params, action)
    return {"approx_kl": float(approx_kl(log_prob, old_log_prob)),
            "clip_fraction": float(clip_fraction(log_prob, old_log_prob, clip_range)),
            "entropy": float(tf.reduce_mean(distribution.entropy(params)))}


# -- rollouts -----------------------------------------------------------------------------


class Rollout(NamedTuple):
    """A rollout of `T` steps in `K` environments, ready for the minibatch steps.

    Attributes:
        obs: `(T*K, *obs_shape)` observations acted on, rows in time-major order.
        targets: the `multihead.rl.ppo.BATCH_KEYS` arrays, `(T*K, ...)` each.
        explained_variance: of the values by the returns (`explained_variance`).
    """

    obs: np.ndarray
    targets: dict[str, np.ndarray]
    explained_variance: float


def prepare_rollout(steps: Sequence[Experience], actions: Sequence[np.ndarray],
                    outputs: Any, distribution: Distribution, policy_head: str, value_head: str,
                    gamma: float, lam: float) -> Rollout:
    """GAE advantages, returns and the acting policy's log-probabilities of a rollout.

    Args:
        steps: the `T` driver steps.
        actions: the `T` actions as sampled (`(K,)` or `(K, d)`; unclipped for a Box).
        outputs: observations `(n, ...)` -> the model's outputs `{head: (n, ...)}`.
        distribution: the policy head's distribution.
        policy_head, value_head: the heads.
        gamma, lam: discount and GAE lambda.
    """
    obs = np.stack([s.obs for s in steps])
    t, k = obs.shape[:2]
    rows = (t * k,) + obs.shape[2:]
    obs, next_obs = obs.reshape(rows), np.stack([s.next_obs for s in steps]).reshape(rows)
    out = outputs(np.concatenate([obs, next_obs]))
    params = out[policy_head][: t * k]
    values = out[value_head][:, 0].numpy()
    value, next_value = values[: t * k].reshape(t, k), values[t * k:].reshape(t, k)
    reward, terminated, ended = (np.stack([getattr(s, f) for s in steps])
                                 for f in ("reward", "terminated", "ended"))
    advantage, returns = gae(reward, value, next_value, terminated, ended, gamma, lam)
    action = np.stack(actions)
    action = action.reshape((t * k,) + action.shape[2:])
    log_prob = distribution.log_prob(params, action).numpy()
    targets = {"action": action, "log_prob": log_prob, "advantage": advantage.reshape(-1),
               "returns": returns.reshape(-1), "value": value.reshape(-1).astype(np.float32)}
    return Rollout(obs, targets, explained_variance(returns, value))


def minibatches(rows: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's shuffled row indices in minibatches of `batch_size` (the last may be smaller)."""
    order = rng.permutation(rows)
    return [order[i:i + batch_size] for i in range(0, rows, batch_size)]


def update_batches(rollout: Rollout, batch_size: int, rng: np.random.Generator,
                   epochs: int) -> tf.data.Dataset:
    """`epochs` epochs of `minibatches` of `rollout` as one dataset of `(obs, targets)` batches,
    for one compiled multi-step call (`Trainer.run_steps`): the same rows in the same order
    and the same generator draws as `epochs` calls of `minibatches`. The batches are gathered
    on the host; with a rollout a multiple of `batch_size` each has that static shape, else
    the batch dimension is unknown (an epoch ends with a smaller batch)."""
    obs, targets = rollout.obs, rollout.targets
    rows = len(obs)
    order = np.concatenate([np.concatenate(minibatches(rows, batch_size, rng)) for _ in range(epochs)])
    arrays = (obs[order], {k: v[order] for k, v in targets.items()})
    if rows % batch_size == 0:
        return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(
            lambda a: a.reshape((-1, batch_size) + a.shape[1:]), arrays))
    per_epoch = tf.nest.map_structure(lambda a: a.reshape((epochs, rows) + a.shape[1:]), arrays)
    return tf.data.Dataset.from_tensor_slices(per_epoch).flat_map(
        lambda x, t: tf.data.Dataset.from_tensor_slices((x, t)).batch(batch_size))
