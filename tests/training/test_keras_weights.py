"""`keras_weights`: Keras' `sample_weight` / `class_weight` as per-head weights, checked against
the rows written out by hand."""

import numpy as np
import pytest

from multihead.objectives.objective import Weighted
from multihead.training.keras_weights import keras_weights, weighted_labels

HEADS = ("c", "r")


def test_class_weight_reads_indices_one_hot_rows_and_leaves_missing_labels_at_one():
    labels = {"c": np.array([0, 2, 1, 2]), "r": np.zeros((4, 1))}
    one_hot = np.eye(3, dtype="float32")[labels["c"]]
    table = {0: 0.5, 2: 3.0}  # class 1 unlisted: 1
    expected = np.array([0.5, 3.0, 1.0, 3.0], "float32")
    for y in (labels["c"], labels["c"][:, None], labels["c"].astype("float32"), one_hot):
        got = keras_weights(HEADS, {"c": y, "r": labels["r"]}, 4, None, {"c": table}, "fit")
        assert list(got) == ["c"]
        np.testing.assert_array_equal(got["c"], expected)
    missing = np.array([0.0, np.nan, 1.0, 2.0])
    got = keras_weights(HEADS, {"c": missing}, 4, None, {"c": table}, "fit")
    np.testing.assert_array_equal(got["c"], [0.5, 1.0, 1.0, 3.0])


def test_sample_and_class_weights_multiply_and_one_array_weighs_every_head():
    y = {"c": np.array([0, 1, 0]), "r": np.zeros(3)}
    w = np.array([1.0, 2.0, 4.0])
    got = keras_weights(HEADS, y, 3, w, {"c": {0: 10.0}}, "fit")
    np.testing.assert_array_equal(got["c"], [10.0, 2.0, 40.0])
    np.testing.assert_array_equal(got["r"], w)
    assert got["r"].dtype == np.float32


def test_weighted_labels_is_the_structure_trainer_fit_gives_the_step():
    y = {"c": np.array([0, 1]), "r": np.zeros(2)}
    folded = weighted_labels(y, {"c": np.ones(2, "float32")})
    assert isinstance(folded["c"], Weighted) and folded["r"] is y["r"]
    assert weighted_labels(y, {}) is y


@pytest.mark.parametrize("args, message", [
    ({"sample_weight": {"r": np.ones(3)}}, "names head 'r', but y has no labels for it"),
    ({"sample_weight": [[1.0, 2.0]] * 3}, "fit(sample_weight=...): shape (3, 2)"),
    ({"sample_weight": np.array([1.0, np.inf, 1.0])}, "inf at row 1"),
    ({"class_weight": [1.0]}, "expected a dict head -> {class index: weight}"),
    ({"class_weight": {"c": {0: True}}}, "['c'][0]: True; a class weight must be"),
])
def test_bad_weights_are_named(args, message):
    with pytest.raises(ValueError) as error:
        keras_weights(HEADS, {"c": np.array([0, 1, 0])}, 3, args.get("sample_weight"),
                      args.get("class_weight"), "fit")
    assert message in str(error.value) and "\n" not in str(error.value)
