"""Impressions -> clicks -> conversions with known probabilities: the setting of ESMM.

Ma et al., "Entire Space Multi-Task Model: An Effective Approach for Estimating Post-Click
Conversion Rate" (SIGIR 2018): a conversion can only be observed after a click, so a CVR model
trained on clicked impressions (the click space) is used on every impression (the entire
space). Two problems follow, and this generator has both:

- sample-selection bias: the clicked impressions are not a random sample of all impressions,
  since the same features raise the click and the conversion probability;
- data sparsity: clicks are a few percent of impressions, so the click space is small.

Each impression is drawn as follows (`seed` fixes everything):

1. features: `numeric` columns ~ N(0, 1), then `categorical` columns of `levels` uniform
   levels each, one-hot encoded; the input `x` is their concatenation, float32;
2. a hidden representation `h = tanh(x W)` with `W` ~ N(0, 1/width), `hidden` units,
   shared by both probabilities;
3. `logit pCTR(x) = a + spread_ctr * z_ctr(h)` and `logit pCVR(x) = b + spread_cvr * z_cvr(h)`,
   where `z_ctr = v_ctr . h` and `z_cvr = v_cvr . h` are standardised over the training
   impressions and `cos(v_ctr, v_cvr) = correlation` (v unit vectors): the tasks share
   features to that degree;
4. the intercepts `a`, `b` are solved so that the mean pCTR over the training impressions is
   `click_rate` and the mean pCVR (conversion probability given a click, defined on every
   impression) is `cvr_rate`;
5. `click ~ Bernoulli(pCTR)`, `conversion ~ Bernoulli(pCVR)`, the conversion observed only on
   clicked impressions: its label is NaN on the others (`data.missing_label: {cvr: nan}`);
   `ctcvr = click * conversion` is known on every impression.

The tasks (label names) are `ctr` (click), `cvr` (conversion, NaN without a click) and
`ctcvr`; `Impressions.p_ctr` and `p_cvr` hold the known probabilities.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from multihead._checks import check_float, check_int
from multihead.datasets.multitask import CLASSIFICATION, MultiTaskData

#: The label names of the generated data.
TASKS = ("ctr", "cvr", "ctcvr")


@dataclasses.dataclass(frozen=True)
class Impressions:
    """One split of impressions.

    Attributes:
        x: features, float32 `(n, numeric + categorical * levels)`.
        p_ctr: the known click probability of each impression, float64 `(n, 1)`.
        p_cvr: the known conversion probability given a click, on every impression, float64 `(n, 1)`.
        click: 1.0 where clicked, float32 `(n, 1)`.
        conversion: 1.0/0.0 on clicked impressions, NaN on the others, float32 `(n, 1)`.
    """

    x: np.ndarray
    p_ctr: np.ndarray
    p_cvr: np.ndarray
    click: np.ndarray
    conversion: np.ndarray

    @property
    def ctcvr(self) -> np.ndarray:
        """`click * conversion`: 1.0 where clicked and converted, float32 `(n, 1)`."""
        return np.where(self.click == 1, np.nan_to_num(self.conversion), 0).astype(np.float32)

    def labels(self, tasks: Sequence[str] = TASKS) -> dict[str, np.ndarray]:
        """Task -> labels, for `tasks` among `ctr`, `cvr`, `ctcvr`."""
        every = {"ctr": self.click, "cvr": self.conversion, "ctcvr": self.ctcvr}
        return {t: every[t] for t in tasks}


@dataclasses.dataclass(frozen=True)
class ImpressionData:
    """The train and eval splits of `impressions`."""

    train: Impressions
    eval: Impressions

    def multitask(self, tasks: Sequence[str] = TASKS) -> MultiTaskData:
        """The splits as `MultiTaskData` with the labels of `tasks` (binary, float32)."""
        return MultiTaskData(x_train=self.train.x, y_train=self.train.labels(tasks),
                             x_eval=self.eval.x, y_eval=self.eval.labels(tasks),
                             kinds={t: CLASSIFICATION for t in tasks}, task_correlation=math.nan)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _intercept(z: np.ndarray, rate: float) -> float:
    """`c` with `mean(sigmoid(c + z)) == rate` (bisection: the mean is increasing in c)."""
    low, high = -50.0, 50.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if _sigmoid(mid + z).mean() < rate else (low, mid)
    return 0.5 * (low + high)


def _features(size: int, numeric: int, categorical: int, levels: int,
              rng: np.random.Generator) -> np.ndarray:
    dense = rng.standard_normal((size, numeric))
    codes = rng.integers(0, levels, size=(size, categorical))
    onehot = np.eye(levels)[codes].reshape(size, categorical * levels)
    return np.concatenate([dense, onehot], axis=1).astype(np.float32)


def impressions(train_size: int = 100_000, eval_size: int = 20_000, numeric: int = 8,
                categorical: int = 2, levels: int = 5, hidden: int = 8, correlation: float = 0.7,
                spread_ctr: float = 1.5, spread_cvr: float = 1.0, click_rate: float = 0.04,
                cvr_rate: float = 0.15, seed: int = 0) -> ImpressionData:
    """Impressions with clicks and conversions drawn from known probabilities (module docstring).

    Args:
        train_size, eval_size: impressions in each split.
        numeric: Gaussian feature columns.
        categorical, levels: categorical columns and their levels (one-hot encoded).
        hidden: units of the hidden representation both probabilities read.
        correlation: cosine of the two tasks' directions in that representation, in [-1, 1].
        spread_ctr, spread_cvr: standard deviation of each logit over the training impressions.
        click_rate: mean pCTR over the training impressions, in (0, 1).
        cvr_rate: mean pCVR (given a click) over the training impressions, in (0, 1).
        seed: equal seeds give equal data.

    Returns:
        The train and eval splits.

    Example:
        >>> data = impressions(train_size=1000, eval_size=200, seed=1)
        >>> data.train.x.shape, data.train.click.shape
        ((1000, 18), (1000, 1))
    """
    train_size = check_int(train_size, "train_size", minimum=1)
    eval_size = check_int(eval_size, "eval_size", minimum=1)
    numeric = check_int(numeric, "numeric", minimum=0)
    categorical = check_int(categorical, "categorical", minimum=0)
    levels = check_int(levels, "levels", minimum=1)
    if numeric + categorical == 0:
        raise ValueError("numeric: 0 numeric and 0 categorical columns leave no feature; give one")
    hidden = check_int(hidden, "hidden", minimum=2, hint="the tasks' directions need 2 units")
    correlation = check_float(correlation, "correlation", minimum=-1, maximum=1)
    spread_ctr = check_float(spread_ctr, "spread_ctr", minimum=0, maximum=20)
    spread_cvr = check_float(spread_cvr, "spread_cvr", minimum=0, maximum=20)
    click_rate = check_float(click_rate, "click_rate", minimum=0, maximum=1, min_open=True,
                             max_open=True)
    cvr_rate = check_float(cvr_rate, "cvr_rate", minimum=0, maximum=1, min_open=True,
                           max_open=True)
    seed = check_int(seed, "seed")
    rng = np.random.default_rng(seed)
    width = numeric + categorical * levels
    weights = rng.standard_normal((width, hidden)) / math.sqrt(width)
    basis, _ = np.linalg.qr(rng.standard_normal((hidden, 2)))
    v_ctr = basis[:, 0]
    v_cvr = correlation * basis[:, 0] + math.sqrt(1.0 - correlation ** 2) * basis[:, 1]
    x_train = _features(train_size, numeric, categorical, levels, rng)
    x_eval = _features(eval_size, numeric, categorical, levels, rng)

    def scores(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.tanh(x.astype(np.float64) @ weights)
        return h @ v_ctr, h @ v_cvr

    train_ctr, train_cvr = scores(x_train)
    mean_ctr, std_ctr = train_ctr.mean(), max(train_ctr.std(), 1e-12)
    mean_cvr, std_cvr = train_cvr.mean(), max(train_cvr.std(), 1e-12)

    def logits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z_ctr, z_cvr = scores(x)
        return (spread_ctr * (z_ctr - mean_ctr) / std_ctr,
                spread_cvr * (z_cvr - mean_cvr) / std_cvr)

    z_ctr, z_cvr = logits(x_train)
    a, b = _intercept(z_ctr, click_rate), _intercept(z_cvr, cvr_rate)

    def split(x: np.ndarray) -> Impressions:
        l_ctr, l_cvr = logits(x)
        p_ctr, p_cvr = _sigmoid(a + l_ctr)[:, None], _sigmoid(b + l_cvr)[:, None]
        click = rng.random(p_ctr.shape) < p_ctr
        converts = rng.random(p_cvr.shape) < p_cvr  # drawn on every impression, seen on clicks
        conversion = np.where(click, converts.astype(np.float32), np.float32(np.nan))
        return Impressions(x=x, p_ctr=p_ctr, p_cvr=p_cvr, click=click.astype(np.float32),
                           conversion=conversion.astype(np.float32))

    return ImpressionData(train=split(x_train), eval=split(x_eval))
