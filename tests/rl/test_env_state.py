"""env_state: a classic-control environment saved mid-episode and restored into a fresh one
continues exactly; an environment with an unknown layer is not restorable."""

import gymnasium
import numpy as np
import pytest

from multihead.rl import env_state
from multihead.rl.host_state import from_json, to_json


@pytest.mark.parametrize("env_id,action", [("CartPole-v1", 1), ("Pendulum-v1", np.array([0.7], np.float32)),
                                           ("MountainCar-v0", 2), ("Acrobot-v1", 0)])
def test_a_restored_environment_continues_exactly(env_id, action):
    env = gymnasium.make(env_id, max_episode_steps=30)
    env.reset(seed=5)
    for _ in range(7):
        env.step(action)
    saved = from_json(to_json(env_state.snapshot(env)))  # as a checkpoint stores it

    def continue_(e):  # past the time limit: the truncation and the next reset's start state
        out = []
        for _ in range(30):
            obs, reward, term, trunc, _ = e.step(action)
            out.append((obs, reward, term, trunc))
            if term or trunc:
                out.append((e.reset()[0],))
        return out

    expected = continue_(env)
    fresh = gymnasium.make(env_id, max_episode_steps=30)
    fresh.reset(seed=123)
    env_state.restore(fresh, saved)
    for a, b in zip(expected, continue_(fresh), strict=True):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


class _Unknown(gymnasium.Wrapper):
    """A wrapper that might hold state of its own."""


def test_an_unknown_layer_is_not_restorable():
    env = _Unknown(gymnasium.make("CartPole-v1"))
    env.reset(seed=0)
    assert env_state.restorable(gymnasium.make("CartPole-v1"))
    assert not env_state.restorable(env) and env_state.snapshot(env) is None
    with pytest.raises(ValueError, match="cannot be restored"):
        env_state.restore(env, {"wrappers": [], "env": {}, "np_random": {}})
