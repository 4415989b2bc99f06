"""`multihead.model.standardize`: the statistics equal scikit-learn's `StandardScaler` fitted on
the same rows, and the layer computes its `transform`."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.preprocessing import StandardScaler

from multihead.model.standardize import Standardization, standard_stats, standardize_layer


def _table(rows: int = 50, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal([3.0, -200.0, 0.01, 7.0], [1.0, 50.0, 1e-3, 1.0], (rows, 4)).astype(np.float32)
    x[:, 3] = 7.25  # a constant feature: sklearn scales it by 1
    return x


def test_stats_equal_standard_scaler_and_a_constant_feature_scales_by_one():
    x = _table()
    scaler = StandardScaler().fit(x)
    stats = standard_stats(x)
    np.testing.assert_allclose(stats.mean, scaler.mean_, rtol=1e-12)
    np.testing.assert_allclose(stats.scale, scaler.scale_, rtol=1e-12)
    assert stats.scale[3] == 1.0 and scaler.scale_[3] == 1.0
    out = np.asarray(standardize_layer(stats)(x))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, scaler.transform(x), rtol=1e-5, atol=1e-5)


def test_missing_values_are_left_out_of_the_stats_as_sklearn_does():
    x = _table().astype(np.float64)
    x[::5, 0] = np.nan
    scaler = StandardScaler().fit(x)
    stats = standard_stats(x)
    np.testing.assert_allclose(stats.mean, scaler.mean_, rtol=1e-12)
    np.testing.assert_allclose(stats.scale, scaler.scale_, rtol=1e-12)


def test_images_are_standardized_per_element_and_named_inputs_per_input():
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 255, (30, 3, 2)).astype(np.float32)
    stats = standard_stats(images)
    flat = StandardScaler().fit(images.reshape(30, -1))
    np.testing.assert_allclose(stats.mean.reshape(-1), flat.mean_, rtol=1e-12)
    np.testing.assert_allclose(stats.scale.reshape(-1), flat.scale_, rtol=1e-12)
    table = _table(30)
    layer = standardize_layer({"img": stats, "tab": standard_stats(table)})
    out = layer({"img": images, "tab": table})
    np.testing.assert_allclose(np.asarray(out["img"]).reshape(30, -1),
                               flat.transform(images.reshape(30, -1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["tab"]), StandardScaler().fit_transform(table),
                               rtol=1e-5, atol=1e-5)


def test_a_recorded_record_round_trips_and_a_bad_one_is_named():
    stats = standard_stats(_table())
    back = Standardization.from_json(stats.to_json(), (4,), "inputs.json: normalize")
    np.testing.assert_array_equal(back.mean, stats.mean)
    np.testing.assert_array_equal(back.scale, stats.scale)
    with pytest.raises(ValueError, match="inputs.json: normalize: mean and scale of shape"):
        Standardization.from_json(stats.to_json(), (5,), "inputs.json: normalize")
    with pytest.raises(ValueError, match="scale > 0"):
        Standardization.from_json({"mean": [0.0], "scale": [0.0]}, (1,), "w")


def test_a_model_applies_preprocess_first_even_built_inside_predict_and_refuses_variables():
    import keras

    import multihead as mh

    x = _table()
    stats = standard_stats(x)
    model = mh.MultiHeadModel(keras.layers.Dense(3), {"y": keras.layers.Dense(1)},
                              preprocess=standardize_layer(stats))
    out = model.predict(x)["y"]  # the first call builds the model inside predict's tf.function
    scaled = StandardScaler().fit_transform(x).astype(np.float32)
    np.testing.assert_allclose(out, model.heads["y"](model.trunk(scaled)).numpy(), rtol=1e-5, atol=1e-6)
    adapted = keras.layers.Normalization()
    adapted.adapt(x)
    with pytest.raises(ValueError, match="preprocess: Normalization .* has variables"):
        mh.MultiHeadModel(keras.layers.Dense(3), {"y": keras.layers.Dense(1)},
                          preprocess=adapted).build((None, 4))
