"""`Trainer.fit`, Keras' `fit` on a `MultiHeadModel` and `predict` check array input as a
config's data is checked: real dtypes, a batch size >= 1, at least one row, the model's input
width; each refusal is one line naming the argument. Non-finite inputs follow the objectives'
`on_nonfinite` rule: skipped steps are logged as NaN, never as a loss of 0."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import multihead as mh

ROWS, WIDTH = 16, 4


def _model():
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(8)]),
                              {"a": keras.layers.Dense(1), "b": keras.layers.Dense(1)})
    model.build((None, WIDTH))
    return model


def _data(rows=ROWS, width=WIDTH, dtype="float32"):
    x = np.random.default_rng(0).standard_normal((rows, width)).astype(dtype)
    return x, {"a": np.ones((rows, 1), "float32"), "b": np.zeros((rows, 1), "float32")}


def _compiled(**options):
    model = _model()
    model.compile(optimizer={"a": "sgd", "b": "sgd"}, loss={"a": "mse", "b": "mse"}, **options)
    return model


def _keras_fit(x, y, **kwargs):
    return _compiled().fit(x, y, **{"batch_size": 4, "verbose": 0, **kwargs})


def _trainer_fit(x, y, **kwargs):
    trainer = mh.Trainer(_model(), {"a": mh.Objective("mse"), "b": mh.Objective("mse")})
    return trainer.fit((x, y), **{"steps": 2, "batch_size": 4, "verbose": False, **kwargs})


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("fit, name", [(_keras_fit, "fit(x=...)"), (_trainer_fit, "data inputs")])
def test_complex_inputs_are_refused_not_cast_to_real(fit, name):
    x, y = _data(dtype="complex64")
    with pytest.raises(TypeError, match=r"complex values \(complex64\) are not supported") as error:
        fit(x, y)
    assert _one_line(error).startswith(name)


@pytest.mark.parametrize("fit, name", [(_keras_fit, "fit(x=...)"), (_trainer_fit, "data inputs")])
def test_zero_rows_are_refused(fit, name):
    x, y = _data(rows=0)
    with pytest.raises(ValueError, match=r"0 rows \(shape \(0, 4\)\); give at least one") as error:
        fit(x, y)
    assert _one_line(error).startswith(name)


@pytest.mark.parametrize("batch_size", [0, -3])
def test_a_batch_size_below_one_is_refused_by_keras_fit(batch_size):
    with pytest.raises(ValueError, match=rf"^fit\(batch_size=...\): must be >= 1, got {batch_size}$"):
        _keras_fit(*_data(), batch_size=batch_size)


@pytest.mark.parametrize("fit, name", [(_keras_fit, r"fit\(x=...\)"),
                                       (_trainer_fit, "data inputs")])
def test_a_wrong_input_width_says_expected_and_got(fit, name):
    with pytest.raises(ValueError, match=rf"^{name}: the model takes inputs of width 4 \(shape "
                                         r"\(None, 4\)\), got width 3 \(shape \(None, 3\)\)"):
        fit(*_data(width=3))


def test_keras_evaluate_and_validation_data_are_checked_too():
    model = _compiled()
    with pytest.raises(ValueError, match=r"^data inputs: the model takes inputs of width 4"):
        model.evaluate(*_data(width=3), verbose=0)
    with pytest.raises(ValueError, match=r"^fit\(validation_data=...\) x_val: 0 rows"):
        model.fit(*_data(), batch_size=4, verbose=0, validation_data=_data(rows=0))


def test_predict_names_zero_rows_and_a_wrong_width():
    model = _model()
    with pytest.raises(ValueError, match=r"^x: 0 rows"):
        model.predict(np.zeros((0, WIDTH), "float32"))
    with pytest.raises(ValueError, match=r"^x: the model takes inputs of width 4 .* got width 3"):
        model.predict(np.zeros((5, 3), "float32"))


def test_non_finite_inputs_are_skipped_and_logged_as_nan_not_as_zero():
    model = _compiled(max_nonfinite_steps=100)
    before = [v.numpy().copy() for v in model.weights]
    x, y = _data()
    history = model.fit(np.full_like(x, np.nan), y, batch_size=4, verbose=0).history
    # Every step of both heads was skipped (Objective(on_nonfinite="skip")): nothing learned.
    assert np.isnan(history["loss"][0]) and np.isnan(history["a_loss"][0])
    for v, w in zip(model.weights, before):
        np.testing.assert_array_equal(v.numpy(), w)


def test_non_finite_inputs_stop_keras_fit_as_trainer_fit_does():
    model = _compiled(max_nonfinite_steps=2)
    x, y = _data()
    with pytest.raises(FloatingPointError, match="became nan at step 0"):
        model.fit(np.full_like(x, np.nan), y, batch_size=4, verbose=0)
