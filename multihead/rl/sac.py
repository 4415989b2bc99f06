"""SAC (Haarnoja et al., ICML 2018; automatic temperature: Haarnoja et al., 2018,
arXiv:1812.05905) as research losses of a `MultiHeadModel`.

The model (`multihead.rl.continuous`): a trunk without variables, an actor head
giving the mean and log standard deviation of a Gaussian over `u` (the action is
`tanh(u)`, mapped onto the action bounds), twin critic heads `Q1(s, a)`, `Q2(s, a)`
and a temperature head holding one variable, `log_alpha`. Each has its own
optimizer on its own variables; `TargetNetwork(model, heads=[q1, q2], tau=0.005)`
holds the target critics.

* Critics: `(Q_i(s, a) - y)^2`, `y = r + gamma * (1 - terminated) *
  (min_i Q_i'(s', a') - alpha * log pi(a'|s'))` with `a' ~ pi(.|s')`.
* Actor: `mean(alpha * log pi(a|s) - min_i Q_i(s, a))`, `a = tanh(mean + std * z)`
  (reparameterised), read through the critics; it trains the actor head only.
* Temperature: `-mean(log_alpha * (log pi(a|s) + target_entropy))`, its own objective
  on its one-variable var_list; `target_entropy = -action_dim`.

`log pi` is the density of the squashed action in `[-1, 1]`: the Gaussian's, less
`sum log(1 - tanh(u)^2)` (the change of variables; the fixed map onto the bounds
only shifts it by a constant). The noise `z ~ N(0, 1)` comes with the batch:
`targets["noise"]` for `a` (actor and temperature), `targets["next_noise"]` for `a'`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from multihead._autograph import plain
from multihead.training.keras_model import MultiHeadModel
from multihead.objectives.objective import HeadLoss, LossSpec, resolve_loss
from multihead.rl.continuous import OBS, agent_inputs, critic_value, scale_actions
from multihead.rl.target_network import TargetNetwork

#: Bounds on the log standard deviation (as Stable-Baselines3 and Spinning Up clip it).
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def squashed_gaussian(params: Any, noise: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """A reparameterised sample `tanh(mean + std * z)` and its log-density.

    Args:
        params: `(n, 2 d)`: the means, then the log standard deviations (clipped to
            `[LOG_STD_MIN, LOG_STD_MAX]`).
        noise: `z`, `(n, d)`.

    Returns:
        `(action in [-1, 1] (n, d), log pi(action) (n,))`.
    """
    mean, log_std = tf.split(tf.cast(params, tf.float32), 2, axis=-1)
    log_std = tf.clip_by_value(log_std, LOG_STD_MIN, LOG_STD_MAX)
    noise = tf.cast(noise, tf.float32)
    u = mean + tf.exp(log_std) * noise
    gaussian = -0.5 * tf.square(noise) - log_std - 0.5 * math.log(2.0 * math.pi)
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), exact and finite for large |u|
    squash = 2.0 * (math.log(2.0) - u - tf.nn.softplus(-2.0 * u))
    return tf.tanh(u), tf.reduce_sum(gaussian - squash, axis=-1)


def sample_squashed(params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Host-side exploration: `tanh(mean + std * z)` per row, `z` from `rng`, in `[-1, 1]`."""
    mean, log_std = np.split(np.asarray(params, np.float64), 2, axis=-1)
    std = np.exp(np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX))
    return np.tanh(mean + std * rng.standard_normal(mean.shape))


def sac_losses(model: MultiHeadModel, target: TargetNetwork, gamma: float, low: Sequence[float],
               high: Sequence[float], actor: str = "actor", critics: Sequence[str] = ("q1", "q2"),
               temperature: str = "alpha", td_loss: LossSpec = "mse",
               target_entropy: float | None = None) -> dict[str, HeadLoss]:
    """The research losses `{actor, q1, q2, temperature}` of a replay batch
    `({"obs", "action"}, {"reward", "next_obs", "terminated", "noise", "next_noise"})`.

    Args:
        model: the online model (actor, critic and temperature heads).
        target: target network copying both critics.
        gamma: discount.
        low, high: the action bounds.
        actor, critics, temperature: the heads.
        td_loss: Keras loss between the target and `Q_i(s, a)`.
        target_entropy: the temperature's target; None: `-action_dim`.
    """
    q1, q2 = critics
    target_entropy = -float(len(low)) if target_entropy is None else float(target_entropy)

    def alpha() -> tf.Tensor:
        return tf.exp(tf.stop_gradient(tf.convert_to_tensor(model.heads[temperature].log_alpha)))

    def policy(obs: Any, noise: Any) -> tuple[tf.Tensor, tf.Tensor]:
        inputs = agent_inputs(obs, tf.zeros_like(noise))  # the actor reads obs only
        params = model.head_output(actor, model.features(inputs, training=True))
        return squashed_gaussian(params, noise)

    def td_target(targets: Any) -> tf.Tensor:
        next_obs = tf.convert_to_tensor(targets["next_obs"], tf.float32)
        squashed, log_pi = policy(next_obs, targets["next_noise"])
        next_q = target(agent_inputs(next_obs, scale_actions(squashed, low, high)), [q1, q2])
        soft = tf.minimum(next_q[q1][:, 0], next_q[q2][:, 0]) - alpha() * log_pi
        terminated = tf.cast(targets["terminated"], tf.float32)
        return tf.stop_gradient(tf.cast(targets["reward"], tf.float32) + gamma * (1.0 - terminated) * soft)

    def critic_loss(head: str) -> HeadLoss:
        elementwise = resolve_loss(td_loss, head)
        return lambda inputs, targets, q: elementwise(inputs, {head: td_target(targets)[:, None]}, q)

    def actor_loss(inputs: Any, targets: Any, params: Any) -> tf.Tensor:
        squashed, log_pi = squashed_gaussian(params, targets["noise"])
        action = scale_actions(squashed, low, high)
        q = tf.minimum(critic_value(model, q1, inputs[OBS], action),
                       critic_value(model, q2, inputs[OBS], action))
        return tf.reduce_mean(alpha() * log_pi - q)

    def temperature_loss(inputs: Any, targets: Any, log_alpha: Any) -> tf.Tensor:
        _, log_pi = policy(inputs[OBS], targets["noise"])
        return -tf.reduce_mean(log_alpha[:, 0] * tf.stop_gradient(log_pi + target_entropy))

    losses = {actor: actor_loss, q1: critic_loss(q1), q2: critic_loss(q2),
              temperature: temperature_loss}
    return {h: plain(f) for h, f in losses.items()}  # no Python branch on a tensor
