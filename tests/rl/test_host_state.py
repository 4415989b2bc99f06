"""HostState: numpy arrays and JSON text through a tf.train.Checkpoint into fresh objects;
to_json round-trips floats, dtypes and generator states bitwise."""

import numpy as np
import pytest
import tensorflow as tf

from multihead.rl.host_state import HostState, from_json, generator_state, set_generator_state, to_json


def test_to_json_round_trips_values_dtypes_and_floats_bitwise():
    tree = {"a": np.array([0.1, 1 / 3, -0.0, np.nan, np.inf], np.float64),
            "b": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "c": (1, None, True),
            "d": [np.float32(0.1), np.int64(2**40)], "e": 2.0**-1074, "f": {"g": 10**30}}
    back = from_json(to_json(tree))
    np.testing.assert_array_equal(back["a"], tree["a"])
    assert back["a"].dtype == np.float64 and back["b"].dtype == np.float32
    np.testing.assert_array_equal(back["b"], tree["b"])
    assert back["c"] == (1, None, True) and back["f"] == {"g": 10**30} and back["e"] == 2.0**-1074
    assert back["d"][0] == np.float32(0.1) and back["d"][0].dtype == np.float32


def test_a_generator_state_restores_the_same_draws():
    rng = np.random.default_rng(3)
    rng.standard_normal(7)
    state = from_json(to_json(generator_state(rng)))
    expected = rng.standard_normal(5)
    other = np.random.default_rng(99)
    set_generator_state(other, state)
    np.testing.assert_array_equal(other.standard_normal(5), expected)
    with pytest.raises(ValueError, match="MT19937"):
        set_generator_state(np.random.Generator(np.random.MT19937(0)), state)


class _Box:
    def __init__(self, rows):
        self.rows = np.zeros((10, 3), np.float32)
        self.rows[:rows] = np.arange(rows * 3).reshape(rows, 3)
        self.size = rows

    def save(self):
        return {"rows": self.rows[:self.size], "meta": to_json({"size": self.size})}

    def load(self, saved):
        self.size = from_json(saved["meta"])["size"]
        self.rows[:self.size] = saved["rows"]


@pytest.mark.parametrize("rows", [0, 4, 10])
def test_host_state_restores_into_a_fresh_object(tmp_path, rows):
    box = _Box(rows)
    path = tf.train.Checkpoint(box=HostState(box.save, box.load)).write(str(tmp_path / "c"))
    box.rows[:] = -1.0  # written already: later changes do not reach the file
    fresh = _Box(0)
    tf.train.Checkpoint(box=HostState(fresh.save, fresh.load)).read(path).assert_consumed()
    assert fresh.size == rows
    np.testing.assert_array_equal(fresh.rows[:rows], np.arange(rows * 3).reshape(rows, 3))
    reader = tf.train.load_checkpoint(path)
    assert reader.get_variable_to_shape_map()["box/.ATTRIBUTES/rows"] == [rows, 3]  # the filled rows only
