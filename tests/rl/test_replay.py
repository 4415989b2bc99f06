"""ReplayBuffer.state/load_state: a fresh buffer restored from the state samples the same
batches and keeps writing at the same position."""

import numpy as np
import pytest

from multihead.rl.host_state import from_json, to_json
from multihead.rl.replay import ReplayBuffer


def _filled(n, seed=0):
    buffer = ReplayBuffer(8, (2,), seed=seed, action_shape=(1,), action_dtype="float32")
    for i in range(n):
        buffer.add(np.full(2, i), np.array([i / 10]), float(i), np.full(2, i + 1), i % 3 == 0)
    return buffer


@pytest.mark.parametrize("n", [3, 8, 13])  # partly filled, just full, wrapped around
def test_a_restored_buffer_samples_and_writes_as_the_original(n):
    buffer = _filled(n)
    buffer.sample(4)
    state = {k: (np.array(v) if not isinstance(v, str) else v) for k, v in buffer.state().items()}
    assert len(state["obs"]) == min(n, 8)
    fresh = _filled(0, seed=42)
    fresh.load_state(state)
    for b in (buffer, fresh):
        b.add(np.full(2, 99), np.array([9.9]), 9.0, np.full(2, 100), False)
    for a, b in zip(buffer.sample(16), fresh.sample(16), strict=True):
        np.testing.assert_array_equal(a, b)
    assert from_json(buffer.state()["position"]) == from_json(fresh.state()["position"])


def test_a_buffer_of_another_capacity_is_refused():
    state = _filled(3).state()
    with pytest.raises(ValueError, match="capacity 8, this one 4"):
        ReplayBuffer(4, (2,), action_shape=(1,), action_dtype="float32").load_state(state)
    position = from_json(state["position"])
    assert to_json(position)  # JSON-able
