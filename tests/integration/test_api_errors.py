"""Bad input through the Python API gets one clear error naming the head (or the batch)
and the shapes, before anything trains."""

import keras
import numpy as np
import pytest

import multihead as mh


def _trainer():
    model = mh.MultiHeadModel(keras.layers.Dense(4), {"a": keras.layers.Dense(1),
                                                       "b": keras.layers.Dense(3)})
    model.build((None, 5))
    return mh.Trainer(model, {"a": mh.Objective("mse"), "b": mh.Objective("mse")})


def _x(n=64):
    return np.ones((n, 5), "float32")


@pytest.mark.parametrize("labels, shape", [
    (np.ones((64, 3), "float32"), r"\(64, 3\)"),    # would broadcast (64,1) against (64,3)
    (np.ones((1, 1), "float32"), r"\(1, 1\)"),      # would broadcast over the batch
    (np.float32(1.0), r"\(\)"),                      # a scalar
])
def test_labels_that_would_broadcast_name_the_head_and_both_shapes(labels, shape):
    trainer = _trainer()
    y = {"a": labels, "b": np.ones((64, 3), "float32")}
    before = [v.numpy().copy() for v in trainer.model.weights]
    with pytest.raises(ValueError, match=rf"head 'a'.*labels.*{shape}.*output.*\(None, 1\)|"
                                         rf"head 'a'.*labels.*{shape}.*output.*\(64, 1\)"):
        trainer.step((_x(), y))
    for v, w in zip(trainer.model.weights, before):
        np.testing.assert_array_equal(v.numpy(), w)



@pytest.mark.parametrize("run", ["fit", "evaluate"])
def test_fit_and_evaluate_check_label_shapes_before_running(run):
    trainer = _trainer()
    data = (_x(), {"a": np.ones((64, 3), "float32"), "b": np.ones((64, 3), "float32")})
    with pytest.raises(ValueError, match=r"head 'a': labels of shape \(None, 3\)"):
        if run == "fit":
            trainer.fit(data, steps=2, batch_size=16, verbose=False)
        else:
            trainer.evaluate(data)
    assert trainer.global_step == 0


def test_labels_of_rank_one_match_a_single_unit_output():
    trainer = _trainer()
    result = trainer.step((_x(), {"a": np.ones(64, "float32"), "b": np.ones((64, 3), "float32")}))
    assert result.updated == ("a", "b")


def test_an_empty_batch_is_named():
    trainer = _trainer()
    with pytest.raises(ValueError, match="batch is empty"):
        trainer.step((_x(0), {"a": np.ones((0, 1), "float32"), "b": np.ones((0, 3), "float32")}))
