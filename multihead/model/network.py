"""`MultiHeadNetwork`: a shared trunk feeding named heads (the public class with Keras'
`compile` / `fit` is `multihead.MultiHeadModel`, in `multihead.training.keras_model`)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import keras
import numpy as np
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._checks import check_name
from multihead.datasets.multitask import check_array_data
from multihead.model.input_shape import check_input_width
from multihead.model.model_size import ParameterCounts, count_parameters
from multihead.model.partition import Partition, partition_variables
from multihead.model import taps as _taps


def routes_heads(trunk: keras.layers.Layer) -> bool:
    """Whether `trunk` gives each head its own features (`{head: features}`) and owns
    layers that belong to single heads (the `head_owned_layers()` protocol, as the
    layers of `multihead.model.architectures` do)."""
    return callable(getattr(trunk, "head_owned_layers", None))


def head_input(trunk: keras.layers.Layer, features: Any, head: str,
               taps: Mapping[str, int] | None = None) -> Any:
    """What head `head` reads of the trunk output `features`: its own entry for a trunk
    that routes heads; with trunk taps (`features` a `TrunkOutputs`), the output of the
    block `taps` gives it (the trunk's output for a head without one); the whole output
    otherwise."""
    if isinstance(features, _taps.TrunkOutputs):
        return _taps.tap_output(features, (taps or {}).get(head), f"head {head!r}")
    return features[head] if routes_heads(trunk) else features


def trunk_owned_variables(trunk: keras.layers.Layer) -> dict[str, list[keras.Variable]]:
    """Head -> the trainable variables of the layers `trunk` owns for that head ({} for a
    trunk that does not route heads)."""
    if not routes_heads(trunk):
        return {}
    return {head: [v for layer in layers for v in layer.trainable_variables]
            for head, layers in trunk.head_owned_layers().items()}


def trunk_losses(trunk: keras.layers.Layer) -> tuple[list[Any], dict[str, list[Any]]]:
    """The trunk's losses (`add_loss` in its last call, weight regularizers), split as its
    variables are: `(shared, {head: losses of the layers the trunk owns for head})`.

    A loss added by a head's gate (DSelect-k's entropy regulariser) or a regularizer on
    its kernel belongs to that head's objective, like the gate's variables belong to
    its var_list; the rest is shared. A trunk that does not route heads: `(trunk.losses, {})`.
    """
    if not routes_heads(trunk):
        return list(trunk.losses), {}
    owned = trunk.head_owned_layers()
    owned_ids = {id(sub) for layers in owned.values() for layer in layers
                 for sub in internals.all_layers(layer)}
    owned_vars = {id(v) for layers in owned.values() for layer in layers
                  for v in layer.trainable_weights}
    shared = [loss for sub in internals.all_layers(trunk) if id(sub) not in owned_ids
              for loss in internals.own_losses(sub)]
    shared += [v.regularizer(v) for v in trunk.trainable_weights
               if id(v) not in owned_vars and v.regularizer is not None]
    return shared, {head: [loss for layer in layers for loss in layer.losses]
                    for head, layers in owned.items()}


def _zeros_like_shape(shape: Any) -> Any:
    """Zero tensors for an input shape (unknown dimensions become 1), nested."""
    if isinstance(shape, Mapping):
        return {k: _zeros_like_shape(v) for k, v in shape.items()}
    if isinstance(shape, (list, tuple)) and shape and isinstance(shape[0], (list, tuple, dict)):
        return type(shape)(_zeros_like_shape(s) for s in shape)
    return tf.zeros([1 if d is None else int(d) for d in shape])


def _name_parts(trunk: keras.layers.Layer, heads: Mapping[str, keras.layers.Layer]) -> None:
    """Names the trunk `trunk` and each head by its head name, so `model.summary()` and
    Keras' messages say which part is which; a layer whose name its author chose (anything
    but Keras' made-up `dense_3`, `sequential_1`, ...) keeps it, and so does the trunk when
    a head is called `trunk`."""
    parts = [] if "trunk" in heads else [("trunk", trunk)]
    for part, layer in [*parts, *heads.items()]:
        if internals.has_auto_name(layer):
            layer.name = part


class MultiHeadNetwork(keras.Model):
    """A shared trunk feeding several named heads, as Keras layers: the model without
    Keras' `compile` / `fit`, which `multihead.MultiHeadModel` adds on top
    (`multihead.training.keras_model`). Everything below the training loop (the
    partition, the step, checkpoints of parts) needs only this.

    Args and behaviour: see `multihead.MultiHeadModel`.
    """

    def __init__(
        self,
        trunk: keras.layers.Layer,
        heads: Mapping[str, keras.layers.Layer],
        name: str | None = None,
        taps: Mapping[str, str | int] | None = None,
        preprocess: keras.layers.Layer | None = None,
    ) -> None:
        super().__init__(name=name)
        if not isinstance(trunk, keras.layers.Layer):
            raise TypeError(f"trunk must be a Keras layer or model, got {type(trunk).__name__}")
        if preprocess is not None and not isinstance(preprocess, keras.layers.Layer):
            raise TypeError(f"preprocess must be a Keras layer, got {type(preprocess).__name__}")
        if not isinstance(heads, Mapping) or not heads:
            raise ValueError("heads must be a non-empty dict of name -> Keras layer")
        for head_name, head in heads.items():
            check_name(head_name, "head")
            if not isinstance(head, keras.layers.Layer):
                raise TypeError(
                    f"head {head_name!r} must be a Keras layer or model, got {type(head).__name__}"
                )
            if head is trunk:
                raise ValueError(f"head {head_name!r} is the trunk object itself")
        if routes_heads(trunk):
            routed = list(getattr(trunk, "head_names", ()))
            if sorted(routed) != sorted(heads):
                raise ValueError(
                    f"the trunk {type(trunk).__name__} routes heads {routed}, but the model's heads "
                    f"are {list(heads)}; build the trunk with heads={list(heads)}")
        self._taps = _taps.resolve_taps(trunk, taps, list(heads))
        self._tap_spec = {h: taps[h] for h in heads if h in self._taps} if taps else {}
        _name_parts(trunk, heads)
        self.trunk = trunk
        self.preprocess = preprocess
        self.heads = dict(heads)
        self._head_names = tuple(heads)
        self._partition: Partition | None = None
        self._predict_functions: dict[tuple[str, ...], Any] = {}

    @property
    def head_names(self) -> tuple[str, ...]:
        """Head names, in the order they were given."""
        return self._head_names

    def build(self, input_shape: Any) -> None:
        """Creates all variables by running the trunk and heads once on zeros of `input_shape`.

        Raises:
            ValueError: `preprocess` has variables (see `MultiHeadModel`).
        """
        zeros = _zeros_like_shape(input_shape)
        feats = self.trunk(self.prepared(zeros))
        if self.preprocess is not None and self.preprocess.weights:
            raise ValueError(
                f"preprocess: {type(self.preprocess).__name__} {self.preprocess.name!r} has "
                f"variables ({self.preprocess.weights[0].path}), which checkpoints of the trunk and "
                "heads do not save; give one with constants, e.g. multihead.model.standardize."
                "Standardize(mean, scale) instead of an adapted Normalization, or put the layer in "
                "the trunk")
        if self._taps:  # the trunk is built; its blocks' outputs feed the tapped heads
            feats = self.features(zeros)
        for name in self._head_names:
            self.heads[name](head_input(self.trunk, feats, name, self._taps))

    def prepared(self, inputs: Any) -> Any:
        """`inputs` as the trunk reads them: through `preprocess` (e.g. standardized), or as
        they are without one."""
        return inputs if self.preprocess is None else self.preprocess(inputs)

    def features(self, inputs: Any, training: bool | None = None,
                 taps: Iterable[str] = ()) -> Any:
        """What the heads read of the trunk for `inputs`: the trunk's output; with trunk
        taps (the model's, or `taps`), a `multihead.model.taps.TrunkOutputs` holding the
        trunk's output and the tapped blocks' outputs (the trunk runs block by block).

        Args:
            inputs: the model's inputs.
            training: Keras' training flag.
            taps: more taps to compute, `"trunk/<block>"` (an objective's reads), for
                `tap_output`.
        """
        extra = [_taps.resolve_block(self.trunk, t, "features(taps=...)") for t in taps]
        return _taps.trunk_features(self.trunk, self.prepared(inputs), self._taps, training, extra)

    def head_output(self, head: str, features: Any, training: bool | None = None) -> Any:
        """Head `head`'s output for trunk output `features` (its own entry, for a trunk
        that routes heads; its tap's output, for a head with a trunk tap)."""
        return self.heads[head](head_input(self.trunk, features, head, self._taps),
                                training=training)

    @property
    def taps(self) -> dict[str, str]:
        """Head -> the name of the trunk block it reads, for the heads with a trunk tap."""
        names = _taps.block_names(self.trunk) if self._taps else []
        return {head: names[i] for head, i in self._taps.items()}

    @property
    def tap_indices(self) -> dict[str, int]:
        """Head -> the index of the trunk block it reads, for the heads with a trunk tap
        (what a copy of the trunk, such as a target network's, reads by)."""
        return dict(self._taps)

    def tap_output(self, features: Any, tap: str) -> Any:
        """The output of trunk tap `tap` (`"trunk/<block>"`, a block name or index) in
        `features`, as `features(inputs, taps=[tap])` computed them (`"trunk"`: the
        trunk's output).

        Example:
            >>> feats = model.features(x, taps=["trunk/block1"])        # doctest: +SKIP
            >>> model.tap_output(feats, "trunk/block1")                 # doctest: +SKIP
        """
        index = None if tap == _taps.TRUNK else _taps.resolve_block(self.trunk, tap, f"tap {tap!r}")
        return _taps.tap_output(features, index, tap)

    def tap_variables(self, tap: str) -> list[keras.Variable]:
        """The shared trunk variables the output of trunk tap `tap` (`"trunk/<block>"`,
        a block name or index) depends on: those of the blocks up to and including it,
        by object identity, in `trunk_variables` order (`"trunk"`: all of them). What
        an objective that reads `tap` and trains the trunk is built on, with its heads'."""
        if tap == _taps.TRUNK:
            return self.trunk_variables
        index = _taps.resolve_block(self.trunk, tap, f"tap {tap!r}")
        return _taps.tap_variables(self.trunk, index, self.trunk_variables)

    def blocks_table(self, trains_trunk: Mapping[str, bool] | None = None) -> str | None:
        """A plain-text table of the trunk blocks each head's var_list trains, or None when
        every head trains the whole trunk or none of it (see `multihead.model.taps.blocks_table`).

        Args:
            trains_trunk: head -> whether its optimizer trains the trunk (default: all do).
        """
        trains_trunk = trains_trunk or {}
        return _taps.blocks_table(self.trunk, {
            h: self.var_list(h, trains_trunk.get(h, True)) for h in self._head_names})

    def blocks_trained(self, variables: Iterable[keras.Variable]) -> list[str]:
        """The names of the trunk blocks that own one of `variables` (a var_list), by
        identity: which blocks an optimizer built on `variables` trains."""
        return _taps.blocks_trained(self.trunk, variables)

    @property
    def routes_heads(self) -> bool:
        """Whether the trunk gives each head its own features and owns per-head layers."""
        return routes_heads(self.trunk)

    def trunk_losses(self) -> tuple[list[Any], dict[str, list[Any]]]:
        """The trunk's losses of its last call, split as its variables are (see `trunk_losses`)."""
        return trunk_losses(self.trunk)

    def stop_shared(self, features: Any) -> Any:
        """The trunk output as a head with `trains_trunk=False` reads it.

        A plain trunk's output is read through `tf.stop_gradient`. A trunk that routes
        heads computes a head's features with layers that head owns (its gate), which
        must still train: its output is passed as is, and the shared variables stay out
        of the head's var_list, so the head's optimizer never moves them.
        """
        if self.routes_heads:
            return features
        return tf.nest.map_structure(tf.stop_gradient, features)

    def parameter_counts(self) -> ParameterCounts:
        """The trainable and non-trainable parameters of the trunk and of each head, by head
        name (see `multihead.model.model_size`); `.table()` formats them."""
        return count_parameters(self)

    def summary(self, line_length: int | None = None, positions: Any = None,
                print_fn: Any = None, **kwargs: Any) -> None:
        """Keras' summary, then the parameters of the trunk and of each head by head name
        (`parameter_counts().table()`), once the model is built; with trunk taps, the
        trunk blocks each head trains (`blocks_table()`)."""
        super().summary(line_length=line_length, positions=positions, print_fn=print_fn, **kwargs)
        if self.built and self.trunk.built:
            (print_fn or print)(self.parameter_counts().table())
            blocks = self.blocks_table()
            if blocks is not None:
                (print_fn or print)(blocks)

    def call(self, inputs: Any, training: bool | None = None) -> dict[str, Any]:
        feats = self.features(inputs, training=training)
        return {name: self.head_output(name, feats, training=training) for name in self._head_names}

    def predict(self, x: Any, batch_size: int | None = None,
                heads: Iterable[str] | None = None, verbose: Any = "auto") -> dict[str, np.ndarray]:
        """Inference outputs, `{head: array}`, computed batch by batch in one compiled function.

        Runs with `training=False` (dropout off); batches are concatenated in order.

        Args:
            x: inputs: an array, a dict of arrays (named inputs), or a batched
                `tf.data.Dataset` of inputs or of `(inputs, targets)` pairs.
            batch_size: examples per call for array inputs (default 1024).
            heads: the heads to return (default all); the trunk runs once per batch.
            verbose: accepted as Keras' `predict` takes it; nothing is printed.

        Returns:
            Head name -> numpy array with one row per example.

        Example:
            >>> import keras, numpy as np, multihead as mh
            >>> model = mh.MultiHeadModel(keras.layers.Dense(4), {"a": keras.layers.Dense(1)})
            >>> model.predict(np.zeros((3, 2), "float32"))["a"].shape
            (3, 1)
        """
        del verbose
        chosen = tuple(self._head_names if heads is None else heads)
        self.check_heads(chosen, "predict(heads=...)")
        if isinstance(x, tf.data.Dataset):
            spec = x.element_spec
            dataset = x.map(lambda *b: b[0]) if isinstance(spec, tuple) and len(spec) == 2 else x
        else:
            if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
                raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
            check_array_data(x, "x")
            check_input_width(self, x, "x")
            dataset = tf.data.Dataset.from_tensor_slices(x).batch(batch_size or 1024)
        function = self._predict_functions.get(chosen)
        if function is None:
            def forward(inputs: Any) -> dict[str, tf.Tensor]:
                feats = self.features(inputs, training=False)
                return {h: self.head_output(h, feats, training=False) for h in chosen}

            function = self._predict_functions[chosen] = tf.function(forward, reduce_retracing=True)
        parts: dict[str, list[np.ndarray]] = {h: [] for h in chosen}
        for batch in dataset:
            for h, value in function(batch).items():
                parts[h].append(value.numpy())
        if not parts[chosen[0]]:
            raise ValueError("x: the dataset yields no batch; give at least one example")
        return {h: np.concatenate(values) for h, values in parts.items()}

    def get_config(self) -> dict[str, Any]:
        """Keras serialization: the trunk and heads as Keras configs (weights are saved apart)."""
        config = {
            "name": self.name,
            "trunk": keras.saving.serialize_keras_object(self.trunk),
            "heads": {n: keras.saving.serialize_keras_object(self.heads[n]) for n in self._head_names},
        }
        if self._tap_spec:
            config["taps"] = dict(self._tap_spec)
        if self.preprocess is not None:
            config["preprocess"] = keras.saving.serialize_keras_object(self.preprocess)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "MultiHeadNetwork":
        """The model `get_config` describes, unbuilt (Keras builds it before loading weights)."""
        def load(spec: Any) -> keras.layers.Layer:
            return keras.saving.deserialize_keras_object(spec, custom_objects=custom_objects)

        return cls(trunk=load(config["trunk"]),
                   heads={n: load(spec) for n, spec in config["heads"].items()},
                   name=config.get("name"), taps=config.get("taps"),
                   preprocess=load(config["preprocess"]) if "preprocess" in config else None)

    @property
    def partition(self) -> Partition:
        """The validated trunk/head partition of the trainable variables."""
        if self._partition is None:
            if not self.built or not self.trunk.built:
                raise ValueError(
                    "the model has no variables yet: call model.build(input_shape) "
                    "or call the model on a batch first"
                )
            self._partition = partition_variables(
                trunk=self.trunk.trainable_variables,
                heads={n: self.heads[n].trainable_variables for n in self._head_names},
                all_trainable=self.trainable_variables,
                trunk_owned=trunk_owned_variables(self.trunk),
                tapped=self._tapped_variables(),
            )
        return self._partition

    def _tapped_variables(self) -> dict[str, list[keras.Variable]]:
        """Head -> the trunk variables below its tap (the trunk's are all shared: a
        trunk built from blocks owns no layer for one head)."""
        shared = self.trunk.trainable_variables
        return {h: _taps.tap_variables(self.trunk, i, shared) for h, i in self._taps.items()}

    @property
    def trunk_variables(self) -> list[keras.Variable]:
        """Shared trainable variables of the trunk (not those it owns for one head)."""
        return list(self.partition.trunk)

    def head_variables(self, head: str) -> list[keras.Variable]:
        """Trainable variables of head `head`: its layer's, then those the trunk owns for it."""
        self._check_head(head)
        return list(self.partition.heads[head])

    def var_list(self, head: str, trains_trunk: bool = True) -> list[keras.Variable]:
        """Trunk + head `head` variables (head only if `trains_trunk=False`)."""
        self._check_head(head)
        return self.partition.var_list(head, trains_trunk)

    def _check_head(self, head: str) -> None:
        if head not in self.heads:
            raise KeyError(f"the model has no head {head!r}; its heads are {list(self._head_names)}")

    def part_layers(self) -> dict[str, keras.layers.Layer]:
        """`{"trunk": trunk, "heads/<name>": head}`, the model's parts by stable key."""
        parts = {"trunk": self.trunk}
        parts.update({f"heads/{n}": self.heads[n] for n in self._head_names})
        return parts

    def check_heads(self, names: Iterable[str], what: str) -> None:
        """Raises a clear error if any of `names` is not a head of this model."""
        unknown = [n for n in names if n not in self.heads]
        if unknown:
            raise ValueError(
                f"{what} names head {unknown[0]!r}, but the model's heads are {list(self._head_names)}"
            )
