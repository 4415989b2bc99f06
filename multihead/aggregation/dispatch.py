"""The one dispatcher from an aggregator's base class to how it is run, used by `aggregate`
(an explicit `K x D` matrix) and by the train step (per-variable `K x n` blocks).

Every aggregator's direction is a function of the heads' gradients `G` (`K x D`): a
Gramian weighting returns weights `w` (the caller forms `w @ G` its own way, never
concatenating `G` in the step); a coordinate-wise or buffered aggregator returns each
block's direction itself.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import gramian
from multihead.aggregation.base import (
    Aggregator,
    BufferedAggregator,
    CoordinatewiseAggregator,
    GramianWeighting,
    StatefulGramianWeighting,
)
from multihead.aggregation.registry import AggregatorSpec, resolve_aggregator


class Outcome(NamedTuple):
    """What one run of an aggregator gives.

    Attributes:
        weights: `(K,)` row weights (Gramian and buffered methods), None for a
            coordinate-wise one.
        directions: per block, the `(n_i,)` direction, when the method forms it
            (coordinate-wise, buffered); None: the caller forms `weights @ G`.
        projections: int32 scalar (PCGrad's projections, else 0).
        state: the new state (stateful methods), else None.
        buffers: the new `K x n_i` buffer blocks (buffered methods), else None.
        gram: the Gramian, when it was computed.
    """

    weights: tf.Tensor | None
    directions: list[tf.Tensor] | None
    projections: tf.Tensor
    state: dict[str, tf.Tensor] | None = None
    buffers: dict[str, list[tf.Tensor]] | None = None
    gram: tf.Tensor | None = None


def step_draws(aggregator: Aggregator, rng: tf.random.Generator, k: int) -> dict[str, tf.Tensor]:
    """The random inputs a Gramian weighting asks for, drawn from `rng` (in this order):
    a projection order per head (`random_order`), K normal draws (`noise == "normal"`)."""
    draws = {}
    if aggregator.random_order:
        draws["order"] = tf.argsort(rng.uniform([k, k]), axis=1)
    if aggregator.noise == "normal":
        draws["noise"] = rng.normal([k])
    return draws


def needs_gramian(aggregator: Aggregator) -> bool:
    """True for a Gramian weighting whose weights read the Gramian."""
    return isinstance(aggregator, GramianWeighting) and not aggregator.constant


def run(aggregator: Aggregator, blocks: Sequence[tf.Tensor], dtype: tf.DType, *,
        gram: Callable[[], tf.Tensor] | None = None, draws: Mapping[str, tf.Tensor] | None = None,
        block_noise: Callable[[Any], tf.Tensor] | None = None,
        state: Mapping[str, tf.Tensor] | None = None,
        buffers: Mapping[str, Sequence[tf.Tensor]] | None = None,
        losses: tf.Tensor | None = None, want_gram: bool = False) -> Outcome:
    """Runs `aggregator` once on the heads' gradients, by what it is.

    Args:
        aggregator: any `Aggregator`.
        blocks: the `K x n_i` column blocks of `G` (cast to `dtype` here when read).
        dtype: the computation's precision (float32, or float64 for analysis).
        gram: computes the `K x K` Gramian in `dtype`; called only when needed.
        draws: a Gramian weighting's random inputs (`order=`, `noise=`).
        block_noise: `shape -> uniform draws`, for a coordinate-wise method with `noise`.
        state: a stateful method's state (tensors); buffers: a buffered method's.
        losses: `(K,)` the heads' losses (methods that read them: `needs_losses`).
        want_gram: compute the Gramian even for constant weights (for the caller).
    """
    zero = tf.constant(0, tf.int32)

    def cast(block: tf.Tensor) -> tf.Tensor:
        return block if block.dtype == dtype else tf.cast(block, dtype)

    if isinstance(aggregator, BufferedAggregator):
        result = aggregator.update([cast(b) for b in blocks], buffers=buffers,
                                   losses=None if losses is None else tf.cast(losses, dtype),
                                   state=state)
        return Outcome(result.weights, list(result.directions), result.projections,
                       dict(result.state), dict(result.buffers))
    if isinstance(aggregator, CoordinatewiseAggregator):
        directions = []
        for block in blocks:
            extra = {"noise": block_noise(block.shape[1:])} if aggregator.noise else {}
            directions.append(aggregator.combine(cast(block), **extra))
        return Outcome(None, directions, zero)
    if not isinstance(aggregator, GramianWeighting):
        raise TypeError(f"{type(aggregator).__name__} must subclass GramianWeighting, "
                        "CoordinatewiseAggregator or BufferedAggregator")
    k = int(blocks[0].shape[0]) if blocks else None
    g = gram() if (needs_gramian(aggregator) or want_gram) else None
    extra = dict(draws or {})
    if isinstance(aggregator, StatefulGramianWeighting):
        extra["state"] = state
    if aggregator.needs_losses:  # EPO
        if losses is None:
            raise ValueError(f"aggregator {aggregator.label!r} needs the heads' losses")
        extra["losses"] = tf.cast(losses, dtype)
    result = aggregator.weigh(g if g is not None else tf.zeros([k, k], dtype), **extra)
    return Outcome(result.weights, None, result.projections,
                   None if result.state is None else dict(result.state), None, g)


# -- aggregate: an explicit matrix -----------------------------------------------------------


class Aggregation(NamedTuple):
    """Result of `aggregate`.

    Attributes:
        direction: `(D,)` the aggregated gradient `weights @ grads`.
        weights: `(K,)` per-head weights (None for coordinate-wise methods).
        projections: number of projections made (PCGrad), else 0.
        state: a stateful aggregator's new state (pass it as `state=` to the
            next call), else None.
    """

    direction: tf.Tensor
    weights: tf.Tensor | None
    projections: tf.Tensor
    state: dict[str, tf.Tensor] | None = None


def _state_tensor(value: Any, dtype: tf.DType) -> tf.Tensor:
    """A state entry as a tensor, floating entries at the computation's dtype."""
    value = tf.convert_to_tensor(value)
    return tf.cast(value, dtype) if value.dtype.is_floating else value


def aggregate(grads: tf.Tensor, name: AggregatorSpec, dtype: tf.DType | str = "float32",
              state: dict[str, Any] | None = None, seed: int = 0, losses: Any = None,
              **options: Any) -> Aggregation:
    """Aggregates the rows of a `K x D` gradient matrix with an aggregator.

    Example:
        >>> import numpy as np, multihead as mh
        >>> g = np.array([[1.0, 0.0], [-1.0, 1.0]], np.float32)
        >>> d = mh.aggregate(g, "pcgrad").direction.numpy()   # conflicts removed
        >>> [round(float(x), 6) for x in d]
        [0.5, 1.5]
        >>> mh.aggregate(g, "mgda", dtype="float64").weights.dtype   # for analysis
        tf.float64
        >>> first = mh.aggregate(g, "gradvac")                 # stateful: carry the state
        >>> second = mh.aggregate(g, "gradvac", state=first.state)
        >>> moco = mh.aggregate(g, "moco", losses=[0.5, 2.0])   # MoCo, DB-MTL: the losses too
        >>> mh.aggregate(g, mh.aggregation.CAGrad(c=0.2)).weights.shape   # an instance
        TensorShape([2])

    Args:
        grads: `K x D` matrix, row k head k's (flattened) trunk gradient.
        name: one of `AGGREGATORS`, or an `Aggregator` instance (a user's too).
        dtype: `"float32"` (the step's) or `"float64"`: the precision of the
            Gramian, the solve and the result.
        state: a stateful aggregator's state, as returned in `Aggregation.state`
            by the previous call; None: its initial state.
        seed: seed of the draws of a random aggregator (`random`, `graddrop`) when
            `noise=` is not given.
        losses: `(K,)` each head's loss, the one whose gradient is row k: needed by
            `moco`, `db_mtl` and `epo`, ignored by the others.
        **options: a named aggregator's options, plus `order=` for PCGrad and GradVac
            and `noise=` for Random (`(K,)` normal) and GradDrop (`(D,)` uniform).
    """
    dtype = tf.as_dtype(dtype)
    if dtype not in (tf.float32, tf.float64):
        raise ValueError(f"aggregate: dtype must be 'float32' or 'float64', got {dtype.name!r}")
    grads = tf.cast(tf.convert_to_tensor(grads), dtype)
    k, d = int(grads.shape[0]), int(grads.shape[1])
    call_opts = {key: v for key, v in options.items() if key not in ("order", "noise")}
    agg = resolve_aggregator(name, call_opts, num_heads=k)
    draws: dict[str, Any] = {}
    if "order" in options:
        draws["order"] = tf.convert_to_tensor(options["order"], tf.int32)
    noise = options.get("noise")
    if agg.noise is not None:
        if noise is None:
            rng = tf.random.Generator.from_seed(seed)
            noise = rng.normal([k]) if agg.noise == "normal" else rng.uniform([d])
        noise = tf.cast(tf.convert_to_tensor(noise), dtype)
        if agg.noise == "normal":
            draws["noise"] = noise
    if isinstance(agg, BufferedAggregator):
        return _aggregate_buffered(agg, grads, dtype, state, losses)
    if isinstance(agg, CoordinatewiseAggregator):
        direction = tf.function(lambda g: run(agg, [g], dtype, block_noise=lambda _: noise)
                                .directions[0])(grads)
        return Aggregation(direction, None, tf.constant(0, tf.int32))
    small = None
    if agg.state_spec():
        current = agg.initial_state(k) if state is None else state
        small = {key: _state_tensor(v, dtype) for key, v in current.items()}
    if agg.needs_losses:
        losses = _losses(agg, losses, k, dtype)
    # Traced once per call: the solvers' while loops are slow op by op in eager mode.
    result = tf.function(lambda gram: run(agg, [grads], dtype, gram=lambda: gram, draws=draws,
                                          state=small, losses=losses,
                                          want_gram=True))(gramian(grads, dtype))
    return Aggregation(tf.linalg.matvec(grads, result.weights, transpose_a=True),
                       result.weights, result.projections, result.state)


def _aggregate_buffered(agg: BufferedAggregator, grads: tf.Tensor, dtype: tf.DType,
                        state: dict[str, Any] | None, losses: Any) -> Aggregation:
    """`aggregate` for a buffered method: the explicit matrix as one block; the state
    carried between calls holds the `K x D` buffers too."""
    k, d = int(grads.shape[0]), int(grads.shape[1])
    losses = _losses(agg, losses if losses is not None or agg.needs_losses else np.zeros(k),
                     k, dtype)
    if state is None:
        state = {**agg.initial_state(k), **{key: np.zeros((k, d)) for key in agg.buffers}}
    expected = set(agg.state_spec()) | set(agg.buffers)
    if set(state) != expected:
        raise ValueError(f"aggregate: the state of {agg.label!r} has the entries "
                         f"{sorted(expected)} (pass the previous call's Aggregation.state), "
                         f"got {sorted(state)}")
    small = {key: _state_tensor(state[key], dtype) for key in agg.state_spec()}
    buffers = {key: [tf.cast(tf.convert_to_tensor(state[key]), dtype)] for key in agg.buffers}
    # Eager: a few elementwise ops and one K x K product, no solver loop to compile.
    result = run(agg, [grads], dtype, buffers=buffers, losses=losses, state=small)
    new_state = {**result.state, **{key: blocks[0] for key, blocks in result.buffers.items()}}
    return Aggregation(result.directions[0], result.weights, result.projections, new_state)


def _losses(agg: Aggregator, losses: Any, k: int, dtype: tf.DType) -> tf.Tensor:
    """`aggregate`'s `losses=` for a method that reads them, checked: one per row."""
    if losses is None:
        raise ValueError(f"aggregate: aggregator {agg.label!r} needs losses=[L_1, ..., L_K], "
                         "each head's loss (the one whose gradient is row k)")
    losses = tf.cast(tf.convert_to_tensor(losses), dtype)
    if losses.shape != (k,):
        raise ValueError(f"aggregate: losses must have one entry per row of grads ({k}), "
                         f"got shape {tuple(losses.shape)}")
    return losses
