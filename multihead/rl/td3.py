"""TD3 (Fujimoto, van Hoof & Meger, ICML 2018) as research losses of a `MultiHeadModel`.

The model (`multihead.rl.continuous`): a trunk without variables, an actor head
`pi(s)` (tanh-squashed onto the action bounds) and twin critic heads `Q1(s, a)`,
`Q2(s, a)`, each with its own optimizer on its own variables. One
`TargetNetwork(model, heads=[actor, q1, q2], tau=0.005, every=2)` holds the
target actor and critics, a Polyak step after every second update.

* Critics: `(Q_i(s, a) - y)^2` with the clipped double-Q target
  `y = r + gamma * (1 - terminated) * min_i Q_i'(s', a')` and target-policy
  smoothing `a' = clip(pi'(s') + clip(sigma * z, -c, c) * half_range, low, high)`.
  One Adam on both critics minimising the sum of the two losses (the paper's code)
  takes the same steps as an Adam per critic: Adam is per parameter.
* Actor: `-mean Q1(s, pi(s))`, read through the critic; its objective trains the
  actor head only (`trains_trunk=False`, a trunk without variables) and is due on
  every second step (`Objective(every=2)`: delayed policy updates).

The noise `z ~ N(0, 1)` comes with the batch (`targets["noise"]`, `(n, action_dim)`),
drawn by the caller's seeded generator, so the losses are functions of the batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from multihead._autograph import plain
from multihead.training.keras_model import MultiHeadModel
from multihead.objectives.objective import HeadLoss, LossSpec, resolve_loss
from multihead.rl.continuous import OBS, action_bounds, agent_inputs, critic_value
from multihead.rl.target_network import TargetNetwork


def clipped_double_q_target(reward: Any, terminated: Any, next_q1: Any, next_q2: Any,
                            gamma: float) -> tf.Tensor:
    """`r + gamma * (1 - terminated) * min(Q1'(s', a'), Q2'(s', a'))`, all `(n,)`."""
    reward, terminated = tf.cast(reward, tf.float32), tf.cast(terminated, tf.float32)
    return reward + gamma * (1.0 - terminated) * tf.minimum(next_q1, next_q2)


def smoothed_action(target_action: Any, noise: Any, sigma: float, clip: float,
                    low: Sequence[float], high: Sequence[float]) -> tf.Tensor:
    """Target-policy smoothing: `clip(a + clip(sigma * z, -c, c) * half_range, low, high)`.

    `sigma` and `clip` are in units of the half range of the action box (the paper's
    0.2 and 0.5 for actions in [-1, 1]).
    """
    _, half = action_bounds(low, high)
    eps = tf.clip_by_value(sigma * tf.cast(noise, tf.float32), -clip, clip) * half
    return tf.clip_by_value(target_action + eps, low, high)


def td3_losses(model: MultiHeadModel, target: TargetNetwork, gamma: float, policy_noise: float,
               noise_clip: float, low: Sequence[float], high: Sequence[float], actor: str = "actor",
               critics: Sequence[str] = ("q1", "q2"), td_loss: LossSpec = "mse") -> dict[str, HeadLoss]:
    """The research losses `{actor: ..., q1: ..., q2: ...}` of a replay batch
    `({"obs", "action"}, {"reward", "next_obs", "terminated", "noise"})`.

    Args:
        model: the online model (actor and critic heads).
        target: target network copying the actor and both critics.
        gamma: discount.
        policy_noise, noise_clip: target-policy smoothing (`smoothed_action`).
        low, high: the action bounds.
        actor: the actor head.
        critics: the two critic heads; the actor loss reads the first.
        td_loss: Keras loss between the target and `Q_i(s, a)`.
    """
    q1, q2 = critics

    def td_target(targets: Any) -> tf.Tensor:
        next_obs = tf.convert_to_tensor(targets["next_obs"], tf.float32)
        next_action = target(agent_inputs(next_obs, tf.zeros_like(targets["noise"])), [actor])[actor]
        next_action = smoothed_action(next_action, targets["noise"], policy_noise, noise_clip, low, high)
        next_q = target(agent_inputs(next_obs, next_action), [q1, q2])
        return tf.stop_gradient(clipped_double_q_target(
            targets["reward"], targets["terminated"], next_q[q1][:, 0], next_q[q2][:, 0], gamma))

    def critic_loss(head: str) -> HeadLoss:
        elementwise = resolve_loss(td_loss, head)
        return lambda inputs, targets, q: elementwise(inputs, {head: td_target(targets)[:, None]}, q)

    def actor_loss(inputs: Any, targets: Any, action: Any) -> tf.Tensor:
        return -tf.reduce_mean(critic_value(model, q1, inputs[OBS], action))

    # No Python branch on a tensor: traced without autograph.
    return {actor: plain(actor_loss), q1: plain(critic_loss(q1)), q2: plain(critic_loss(q2))}
