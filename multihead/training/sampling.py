"""Which heads train at a step when each head has its own dataset (`Trainer.fit(data={head: ...})`).

Two regimes:

* `"all"`: every head draws a batch from its own dataset at every step; each head's
  loss is computed on its own batch through the shared trunk, and all heads update
  together (the trainer's schedule applies as usual).
* one head per step, drawn at random, and only that head is updated. The
  probabilities follow TF Model Garden's task samplers
  (`official/modeling/multitask/task_sampler.py`):

  - `"uniform"`: p_k = 1 / K;
  - `"proportional"`: p_k = w_k / sum_j w_j;
  - `"temperature"`: p_k = w_k^(1/T) / sum_j w_j^(1/T), Model Garden's proportional
    sampler with `alpha = 1 / T` (the temperature-scaled mixing of Raffel et al.,
    "Exploring the Limits of Transfer Learning", JMLR 2020: T = 1 is proportional,
    T -> infinity uniform).

  The weights w_k are the heads' dataset sizes (examples) unless given.

The head of step s is a pure function of `(seed, s)`, so a resumed run draws exactly
the heads the uninterrupted run drew, with no sampler state to checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from multihead._checks import check_choice, check_float, check_int

SAMPLINGS = ("all", "uniform", "proportional", "temperature")


@dataclasses.dataclass(frozen=True)
class TaskSampling:
    """How `Trainer.fit` draws from per-head datasets (see the module docstring).

    Example:
        >>> sampling = TaskSampling("temperature", temperature=2.0)
        >>> sampling.probabilities(["a", "b"], {"a": 900, "b": 100}).round(3).tolist()
        [0.75, 0.25]

    Args:
        kind: `"all"`, `"uniform"`, `"proportional"` or `"temperature"`.
        temperature: T of `"temperature"` sampling, > 0.
        weights: head -> sampling weight w_k > 0 (default: the head's number of
            training examples; required for datasets of unknown size).
        seed: seed of the draws.
    """

    kind: str = "all"
    temperature: float = 2.0
    weights: Mapping[str, float] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice(self.kind, "sampling", SAMPLINGS)
        check_float(self.temperature, "temperature", minimum=0.0, min_open=True)
        check_int(self.seed, "sampling seed", minimum=0, maximum=2**63 - 1)
        for head, weight in (self.weights or {}).items():
            check_float(weight, f"sampling weights[{head!r}]", minimum=0.0, min_open=True)

    @property
    def samples(self) -> bool:
        """Whether one head is drawn per step (False for `"all"`)."""
        return self.kind != "all"

    def probabilities(self, heads: Sequence[str], sizes: Mapping[str, int | None]) -> np.ndarray:
        """The probability of drawing each of `heads` (in order) at a step.

        Args:
            heads: the heads with a dataset.
            sizes: head -> number of training examples, or None if unknown.

        Raises:
            ValueError: `weights` names a head without a dataset, or the weights are
                needed and neither given nor known from the data.
        """
        if self.kind == "uniform":
            return np.full(len(heads), 1.0 / len(heads))
        given = dict(self.weights or {})
        extra = sorted(set(given) - set(heads))
        if extra:
            raise ValueError(f"sampling weights name {extra[0]!r}, which has no dataset; the "
                             f"heads with data are {list(heads)}")
        weights = []
        for head in heads:
            weight = given.get(head, sizes.get(head))
            if weight is None:
                raise ValueError(
                    f"{self.kind} sampling needs the size of head {head!r}'s dataset, which is "
                    "unknown (a tf.data pipeline of unknown cardinality): give "
                    f"weights={{{head!r}: ...}} or use uniform sampling")
            weights.append(float(weight))
        w = np.asarray(weights)
        if self.kind == "temperature":
            # In logs, so large sizes and high temperatures do not overflow.
            logits = np.log(w) / self.temperature
            w = np.exp(logits - logits.max())
        return w / w.sum()

    def head_at(self, step: int, probabilities: np.ndarray) -> int:
        """The index of the head drawn at `step`: a pure function of `(seed, step)`."""
        draw = np.random.default_rng([self.seed, step]).random()
        index = int(np.searchsorted(np.cumsum(probabilities), draw, side="right"))
        return min(index, len(probabilities) - 1)  # cumsum may end a rounding error below 1


def as_sampling(sampling: str | TaskSampling | Mapping[str, object], seed: int | None) -> TaskSampling:
    """A `TaskSampling` from a kind name (seeded with `seed`), a dict of its fields, or itself."""
    if isinstance(sampling, TaskSampling):
        return sampling
    if isinstance(sampling, str):
        return TaskSampling(sampling, seed=0 if seed is None else seed)
    if isinstance(sampling, Mapping):
        fields = {"seed": 0 if seed is None else seed, **sampling}
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(TaskSampling)})
        if unknown:
            raise ValueError(f"sampling has no option {unknown[0]!r}; options are kind, "
                             "temperature, weights, seed")
        return TaskSampling(**fields)  # type: ignore[arg-type]
    raise TypeError(f"sampling must be one of {SAMPLINGS}, a TaskSampling or a dict, got "
                    f"{type(sampling).__name__}")

