"""DQN's agent pieces (Mnih et al., Nature 2015): the TD target, the research loss of a Q head
read against a `TargetNetwork`, and epsilon-greedy exploration.

Double DQN (van Hasselt et al., AAAI 2016) is a flag of the target: the online
network picks the next action, the target network evaluates it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from multihead._autograph import plain
from multihead.training.keras_model import MultiHeadModel
from multihead.objectives.objective import HeadLoss, LossSpec, resolve_loss
from multihead.rl.target_network import TargetNetwork


def td_target(reward: Any, terminated: Any, next_q_target: Any, gamma: float,
              next_q_online: Any | None = None) -> tf.Tensor:
    """One-step TD target `r + gamma * (1 - terminated) * Q'(s', a*)`.

    DQN: `a* = argmax_a Q'(s', a)`, i.e. `max_a Q'(s', a)`. Double DQN, when
    `next_q_online` is given: `a* = argmax_a Q(s', a)` from the online network,
    evaluated by `Q'`.

    Args:
        reward: `(n,)` rewards.
        terminated: `(n,)` 1.0 where `s'` is terminal, else 0.0.
        next_q_target: `(n, actions)` target-network Q values at `s'`.
        gamma: discount.
        next_q_online: `(n, actions)` online Q values at `s'` (double DQN) or None.

    Returns:
        `(n,)` float32 targets.
    """
    next_q_target = tf.convert_to_tensor(next_q_target, tf.float32)
    if next_q_online is None:
        next_value = tf.reduce_max(next_q_target, axis=-1)
    else:
        best = tf.argmax(next_q_online, axis=-1, output_type=tf.int32)
        next_value = tf.gather(next_q_target, best, axis=-1, batch_dims=1)
    reward = tf.cast(reward, tf.float32)
    terminated = tf.cast(terminated, tf.float32)
    return reward + gamma * (1.0 - terminated) * next_value


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Epsilon decayed linearly from `start` to `end` over `decay_steps` steps, then constant."""
    frac = min(step / decay_steps, 1.0)
    return start + frac * (end - start)


def epsilon_greedy(rng: np.random.Generator, epsilon: float, num_actions: int,
                   greedy: Callable[[], int]) -> int:
    """A uniformly random action with probability `epsilon`, else `greedy()`.

    `greedy` is called only on greedy steps, so random steps cost no inference.

    Args:
        rng: the generator of both draws (the coin, then the random action).
        epsilon: exploration probability in [0, 1].
        num_actions: number of discrete actions.
        greedy: returns the greedy action.
    """
    if rng.random() < epsilon:
        return int(rng.integers(num_actions))
    return int(greedy())


def dqn_loss(model: MultiHeadModel, target: TargetNetwork, head: str, gamma: float,
             double: bool = False, td_loss: LossSpec = "mse") -> HeadLoss:
    """The research loss of Q head `head`: `td_loss(td_target, Q(s, a))` over the batch.

    The batch is `(obs, {"action", "reward", "next_obs", "terminated"})`
    (`ReplayBuffer.as_targets`). The TD target is computed from `target` (and,
    for double DQN, the online model) under `stop_gradient`, so the gradient
    flows only through `Q(s, a)`. The loss only reads `target`; its `update()`
    is the caller's, once per train step.

    Args:
        model: the online model.
        target: target network copying at least `head`.
        head: the Q head (one output per action).
        gamma: discount.
        double: double DQN target.
        td_loss: Keras loss between target and `Q(s, a)` (`"mse"`, `"huber"`, ...).

    Raises:
        ValueError, TypeError: `td_loss` is not a Keras loss.
    """
    elementwise = resolve_loss(td_loss, head)

    def loss(inputs: Any, targets: Any, q: Any) -> tf.Tensor:
        action = tf.cast(targets["action"], tf.int32)
        q_sa = tf.gather(q, action, axis=-1, batch_dims=1)
        next_q_target = target(targets["next_obs"])[head]
        next_q_online = None
        if double:
            next_q_online = tf.stop_gradient(model(targets["next_obs"], training=False)[head])
        y = tf.stop_gradient(td_target(targets["reward"], targets["terminated"], next_q_target,
                                       gamma, next_q_online))
        return elementwise(inputs, {head: y[:, None]}, q_sa[:, None])

    return plain(loss)  # no Python branch on a tensor: traced without autograph
