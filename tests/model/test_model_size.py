"""`MultiHeadModel.parameter_counts()`: the trunk's and each head's parameters, checked against
hand arithmetic and an independent count of the variables' shapes."""

from __future__ import annotations

import keras
import numpy as np

import multihead as mh


def _count(variables) -> int:
    return int(sum(np.prod(v.shape) for v in variables))


def _model() -> mh.MultiHeadModel:
    keras.utils.set_random_seed(0)
    frozen = keras.layers.Dense(2)
    frozen.trainable = False
    model = mh.MultiHeadModel(
        keras.Sequential([keras.layers.Dense(8), keras.layers.BatchNormalization()]),
        {"y1": keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(1)]), "y2": frozen})
    model.build((None, 5))
    return model


def test_counts_per_part_match_hand_arithmetic_and_the_variable_shapes():
    model = _model()
    counts = model.parameter_counts()
    # trunk: Dense 5*8 + 8 = 48, BatchNorm gamma + beta = 16 trainable, moving mean + var = 16
    assert counts.trunk == (48 + 16, 16)
    assert counts.heads["y1"] == (8 * 4 + 4 + 4 * 1 + 1, 0)  # 41
    assert counts.heads["y2"] == (0, 8 * 2 + 2)               # a frozen head: 18 non-trainable
    assert list(counts.heads) == ["y1", "y2"]                 # head order
    parts = {"trunk": model.trunk, "y1": model.heads["y1"], "y2": model.heads["y2"]}
    for name, layer in parts.items():
        size = counts.trunk if name == "trunk" else counts.heads[name]
        assert size == (_count(layer.trainable_weights), _count(layer.non_trainable_weights))
    assert counts.total == model.count_params() == 64 + 16 + 41 + 18


def test_a_routing_trunk_counts_each_gate_in_its_head():
    heads = ("a", "b")
    model = mh.MultiHeadModel(mh.MMoE(heads, experts=4, expert_units=[6, 5]),
                              {h: keras.layers.Dense(1) for h in heads})
    model.build((None, 3))
    counts = model.parameter_counts()
    # 4 experts of (3*6 + 6) + (6*5 + 5) = 59; a head: its gate 3*4 (no bias) + Dense 5*1 + 1
    assert counts.trunk == (4 * 59, 0)
    assert counts.heads == {h: (12 + 6, 0) for h in heads}
    assert counts.total == model.count_params()


def test_summary_ends_with_the_table_by_head_name():
    model = _model()
    lines = []
    model.summary(print_fn=lambda text, **_: lines.append(text))
    table = lines[-1].splitlines()
    assert table[0].split() == ["part", "trainable", "non-trainable"]
    assert [row.split() for row in table[1:]] == [
        ["trunk", "64", "16"], ["head", "y1", "41", "0"], ["head", "y2", "0", "18"],
        ["total", "105", "34"]]
