"""The public bases of every aggregation method, and the small result types they return.

A method is an object: its options are constructor arguments (defaults written once,
validated there, errors naming the option and the method); its state, if any, is
*declared* by the method (`state_spec`) and created as variables by whoever runs it (the
trunk update, checkpointed as `trunk_update/aggregator_state/<entry>`). Core asks what a
method *is* (its base class and the capabilities below), never what it is called.

* `GramianWeighting`: weights `w` from the `K x K` Gramian of the heads' gradients; the
  aggregate is `w @ G` (MGDA, CAGrad, UPGrad, ...). `StatefulGramianWeighting` also
  carries a state from step to step (GradVac, Nash-MTL, SDMGrad).
* `CoordinatewiseAggregator`: combines each `K x n` block of gradients coordinate by
  coordinate (GradDrop, TrimmedMean).
* `BufferedAggregator`: keeps a running `K x D` copy of the gradients besides a small
  state (MoCo, DB-MTL, ExcessMTL).
* `LossWeighting` (in `loss_weighting`): scales the heads' losses before any gradient;
  composes with every aggregator.
"""

from __future__ import annotations

import inspect
import math
import types
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf


class Weighting(NamedTuple):
    """Result of a Gramian-based weighting.

    Attributes:
        weights: `(K,)`, the Gramian's dtype (float32 in the step, float64 for
            analysis); the aggregate is `weights @ G`.
        projections: int32 scalar, the number of gradient projections made
            (PCGrad's conflicting pairs; 0 for the other aggregators).
        state: a stateful weighting's new state, else None.
    """

    weights: tf.Tensor
    projections: tf.Tensor
    state: dict[str, tf.Tensor] | None = None


class StateSpec(NamedTuple):
    """One state entry of a stateful method.

    Attributes:
        initial: `K -> ` the initial value as a numpy array, for K heads.
        head_axes: how many leading axes index heads (0: shared, 1: per head,
            2: per pair of heads); a step of some heads only reads and writes
            their entries.
    """

    initial: Callable[[int], np.ndarray]
    head_axes: int


class Buffered(NamedTuple):
    """Result of a buffered aggregator's step.

    Attributes:
        directions: per block, `(n_i,)`: the aggregate's part in that block.
        weights: `(K,)`: the weights of the rows combined, the buffer's rows (MoCo's
            `lambd`, DB-MTL's `alpha`) or the gradients' (ExcessMTL's loss weights).
        buffers: buffer name -> the new `K x n_i` blocks.
        state: the new small state.
        projections: int32 0 (no projections; for the step's logging).
    """

    directions: list[tf.Tensor]
    weights: tf.Tensor
    buffers: dict[str, list[tf.Tensor]]
    state: dict[str, tf.Tensor]
    projections: tf.Tensor | None = None


def _buffered(directions: list[tf.Tensor], weights: tf.Tensor, buffers: dict[str, list[tf.Tensor]],
              state: dict[str, tf.Tensor]) -> Buffered:
    return Buffered(directions, weights, buffers, state, tf.constant(0, tf.int32))


# -- option checks (raised from constructors, naming the method and the option) ---------------


def check_number(method: str, key: str, value: Any, low: float, high: float = math.inf,
                 integer: bool = False, closed_high: bool = True) -> None:
    """Raises `ValueError` unless `value` is a finite number (an int if `integer`) in
    `[low, high]` (`[low, high)` when not `closed_high`)."""
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    ok = ok and math.isfinite(value) and low <= value and (value <= high if closed_high else value < high)
    if not ok:
        bound = f"[{low}, {high}{']' if closed_high else ')'}"
        kind = "an integer" if integer else "a number"
        raise ValueError(f"aggregator {method!r}: {key} must be {kind} in {bound}, got {value!r}")


def check_one_of(method: str, key: str, value: Any, choices: Sequence[Any]) -> None:
    """Raises `ValueError` unless `value` is one of `choices`."""
    if isinstance(value, bool) or value not in choices:
        listed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ValueError(f"aggregator {method!r}: {key} must be {listed}, got {value!r}")


# -- the bases -------------------------------------------------------------------------------


class Aggregator:
    """Base of every gradient aggregator: combines the heads' trunk gradients.

    Subclass one of `GramianWeighting`, `StatefulGramianWeighting`,
    `CoordinatewiseAggregator` or `BufferedAggregator`, not this class. Built-in
    methods set `name` (their config name); a user's method may leave it None (its
    class name is then used in messages). To name a user class in a config, register
    it with `keras.saving.register_keras_serializable(package=...)` and give
    `get_config` (the constructor's keyword arguments).

    Capabilities (class attributes, read by the trunk update instead of names):
        rep_grad: combining the gradients at the trunk output is valid (constant
            weights: identical; MGDA: the paper's MGDA-UB bound; IMTL-G: the paper
            computes it on the shared features).
        random_order: takes a fresh random projection order `order=` each step
            (PCGrad, GradVac).
        noise: `"normal"`: takes `noise=` K standard normal draws each step (Random);
            `"uniform"`: one uniform draw per coordinate of each block (GradDrop).
        counts_projections: its `projections` are worth logging (PCGrad).
        needs_losses: reads the heads' losses besides their gradients (EPO's `losses=`,
            MoCo's and DB-MTL's `losses` argument).
        citation: the paper.
    """

    name: ClassVar[str | None] = None
    citation: ClassVar[str] = ""
    rep_grad: ClassVar[bool] = False
    random_order: ClassVar[bool] = False
    noise: ClassVar[str | None] = None
    counts_projections: ClassVar[bool] = False
    needs_losses: ClassVar[bool] = False
    log_losses: ClassVar[bool] = False
    buffers: ClassVar[tuple[str, ...]] = ()
    #: A built-in's options (set per instance); read-only empty for a user's method.
    _options: Mapping[str, Any] = types.MappingProxyType({})

    @property
    def label(self) -> str:
        """The name used in messages: `name`, else the class name."""
        return self.name or type(self).__name__

    def get_config(self) -> dict[str, Any]:
        """The constructor's keyword arguments (Keras serialization); built-ins: their options."""
        return dict(self._options)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Aggregator:
        """A new instance from `get_config()`'s output."""
        return cls(**config)

    @property
    def options(self) -> dict[str, Any]:
        """The options, defaults filled in (as `get_config`)."""
        return self.get_config()

    def state_spec(self) -> dict[str, StateSpec]:
        """The state entries this method keeps from step to step (none by default)."""
        return {}

    @property
    def stateful(self) -> bool:
        """True when the method declares state (`state_spec`) or buffers."""
        return bool(self.state_spec()) or bool(self.buffers)

    def initial_state(self, k: int) -> dict[str, np.ndarray]:
        """The state of a fresh run with `k` heads (empty when stateless)."""
        return {key: spec.initial(k) for key, spec in self.state_spec().items()}

    def check_heads(self, num_heads: int) -> None:
        """Raises `ValueError` when the method cannot combine `num_heads` heads."""
        del num_heads

    def for_heads(self, positions: Sequence[int]) -> Aggregator:
        """The method for a step of the heads at `positions` only (a head dropped);
        itself unless an option is per head (fixed weights)."""
        del positions
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class GramianWeighting(Aggregator):
    """Weights `w` (one per head) from the Gramian `G G^T`; the aggregate is `w @ G`.

    Implement `weigh(gram, **draws)`, a pure function of the `K x K` Gramian (float32
    in the step, float64 for analysis) returning `Weighting(weights, projections)`.
    `draws` holds `order=` (`random_order`) or `noise=` (`noise = "normal"`) when the
    class asks for them, and `losses=` (the heads' `(K,)` losses, the Gramian's dtype)
    when it sets `needs_losses = True`. Set `constant = True` when the weights never read the Gramian
    (the step then skips computing it).
    """

    constant: ClassVar[bool] = False

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        """`Weighting` for the `K x K` Gramian `gram`."""
        raise NotImplementedError(f"{type(self).__name__} must implement weigh(gram, **draws)")

    def __call__(self, gram: tf.Tensor, **kwargs: Any) -> Weighting:
        return self.weigh(gram, **kwargs)


class StatefulGramianWeighting(GramianWeighting):
    """A Gramian weighting that carries a state (tensors) from step to step.

    Implement `state_spec()` (entries, initial values, head axes) and
    `weigh(gram, state, **draws)` returning `Weighting(weights, projections, new_state)`
    (the new state has the same entries, shapes and dtypes). The runner owns the
    variables: the state is checkpointed and, on a step of some heads only, their
    entries alone are read and written.
    """

    def state_spec(self) -> dict[str, StateSpec]:
        raise NotImplementedError(f"{type(self).__name__} must implement state_spec()")

    def weigh(self, gram: tf.Tensor, state: dict[str, tf.Tensor] | None = None,  # type: ignore[override]
              **draws: tf.Tensor) -> Weighting:
        raise NotImplementedError(f"{type(self).__name__} must implement weigh(gram, state, **draws)")


class CoordinatewiseAggregator(Aggregator):
    """Combines each `K x n` block of the heads' gradients coordinate by coordinate.

    Implement `combine(block, **draws) -> (n,)` (`noise=`: uniform draws, one per
    coordinate, when `noise = "uniform"`).
    """

    def combine(self, block: tf.Tensor, **draws: tf.Tensor) -> tf.Tensor:
        """The `(n,)` combination of a `K x n` block."""
        raise NotImplementedError(f"{type(self).__name__} must implement combine(block)")

    def __call__(self, block: tf.Tensor, **kwargs: Any) -> tf.Tensor:
        return self.combine(block, **kwargs)


def log_loss_factor(loss: tf.Tensor) -> tf.Tensor:
    """The factor, held constant, that turns a loss's gradient into that of `log(L + 1e-8)`:
    `1 / (L + 1e-8)`, by which the step scales each objective of an aggregator with
    `log_losses` (DB-MTL's loss-scale balancing)."""
    return tf.stop_gradient(1.0 / (loss + 1e-8))


class BufferedAggregator(Aggregator):
    """Keeps a running `K x D` copy of the gradients (`buffers`, zero at first) besides a
    small state (`state_spec`), and works on the gradients themselves in column blocks.

    Implement `update(blocks, buffers, losses, state) -> Buffered`. `needs_losses`: reads
    each head's loss; `log_losses`: the heads descend `log(L_k + 1e-8)` (the step scales
    each objective by `1 / (L_k + 1e-8)`, held constant).
    """

    def update(self, blocks: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
               losses: tf.Tensor | None, state: Mapping[str, tf.Tensor]) -> Buffered:
        """One step on the `K x n_i` gradient blocks."""
        raise NotImplementedError(f"{type(self).__name__} must implement update(...)")

    def __call__(self, blocks: Sequence[tf.Tensor], **kwargs: Any) -> Buffered:
        return self.update(blocks, **kwargs)


def constructor_options(cls: type) -> tuple[str, ...]:
    """The keyword options a method class's constructor takes."""
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in params if p.name != "self"
                 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
