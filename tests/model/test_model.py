"""MultiHeadModel: outputs per head, and the trunk/head partition by object identity."""

import keras
import numpy as np
import pytest

import multihead as mh
from conftest import make_model


def test_call_returns_one_output_per_head():
    model = make_model(heads=("a", "b", "c"))
    out = model(np.zeros((3, 5), "float32"))
    assert list(out) == ["a", "b", "c"]
    assert all(tuple(o.shape) == (3, 1) for o in out.values())


def test_var_list_is_trunk_then_head_by_identity():
    model = make_model()
    trunk_ids = [id(v) for v in model.trunk.trainable_variables]
    head_a = [id(v) for v in model.heads["a"].trainable_variables]
    assert [id(v) for v in model.trunk_variables] == trunk_ids
    assert [id(v) for v in model.head_variables("a")] == head_a
    assert [id(v) for v in model.var_list("a")] == trunk_ids + head_a
    assert [id(v) for v in model.var_list("a", trains_trunk=False)] == head_a
    every = {id(v) for v in model.trainable_variables}
    parts = trunk_ids + head_a + [id(v) for v in model.head_variables("b")]
    assert sorted(parts) == sorted(every) and len(parts) == len(every)


def test_two_models_built_twice_do_not_share_or_clash():
    first, second = make_model(seed=1), make_model(seed=1)
    ids = {id(v) for v in first.trainable_variables}
    assert not ids & {id(v) for v in second.trainable_variables}
    for a, b in zip(first.trainable_variables, second.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_layer_shared_by_trunk_and_head_is_an_error_naming_both():
    shared = keras.layers.Dense(3)
    model = mh.MultiHeadModel(trunk=keras.Sequential([shared]),
                              heads={"a": keras.Sequential([shared]), "b": keras.layers.Dense(1)})
    with pytest.raises(ValueError, match="owned by trunk and head 'a'"):
        model.build((None, 3))
        model.partition


def test_layer_shared_by_two_heads_is_an_error():
    shared = keras.layers.Dense(1)
    model = mh.MultiHeadModel(trunk=keras.layers.Dense(3), heads={"a": shared, "b": shared})
    model.build((None, 3))
    with pytest.raises(ValueError, match="owned by head 'a' and head 'b'"):
        model.partition


def test_variable_owned_by_no_part_is_an_error():
    class WithExtra(mh.MultiHeadModel):
        def __init__(self):
            super().__init__(trunk=keras.layers.Dense(3), heads={"a": keras.layers.Dense(1)})
            self.extra = keras.layers.Dense(2)

        def build(self, input_shape):
            super().build(input_shape)
            self.extra.build(input_shape)

    model = WithExtra()
    model.build((None, 3))
    with pytest.raises(ValueError, match="belongs neither to the trunk nor to any head"):
        model.partition


@pytest.mark.parametrize("name", ["", "a/b", "1x", "has space"])
def test_bad_head_names_are_refused(name):
    with pytest.raises(ValueError, match="head name"):
        mh.MultiHeadModel(trunk=keras.layers.Dense(3), heads={name: keras.layers.Dense(1)})


def test_unknown_head_and_unbuilt_model_errors():
    model = mh.MultiHeadModel(trunk=keras.layers.Dense(3), heads={"a": keras.layers.Dense(1)})
    with pytest.raises(ValueError, match="call model.build"):
        model.trunk_variables
    model.build((None, 2))
    with pytest.raises(KeyError, match="no head 'z'"):
        model.var_list("z")


def _summary_rows(model) -> list[str]:
    lines = []
    model.summary(print_fn=lambda line, *args, **kwargs: lines.append(line))
    return [line for line in "\n".join(lines).splitlines() if "(" in line and "│" in line]


def test_summary_names_the_trunk_and_heads_by_their_names_and_keeps_user_names():
    trunk = keras.Sequential([keras.layers.Dense(8, activation="relu")])
    model = mh.MultiHeadModel(trunk, {"y1": keras.Sequential([keras.layers.Dense(1)]),
                                      "age": keras.layers.Dense(1),
                                      "mine": keras.layers.Dense(1, name="my_dense")})
    model.build((None, 4))
    rows = _summary_rows(model)
    names = [row.split("│")[1].split("(")[0].strip() for row in rows]
    assert names == ["trunk", "y1", "age", "my_dense"], rows  # a name the user gave is kept
    assert "(Sequential)" in rows[0] and "(Dense)" in rows[2]
    assert model.heads["y1"].name == "y1" and model.trunk.name == "trunk"
    # variables are still found by object identity, and a second model is named the same way
    assert len(model.var_list("age")) == 4
    other = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(2)]), {"y1": keras.layers.Dense(1)})
    other.build((None, 4))
    assert [r.split("│")[1].split("(")[0].strip() for r in _summary_rows(other)] == ["trunk", "y1"]
