"""The heads of the continuous-control agents (TD3, SAC) and how they act.

The model's input is `{"obs": s, "action": a}` and its trunk holds no variables
(`keras.layers.Identity`): each head reads what it needs of the input itself, so
the actor and the critics share no variable and each objective's var_list is its
own head. A critic head computes `Q(s, a)` of the input's action; a loss that
needs `Q(s, pi(s))` calls the critic on the actor's output (`critic_value`).
Actions are in the environment's units (the bounds of its Box action space).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from multihead.rl.driver import Inference
from multihead.training.keras_model import MultiHeadModel

OBS, ACTION = "obs", "action"


def agent_inputs(obs: Any, action: Any) -> dict[str, Any]:
    """The model input of a batch: `{"obs": obs, "action": action}`."""
    return {OBS: obs, ACTION: action}


def action_bounds(low: Any, high: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """`(middle, half range)` of an action box."""
    low, high = tf.constant(low, tf.float32), tf.constant(high, tf.float32)
    return (high + low) / 2.0, (high - low) / 2.0


def scale_actions(squashed: Any, low: Sequence[float], high: Sequence[float]) -> tf.Tensor:
    """Actions in `[-1, 1]` mapped affinely onto the box `[low, high]`."""
    middle, half = action_bounds(low, high)
    return middle + half * squashed


class _BodyHead(keras.layers.Layer):
    """A head around hidden layers `body`, serialized with them (Keras' own format)."""

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "body": keras.layers.serialize(self.body)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        config["body"] = keras.layers.deserialize(config["body"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="multihead")
class PolicyHead(_BodyHead):
    """`obs -> body -> Dense(units)`, optionally `tanh`-squashed onto the box `[low, high]`.

    Args:
        body: the hidden layers (e.g. a Keras `Sequential` MLP).
        units: outputs per example (the action dimension for TD3's actor; twice it,
            mean and log standard deviation, for SAC's).
        low, high: the action bounds, one per output unit; None: no squashing.
    """

    def __init__(self, body: keras.layers.Layer, units: int, low: Sequence[float] | None = None,
                 high: Sequence[float] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.body = body
        self.units = int(units)
        self.low = None if low is None else [float(v) for v in low]
        self.high = None if high is None else [float(v) for v in high]
        self.out = keras.layers.Dense(self.units, name="out")

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        y = self.out(self.body(inputs[OBS], training=training))
        return y if self.low is None else scale_actions(tf.tanh(y), self.low, self.high)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "low": self.low, "high": self.high}


@keras.saving.register_keras_serializable(package="multihead")
class CriticHead(_BodyHead):
    """`Q(s, a)`: `concat(obs, action) -> body -> Dense(1)`.

    Args:
        body: the hidden layers.
    """

    def __init__(self, body: keras.layers.Layer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.body = body
        self.out = keras.layers.Dense(1, name="out")

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        joined = tf.concat([inputs[OBS], tf.cast(inputs[ACTION], inputs[OBS].dtype)], axis=-1)
        return self.out(self.body(joined, training=training))


@keras.saving.register_keras_serializable(package="multihead")
class TemperatureHead(keras.layers.Layer):
    """SAC's temperature: one variable `log_alpha`, output as a `(n, 1)` column.

    Args:
        initial_alpha: the temperature `alpha = exp(log_alpha)` to start from (> 0).
    """

    def __init__(self, initial_alpha: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.initial_alpha = float(initial_alpha)
        self.log_alpha = self.add_weight(
            shape=(), name="log_alpha",
            initializer=keras.initializers.Constant(float(np.log(self.initial_alpha))))

    def call(self, inputs: Any) -> Any:
        return tf.fill([tf.shape(inputs[OBS])[0], 1], tf.convert_to_tensor(self.log_alpha))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "initial_alpha": self.initial_alpha}


def critic_value(model: MultiHeadModel, head: str, obs: Any, action: Any) -> tf.Tensor:
    """`Q(obs, action)` of critic head `head`, `(n,)`, differentiable in `action` and in the
    critic's variables (a loss that trains only the actor takes no gradient of the latter)."""
    features = model.features(agent_inputs(obs, action), training=True)
    return model.head_output(head, features, training=True)[:, 0]


def actor_outputs(model: MultiHeadModel, head: str,
                  action_dim: int) -> Callable[[np.ndarray], tf.Tensor]:
    """Compiled inference of actor head `head` on a batch of observations, for acting."""
    def outputs(obs: Any) -> tf.Tensor:
        obs = tf.convert_to_tensor(obs, tf.float32)
        zeros = tf.zeros([tf.shape(obs)[0], action_dim], tf.float32)
        features = model.features(agent_inputs(obs, zeros), training=False)
        return model.head_output(head, features, training=False)

    return Inference(outputs)


def agent_model(obs_dim: int, low: Sequence[float], high: Sequence[float],
                bodies: Mapping[str, keras.layers.Layer], actor: str, gaussian: bool,
                temperature: str | None = None, initial_alpha: float = 1.0) -> MultiHeadModel:
    """A built model for TD3 (`gaussian=False`) or SAC (`gaussian=True`).

    Args:
        obs_dim: observation size.
        low, high: the action bounds (one per action dimension).
        bodies: head -> its hidden layers, for the actor and every critic (every head
            but `actor` is a critic).
        actor: the actor head: a deterministic action on the bounds (TD3), or the
            mean and log standard deviation of a squashed Gaussian (SAC).
        gaussian: which actor.
        temperature: SAC's temperature head, or None.
        initial_alpha: the temperature's start value.

    Example:
        >>> import keras
        >>> model = agent_model(3, [-2.0], [2.0], {"actor": keras.layers.Dense(8),
        ...                     "q1": keras.layers.Dense(8), "q2": keras.layers.Dense(8)},
        ...                     actor="actor", gaussian=False)
        >>> [v.shape for v in model.var_list("actor")]
        [(3, 8), (8,), (8, 1), (1,)]
    """
    action_dim = len(low)
    heads: dict[str, keras.layers.Layer] = {}
    for name, body in bodies.items():
        if name != actor:
            heads[name] = CriticHead(body, name=name)
        elif gaussian:
            heads[name] = PolicyHead(body, 2 * action_dim, name=name)
        else:
            heads[name] = PolicyHead(body, action_dim, low, high, name=name)
    if temperature is not None:
        heads[temperature] = TemperatureHead(initial_alpha, name=temperature)
    model = MultiHeadModel(keras.layers.Identity(name="trunk"), heads)
    model.build(agent_inputs((None, obs_dim), (None, action_dim)))
    return model
