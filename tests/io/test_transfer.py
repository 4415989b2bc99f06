"""copy_weights between independent model instances."""

import keras
import numpy as np
import pytest

import multihead as mh
from conftest import make_batch, make_model, weights


def test_copy_trunk_only_leaves_heads_of_dst_untouched():
    src, dst = make_model(seed=1), make_model(seed=2)
    dst_heads = {h: weights(dst.heads[h].weights) for h in dst.head_names}
    assert mh.copy_weights(src, dst, parts=["trunk"]) == ["trunk"]
    for a, b in zip(weights(dst.trunk.weights), weights(src.trunk.weights)):
        np.testing.assert_array_equal(a, b)
    for h in dst.head_names:
        for a, b in zip(weights(dst.heads[h].weights), dst_heads[h]):
            np.testing.assert_array_equal(a, b)
    x = make_batch()[0]
    np.testing.assert_array_equal(src.features(x), dst.features(x))


def test_copy_all_parts_gives_equal_outputs_and_independent_variables():
    src, dst = make_model(seed=1), make_model(seed=2)
    mh.copy_weights(src, dst)
    x = make_batch()[0]
    for h in src.head_names:
        np.testing.assert_array_equal(src(x)[h], dst(x)[h])
    before = weights(dst.weights)
    for v in src.weights:
        v.assign_add(np.ones(v.shape, "float32"))  # the copy does not follow later changes
    for a, b in zip(weights(dst.weights), before):
        np.testing.assert_array_equal(a, b)


def test_copy_into_a_head_with_another_name():
    src, dst = make_model(heads=("q",), seed=1), make_model(heads=("q_old", "q"), seed=2)
    mh.copy_weights(src, dst, parts={"trunk": "trunk", "heads/q": "heads/q_old"})
    x = make_batch()[0]
    np.testing.assert_array_equal(src(x)["q"], dst(x)["q_old"])


def test_shape_mismatch_names_part_and_shapes_and_writes_nothing():
    src, dst = make_model(seed=1, width=8), make_model(seed=2, width=16)
    before = weights(dst.weights)
    with pytest.raises(ValueError, match=r"part heads/b: src variable .* shape \(8, 4\).* \(16, 4\)"):
        mh.copy_weights(src, dst, parts=["heads/b"])
    with pytest.raises(ValueError, match=r"part trunk: src variable .* shape \(5, 8\).* \(5, 16\)"):
        mh.copy_weights(src, dst, parts=["trunk", "heads/a"])
    for a, b in zip(weights(dst.weights), before):
        np.testing.assert_array_equal(a, b)


def test_structure_mismatch_and_unknown_part():
    src = make_model(seed=1)
    keras.utils.set_random_seed(0)
    dst = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(8)]),
                            {"a": keras.layers.Dense(1), "b": keras.layers.Dense(1)})
    dst.build((None, 5))
    with pytest.raises(ValueError, match=r"part trunk: src has 4 weights, dst 2"):
        mh.copy_weights(src, dst, parts=["trunk"])
    with pytest.raises(ValueError, match=r"no part 'heads/c'.*\['trunk', 'heads/a', 'heads/b'\]"):
        mh.copy_weights(src, make_model(), parts=["heads/c"])


def test_same_model_and_string_parts_are_errors():
    model = make_model()
    with pytest.raises(ValueError, match="same model"):
        mh.copy_weights(model, model)
    with pytest.raises(TypeError, match=r"parts=\['trunk'\]"):
        mh.copy_weights(make_model(), make_model(), parts="trunk")


def test_a_head_part_of_a_routing_trunk_includes_its_gate_as_in_checkpoints():
    def mmoe(seed):
        keras.utils.set_random_seed(seed)
        model = mh.MultiHeadModel(mh.MMoE(["a", "b"], experts=3, expert_units=[4]),
                                  {"a": keras.layers.Dense(1), "b": keras.layers.Dense(1)})
        model.build((None, 5))
        return model

    src, dst = mmoe(1), mmoe(2)
    gate_a, gate_b = (dst.trunk.head_owned_layers()[h][0] for h in ("a", "b"))
    untouched = weights(gate_b.weights + dst.trunk.experts.weights + dst.heads["b"].weights)
    mh.copy_weights(src, dst, parts=["heads/a"])
    for a, b in zip(weights(gate_a.weights + dst.heads["a"].weights),
                    weights(src.trunk.head_owned_layers()["a"][0].weights + src.heads["a"].weights)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(weights(gate_b.weights + dst.trunk.experts.weights + dst.heads["b"].weights), untouched):
        np.testing.assert_array_equal(a, b)
    # the gate of b, the experts and b's tower differ between the two models: nothing copied there
    assert not np.array_equal(gate_b.kernel.numpy(), src.trunk.head_owned_layers()["b"][0].kernel.numpy())
