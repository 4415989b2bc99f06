"""Input standardization: per-feature mean and scale from training inputs, and the Keras layer
that applies them in front of the trunk (`MultiHeadModel(..., preprocess=...)`).

The statistics follow scikit-learn's `StandardScaler`: the mean and the population standard
deviation (ddof 0) of each input element over the training rows, in float64, non-finite
values ignored; a feature that is constant up to rounding gets scale 1 (sklearn's
`_is_constant_feature`), so it becomes `x - mean` rather than a division by ~0. The layer,
`Standardize`, holds them as constants, not variables: they are part of the layer's config, so
a `.keras` file and an exported SavedModel carry them, and checkpoints (trunk and heads) are
unchanged by them.

Example:
    >>> import numpy as np
    >>> x = np.array([[1.0, 5.0], [3.0, 5.0]])
    >>> stats = standard_stats(x)
    >>> stats.mean.tolist(), stats.scale.tolist()
    ([2.0, 5.0], [1.0, 1.0])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import keras
import numpy as np


@dataclasses.dataclass(frozen=True)
class Standardization:
    """The statistics of one input: `(x - mean) / scale`, element-wise over a row.

    Attributes:
        mean: float64, the shape of one example.
        scale: float64 > 0, the same shape.
    """

    mean: np.ndarray
    scale: np.ndarray

    def apply(self, x: Any) -> np.ndarray:
        """`(x - mean) / scale` in float64 (what the layer computes in float32)."""
        return (np.asarray(x, np.float64) - self.mean) / self.scale

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_json(cls, record: Any, shape: tuple[int, ...], where: str) -> "Standardization":
        """The statistics a run recorded (`to_json`), checked against the input's shape.

        Raises:
            ValueError: not a mapping of `mean` and `scale` arrays of `shape`, finite, scale > 0.
        """
        try:
            mean = np.asarray(record["mean"], np.float64)
            scale = np.asarray(record["scale"], np.float64)
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{where}: expected {{'mean': [...], 'scale': [...]}}") from None
        if mean.shape != shape or scale.shape != shape:
            raise ValueError(f"{where}: mean and scale of shape {mean.shape} and {scale.shape}, "
                             f"not the input's {shape}")
        if not (np.isfinite(mean).all() and np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"{where}: mean and scale must be finite and scale > 0")
        return cls(mean, scale)


def standard_stats(x: Any) -> Standardization:
    """Each input element's mean and scale over the rows of `x` (see the module docstring).

    Args:
        x: training inputs, shape `(n, ...)`, real numbers.
    """
    array = np.asarray(x, np.float64)
    finite = np.isfinite(array)
    count = finite.sum(axis=0)
    seen = np.maximum(count, 1)
    values = np.where(finite, array, 0.0)
    mean = values.sum(axis=0) / seen
    var = (np.where(finite, array - mean, 0.0) ** 2).sum(axis=0) / seen
    # sklearn's _is_constant_feature: var within the rounding error of its computation.
    eps = np.finfo(np.float64).eps
    constant = var <= seen * eps * var + (seen * mean * eps) ** 2
    scale = np.where(constant | (count == 0), 1.0, np.sqrt(var))
    return Standardization(np.where(count == 0, 0.0, mean), scale)


@keras.saving.register_keras_serializable(package="multihead")
class Standardize(keras.layers.Layer):
    """`(x - mean) / scale` element-wise, in float32, with `mean` and `scale` as constants.

    Constants rather than variables, and numpy arrays rather than tensors made at build: the
    layer holds nothing a `tf.function` trace could capture, its config carries the
    statistics (`.keras` files, exports), and a model's checkpoints do not change with it.

    Args:
        mean: the shape of one example (broadcast against it), or a dict input name -> that
            for named inputs (the layer then maps a dict of inputs to a dict).
        scale: the same structure, every entry > 0.
    """

    def __init__(self, mean: Any, scale: Any, **kwargs: Any) -> None:
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        named = isinstance(mean, Mapping)
        if named != isinstance(scale, Mapping) or (named and sorted(mean) != sorted(scale)):
            raise ValueError("Standardize: mean and scale must both be arrays, or dicts of the "
                             "same input names")
        as_array = lambda v: np.asarray(v, np.float32)  # noqa: E731
        self._mean = {k: as_array(v) for k, v in mean.items()} if named else as_array(mean)
        self._scale = {k: as_array(v) for k, v in scale.items()} if named else as_array(scale)
        for m, s in (zip(self._mean.values(), self._scale.values()) if named
                     else [(self._mean, self._scale)]):
            if m.shape != s.shape or not (np.isfinite(m).all() and (s > 0).all()
                                          and np.isfinite(s).all()):
                raise ValueError("Standardize: mean and scale must be finite, of one shape, and "
                                 "scale > 0")

    def call(self, inputs: Any) -> Any:
        if isinstance(self._mean, dict):
            return {k: self._one(inputs[k], self._mean[k], self._scale[k]) for k in inputs}
        return self._one(inputs, self._mean, self._scale)

    def _one(self, x: Any, mean: np.ndarray, scale: np.ndarray) -> Any:
        return (keras.ops.cast(x, self.compute_dtype) - mean) / scale

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def get_config(self) -> dict[str, Any]:
        tolist = (lambda d: {k: v.tolist() for k, v in d.items()}) if isinstance(self._mean, dict) \
            else (lambda a: a.tolist())
        return {**super().get_config(), "mean": tolist(self._mean), "scale": tolist(self._scale)}


def standardize_layer(stats: Standardization | Mapping[str, Standardization],
                      name: str = "standardize") -> Standardize:
    """The `Standardize` layer of `stats`: one input's statistics, or a dict input name ->
    statistics (named inputs)."""
    if isinstance(stats, Mapping):
        return Standardize({k: s.mean for k, s in stats.items()},
                           {k: s.scale for k, s in stats.items()}, name=name)
    return Standardize(stats.mean, stats.scale, name=name)
