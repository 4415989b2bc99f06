"""`TargetNetwork`: a frozen copy of a model's trunk and some heads, synced on a schedule.

The copy owns its own variables (checked by object identity when it is made),
starts as an exact copy of the source, and follows it either by a hard copy
every `every` calls of `update()` (Mnih et al., "Human-level control through deep
reinforcement learning", Nature 2015) or by Polyak averaging
`w <- tau * source + (1 - tau) * w` on every call, or on every `every`-th call
with both given (Polyak & Juditsky, 1992; as used for targets by Lillicrap et al.,
2016, and, on the delayed actor updates, by Fujimoto et al., 2018). Its outputs are read through
`tf.stop_gradient`, and its call counter is a variable, so a checkpoint of the
target (`tf.train.Checkpoint(target=target)`) knows when the next sync is due.

The update rules are the pure functions `polyak_average` and `periodic_due`;
`TargetNetwork` only applies them to its variables.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from multihead._checks import check_float, check_int, variable_label
from multihead.model.network import _zeros_like_shape, head_input
from multihead.training.keras_model import MultiHeadModel
from multihead.model.taps import trunk_features
from multihead.step.applier import write_state

CloneFn = Callable[[keras.layers.Layer], keras.layers.Layer]


# -- pure update rules --------------------------------------------------------------------


def polyak_average(target: Any, source: Any, tau: float | tf.Tensor) -> Any:
    """Polyak averaging of one tensor: `tau * source + (1 - tau) * target`.

    `tau = 1` is a hard copy. Pure: returns the new value, assigns nothing.
    """
    return tau * source + (1.0 - tau) * target


def periodic_due(count: Any, every: int) -> Any:
    """True when the `count`-th call (1-based) of a period-`every` update syncs.

    With `every = n`, calls n, 2n, 3n, ... sync (as optax's `periodic_update`).
    """
    return tf.equal(count % every, 0)


# -- cloning ------------------------------------------------------------------------------


def clone_layer(layer: keras.layers.Layer) -> keras.layers.Layer:
    """A new, unbuilt layer with `layer`'s architecture and fresh variables.

    Sequential models are cloned with `keras.models.clone_model`, any other layer
    (functional models included) from its Keras config.
    """
    if isinstance(layer, keras.Sequential):
        return keras.models.clone_model(layer)
    return layer.__class__.from_config(layer.get_config())


def _copy_part(source: keras.layers.Layer, part: str, clone: CloneFn) -> keras.layers.Layer:
    """Clones, builds and checks one part (`"trunk"` or `"heads/<name>"`)."""
    try:
        copy = clone(source)
    except (TypeError, ValueError, NotImplementedError, KeyError) as err:
        raise ValueError(
            f"TargetNetwork: cannot clone {part} ({type(source).__name__}) from its Keras config "
            f"({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}); "
            "give the layer a get_config(), or pass clone=<function layer -> new layer>"
        ) from None
    if not isinstance(copy, keras.layers.Layer):
        raise TypeError(f"TargetNetwork: clone of {part} returned {type(copy).__name__}, not a Keras layer")
    if not copy.built:
        build_config = source.get_build_config()
        if build_config is None:
            raise ValueError(
                f"TargetNetwork: {part} ({type(source).__name__}) records no build shape, so its "
                "copy cannot be built; pass clone= returning a built copy"
            )
        shape = build_config.get("input_shape")
        if shape is not None:
            # A call (not just build()) also creates the variables of sublayers that a
            # subclassed layer only makes in call().
            copy(_zeros_like_shape(shape))
        else:
            copy.build_from_config(build_config)
    source_ids = {id(v) for v in source.weights}
    for var in copy.weights:
        if id(var) in source_ids:
            raise ValueError(
                f"TargetNetwork: the copy of {part} shares variable {variable_label(var)!r} with "
                "the source model (same object); a target network needs its own variables: make clone= "
                "return layers that create new variables"
            )
    if len(copy.weights) != len(source.weights):
        raise ValueError(
            f"TargetNetwork: the copy of {part} has {len(copy.weights)} weights, the source "
            f"{len(source.weights)}; the clone does not have the source's structure"
        )
    for s, t in zip(source.weights, copy.weights):
        if tuple(s.shape) != tuple(t.shape):
            raise ValueError(
                f"TargetNetwork: the copy of {part} has shape {tuple(t.shape)} where the source "
                f"variable {variable_label(s)!r} has {tuple(s.shape)}"
            )
    copy.trainable = False  # no optimizer or tape ever picks these up
    return copy


class _Untracked:
    """A plain holder: objects in it are not dependencies of the module that owns it."""

    def __init__(self, layers: list[keras.layers.Layer]) -> None:
        self.layers = layers


# -- the target network -------------------------------------------------------------------


class TargetNetwork(tf.Module):
    """A frozen copy of `model`'s trunk and chosen heads, following it on a schedule.

    `every` alone: hard copy on every `every`-th call of `update()`; `tau` alone:
    Polyak step on every call; both: Polyak step on every `every`-th call (TD3's
    targets, which follow the delayed actor updates). All state (the copied weights and
    the call counter) is variables tracked by this `tf.Module`, so
    `tf.train.Checkpoint(target=target)` saves and restores all of it. Calling
    it and `update()` both work eagerly and inside a `tf.function` (for example
    in a research loss run by the compiled train step).

    Example:
        >>> import keras, numpy as np, multihead as mh
        >>> model = mh.MultiHeadModel(keras.layers.Dense(8), {"value": keras.layers.Dense(1),
        ...                                                    "policy": keras.layers.Dense(2)})
        >>> model.build((None, 4))
        >>> target = mh.TargetNetwork(model, heads=["value"], every=100)
        >>> x = np.ones((2, 4), "float32")
        >>> bool(np.all(target(x)["value"] == model(x)["value"]))
        True

    Args:
        model: a built `MultiHeadModel`, the source.
        heads: the heads to copy (with the trunk); None copies every head.
        every: hard-copy period (Polyak period with `tau`), in calls of `update()`
            (integer >= 1).
        tau: Polyak rate, `0 < tau <= 1` (1 is a hard copy on every call).
        clone: function `layer -> new layer` used to copy each part; default
            `clone_layer` (Keras config / `clone_model`). It may return an
            unbuilt layer (it is then built on the source's build shape).
        name: name of the module.

    Raises:
        ValueError: unbuilt model, unknown head, neither `every` nor `tau`, `tau`
            outside (0, 1], a copy sharing a variable with the
            source or differing in shape.
    """

    def __init__(
        self,
        model: MultiHeadModel,
        heads: Sequence[str] | None = None,
        every: int | None = None,
        tau: float | None = None,
        clone: CloneFn | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        if not isinstance(model, MultiHeadModel):
            raise TypeError(f"TargetNetwork: model must be a MultiHeadModel, got {type(model).__name__}")
        if every is None and tau is None:
            raise ValueError(
                "TargetNetwork: give every= (hard copy period) or tau= (Polyak rate), or both "
                "(a Polyak step every `every` updates), got neither"
            )
        if every is not None:
            every = check_int(every, "TargetNetwork.every", minimum=1,
                              hint="the source is copied every this many updates")
        if tau is not None:
            tau = check_float(tau, "TargetNetwork.tau", minimum=0, maximum=1, min_open=True,
                              hint="typical: 0.005; 1 copies on every update")
        if isinstance(heads, str):
            heads = [heads]
        head_names = list(model.head_names) if heads is None else list(heads)
        if not head_names:
            raise ValueError("TargetNetwork: heads is empty; name at least one head or pass None for all")
        model.check_heads(head_names, "TargetNetwork heads")
        if not model.built or not model.trunk.built:
            raise ValueError("TargetNetwork: build the model first (model.build(input_shape))")
        clone = clone or clone_layer
        self.every = every
        self.tau = None if tau is None else float(tau)
        self.head_names = tuple(head_names)
        # Held outside tf.Module's tracking: a checkpoint of the target must not hold the source.
        self._source = _Untracked([model.trunk] + [model.heads[h] for h in head_names])
        self.trunk = _copy_part(model.trunk, "trunk", clone)
        self.heads = {h: _copy_part(model.heads[h], f"heads/{h}", clone) for h in head_names}
        # The copied heads read the copy's blocks their source heads read (trunk taps).
        self._taps = {h: i for h, i in model.tap_indices.items() if h in head_names}
        # The source's input preprocessing: constants, shared, not a checkpoint dependency.
        self._preprocess = _Untracked([getattr(model, "preprocess", None)])
        self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="update_calls")
        self._update_fn = tf.function(self._update, autograph=False)  # tf.cond, no Python branch
        self.sync()

    # -- variables ---------------------------------------------------------------------

    @property
    def target_weights(self) -> list[keras.Variable]:
        """The copy's weights (trunk first, then heads in order), paired with `source_weights`."""
        return list(self.trunk.weights) + [v for h in self.head_names for v in self.heads[h].weights]

    @property
    def variables(self) -> tuple[Any, ...]:
        """Every variable of the target: the copied weights and the update counter."""
        return tuple(self.target_weights) + (self.counter,)

    @property
    def source_weights(self) -> list[keras.Variable]:
        """The source model's weights that the copy follows, in the same order."""
        return [v for layer in self._source.layers for v in layer.weights]

    @property
    def num_syncs(self) -> int:
        """Hard copies done by `update()` so far (`every` mode; not counting the initial copy)."""
        if self.every is None or self.tau is not None:
            raise ValueError("num_syncs is defined for every= targets; a tau= target averages")
        return int(self.counter.numpy()) // self.every

    # -- state changes -----------------------------------------------------------------

    def sync(self) -> None:
        """Hard copy now: the target becomes an exact copy of the source (counter unchanged)."""
        write_state([(t, s) for s, t in zip(self.source_weights, self.target_weights)])

    def update(self) -> tf.Tensor:
        """One scheduled update: counts the call, then hard-copies when due (`every`) or
        takes one Polyak step (`tau`).

        Returns:
            A boolean tensor: whether the weights changed on this call.
        """
        return self._update_fn()

    def _update(self) -> tf.Tensor:
        count = self.counter + 1
        write_state([(self.counter, count)])
        pairs = list(zip(self.source_weights, self.target_weights))
        tau = self.tau

        def follow() -> tf.Tensor:
            write_state([(t, s if tau is None else polyak_average(t, s, tf.cast(tau, t.dtype)))
                         for s, t in pairs])
            return tf.constant(True)

        if self.every is None:
            return follow()
        return tf.cond(periodic_due(count, self.every), follow, lambda: tf.constant(False))

    # -- reading -----------------------------------------------------------------------

    def __call__(self, inputs: Any, heads: Sequence[str] | None = None) -> dict[str, tf.Tensor]:
        """The copy's outputs `{head: output}` for `inputs`, under `tf.stop_gradient`.

        Args:
            inputs: the model's inputs.
            heads: the copied heads to compute (None: all), e.g. only TD3's target
                actor on the next observations.
        """
        preprocess = self._preprocess.layers[0]
        if preprocess is not None:
            inputs = preprocess(inputs)
        feats = trunk_features(self.trunk, inputs, self._taps, training=False)
        return {h: tf.stop_gradient(self.heads[h](head_input(self.trunk, feats, h, self._taps),
                                                  training=False))
                for h in (self.head_names if heads is None else heads)}
