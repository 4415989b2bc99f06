"""Synchronous advantage actor-critic's agent pieces (A2C; Mnih et al., ICML 2016): n-step
returns, the policy-gradient loss, the research losses of a policy and a value head, the
rollout batch they read, and sampling from the policy."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from multihead._autograph import plain
from multihead.training.keras_model import MultiHeadModel
from multihead.objectives.objective import HeadLoss, LossSpec, resolve_loss
from multihead.rl.driver import Experience
from multihead.rl.target_network import TargetNetwork


def nstep_returns(reward: Any, terminated: Any, ended: Any, next_value: Any, gamma: float) -> tf.Tensor:
    """Bootstrapped n-step returns of a rollout of `T` steps in `K` environments.

    Backwards over time, with `V(s_{t+1})` = `next_value[t]` (the value of the
    observation that followed step `t`, the final observation if the episode
    ended there):

        R_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1})   if the episode ended at t or t = T-1
        R_t = r_t + gamma * R_{t+1}                           otherwise

    so a time-limit truncation bootstraps from its final observation and a
    termination does not bootstrap.

    Args:
        reward: `(T, K)` rewards.
        terminated: `(T, K)` 1.0 where the episode terminated.
        ended: `(T, K)` 1.0 where the episode terminated or was truncated.
        next_value: `(T, K)` values of the next observations.
        gamma: discount.

    Returns:
        `(T, K)` returns.
    """
    reward = tf.cast(reward, tf.float32)
    terminated = tf.cast(terminated, tf.float32)
    ended = tf.cast(ended, tf.bool)
    next_value = tf.cast(next_value, tf.float32)
    steps = reward.shape[0]
    returns = [None] * steps
    following = next_value[steps - 1]
    for t in reversed(range(steps)):
        bootstrap = tf.where(ended[t], next_value[t], following) if t < steps - 1 else next_value[t]
        returns[t] = reward[t] + gamma * (1.0 - terminated[t]) * bootstrap
        following = returns[t]
    return tf.stack(returns)


def policy_gradient_loss(logits: Any, action: Any, advantage: Any, entropy_coef: float) -> tf.Tensor:
    """`-mean(log pi(a|s) * A) - entropy_coef * mean(H(pi(.|s)))` (Williams, 1992; Mnih et al., 2016).

    `advantage` is treated as a constant (`stop_gradient`).
    """
    log_pi = tf.nn.log_softmax(logits)
    log_pi_a = tf.gather(log_pi, tf.cast(action, tf.int32), axis=-1, batch_dims=1)
    entropy = -tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=-1)
    return -tf.reduce_mean(log_pi_a * tf.stop_gradient(advantage)) - entropy_coef * tf.reduce_mean(entropy)


def sample_actions(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row drawn from `softmax(logits)`, by inverting the CDF with one uniform
    draw per row (in float64, so rounding never yields an action past the last)."""
    logits = np.asarray(logits, np.float64)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    actions = (rng.random((len(logits), 1)) > np.cumsum(probs, axis=-1)).sum(axis=-1)
    return np.minimum(actions, logits.shape[-1] - 1)


def rollout_batch(steps: Sequence[Experience]) -> tuple[np.ndarray, Mapping[str, np.ndarray]]:
    """The batch `actor_critic_losses` reads, from `T` driver steps in `K` environments.

    Returns:
        `(obs (T*K, ...), {"action" (T*K,), "reward" (T, K), "terminated" (T, K),
        "ended" (T, K), "next_obs" (T*K, ...)})`, rows in time-major order.
    """
    rollout = Experience(*(np.stack(field) for field in zip(*steps)))
    rows = (-1,) + rollout.obs.shape[2:]
    return rollout.obs.reshape(rows), {
        "action": rollout.action.reshape(-1), "reward": rollout.reward,
        "terminated": rollout.terminated, "ended": rollout.ended,
        "next_obs": rollout.next_obs.reshape(rows)}


def actor_critic_losses(
    model: MultiHeadModel,
    policy_head: str,
    value_head: str,
    gamma: float,
    entropy_coef: float,
    value_target: TargetNetwork | None = None,
    value_loss: LossSpec = "mse",
    normalize_advantages: bool = False,
) -> tuple[HeadLoss, HeadLoss]:
    """The research losses `(policy_loss, value_loss)` of an A2C rollout batch (`rollout_batch`).

    Returns bootstrap from `value_target` (or from V itself, under
    `stop_gradient`, if None). The losses only read `value_target`; its
    `update()` is the caller's, once per train step.

    Args:
        model: the online model.
        policy_head: the head of action logits.
        value_head: the state-value head (one output).
        gamma: discount.
        entropy_coef: weight of the entropy bonus of the policy loss.
        value_target: target network copying at least `value_head`, or None.
        value_loss: Keras loss between the returns and `V(s)`.
        normalize_advantages: scale advantages to zero mean, unit variance per batch.

    Raises:
        ValueError, TypeError: `value_loss` is not a Keras loss.
    """
    elementwise = resolve_loss(value_loss, value_head)

    def bootstrap(next_obs: Any) -> tf.Tensor:
        if value_target is not None:
            return value_target(next_obs)[value_head][:, 0]
        return tf.stop_gradient(model(next_obs, training=False)[value_head][:, 0])

    def returns(targets: Any) -> tf.Tensor:
        shape = tf.shape(targets["reward"])
        next_value = tf.reshape(bootstrap(targets["next_obs"]), shape)
        r = nstep_returns(targets["reward"], targets["terminated"], targets["ended"], next_value, gamma)
        return tf.stop_gradient(tf.reshape(r, [-1]))

    def policy_loss(inputs: Any, targets: Any, logits: Any) -> tf.Tensor:
        value = tf.stop_gradient(model(inputs, training=False)[value_head][:, 0])
        advantage = returns(targets) - value
        if normalize_advantages:
            mean, var = tf.nn.moments(advantage, axes=[0])
            advantage = (advantage - mean) / (tf.sqrt(var) + 1e-8)
        return policy_gradient_loss(logits, targets["action"], advantage, entropy_coef)

    def v_loss(inputs: Any, targets: Any, value: Any) -> tf.Tensor:
        return elementwise(inputs, {value_head: returns(targets)[:, None]}, value)

    return plain(policy_loss), plain(v_loss)  # no Python branch on a tensor
