"""MultiDigits: the MultiMNIST construction on the handwritten digits scikit-learn ships.

Sener & Koltun, "Multi-Task Learning as Multi-Objective Optimization" (NeurIPS 2018), build
MultiMNIST after Sabour et al. (2017): two digits on one canvas, one shifted to the top left,
the other to the bottom right, overlapping; task `left` classifies the top-left digit, task
`right` the bottom-right one. Here the digits are the 1,797 8x8 images of
`sklearn.datasets.load_digits` (UCI optical digits, values 0..16), so nothing is downloaded:

1. the source images are split once, by a seeded permutation, into train and eval sources
   (no image appears in both splits);
2. each example draws two source images of its split, puts the first at offset
   `(r, c)` with `r, c` in `[0, shift]` and the second at `(canvas - 8 - r', canvas - 8 - c')`,
   and overlays them by the pixelwise maximum (as MultiMNIST does);
3. pixels are scaled to [0, 1]; inputs are `(n, canvas, canvas, 1)` float32 and the labels
   `left`, `right` int32 `(n, 1)`.

Needs scikit-learn: `pip install multihead[data]`.
"""

from __future__ import annotations

import math

import numpy as np

from multihead._checks import check_float, check_int
from multihead.datasets.multitask import CLASSIFICATION, MultiTaskData

#: The tasks, in the order of the heads of experiments/multidigits.yaml.
TASKS = ("left", "right")
_DIGIT = 8


def _digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ValueError("MultiDigits needs scikit-learn: pip install 'multihead[data]'") from None
    digits = load_digits()
    return digits.images.astype(np.float32) / 16.0, digits.target.astype(np.int32)


def _compose(images: np.ndarray, labels: np.ndarray, sources: np.ndarray, size: int, canvas: int,
             shift: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    first = rng.choice(sources, size)
    second = rng.choice(sources, size)
    offsets = rng.integers(0, shift + 1, size=(size, 4))
    x = np.zeros((size, canvas, canvas), np.float32)
    far = canvas - _DIGIT
    for i in range(size):
        r, c, r2, c2 = offsets[i]
        x[i, r:r + _DIGIT, c:c + _DIGIT] = images[first[i]]
        region = x[i, far - r2:far - r2 + _DIGIT, far - c2:far - c2 + _DIGIT]
        np.maximum(region, images[second[i]], out=region)
    return x[..., None], {"left": labels[first][:, None], "right": labels[second][:, None]}


def multidigits(train_size: int = 20000, eval_size: int = 4000, canvas: int = 12, shift: int = 1,
                eval_fraction: float = 0.2, seed: int = 0) -> MultiTaskData:
    """Two overlaid handwritten digits per example; tasks `left` and `right` (10 classes each).

    Args:
        train_size, eval_size: number of composed examples in each split.
        canvas: side of the square canvas, at least 9 (8 + 1 pixel of shift between digits).
        shift: the largest random offset of each digit from its corner, in pixels.
        eval_fraction: fraction of the 1,797 source images reserved for eval examples.
        seed: the source split and the composition; equal seeds give equal data.

    Returns:
        The splits, inputs `(n, canvas, canvas, 1)` in [0, 1], labels int32 `(n, 1)`.

    Example:
        >>> data = multidigits(train_size=64, eval_size=16)  # doctest: +SKIP
        >>> data.x_train.shape, data.y_train["left"].shape  # doctest: +SKIP
        ((64, 12, 12, 1), (64, 1))
    """
    train_size = check_int(train_size, "train_size", minimum=1)
    eval_size = check_int(eval_size, "eval_size", minimum=1)
    canvas = check_int(canvas, "canvas", minimum=_DIGIT + 1, hint="the digits are 8x8")
    shift = check_int(shift, "shift", minimum=0, maximum=canvas - _DIGIT,
                      hint="each digit must stay on the canvas")
    eval_fraction = check_float(eval_fraction, "eval_fraction", minimum=0, maximum=1,
                                min_open=True, max_open=True)
    seed = check_int(seed, "seed")
    images, labels = _digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(images))
    n_eval = max(1, math.floor(len(images) * eval_fraction))
    eval_sources, train_sources = np.sort(order[:n_eval]), np.sort(order[n_eval:])
    x_train, y_train = _compose(images, labels, train_sources, train_size, canvas, shift, rng)
    x_eval, y_eval = _compose(images, labels, eval_sources, eval_size, canvas, shift, rng)
    return MultiTaskData(x_train=x_train, y_train=y_train, x_eval=x_eval, y_eval=y_eval,
                         kinds={t: CLASSIFICATION for t in TASKS}, task_correlation=math.nan)


def source_split(eval_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the train and eval source images `multidigits` uses for `seed`."""
    images, _ = _digits()
    order = np.random.default_rng(seed).permutation(len(images))
    n_eval = max(1, math.floor(len(images) * eval_fraction))
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])
