"""The only module that reads private Keras / TensorFlow names.

Each accessor says which private name it reads and which release it mirrors
(Keras 3.15, TensorFlow 2.21). `tests/test_keras_internals.py` calls every
accessor on real objects of the installed release, so an upgrade that moves a
name fails there, in one place, instead of deep inside a training step; and a
test greps the package so no other module reads a private name.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import keras
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

#: The releases these accessors were written against.
KERAS_VERSION = "3.15"
TENSORFLOW_VERSION = "2.21"


# -- optimizers ---------------------------------------------------------------------------


def built_variables(optimizer: keras.optimizers.Optimizer) -> list[Any]:
    """The variables a built optimizer was built on, in build order
    (`BaseOptimizer._trainable_variables`)."""
    return list(optimizer._trainable_variables)  # noqa: SLF001


def optimizer_strategy(optimizer: keras.optimizers.Optimizer) -> Any:
    """The `tf.distribute` strategy a TF-backend optimizer was created under, or None
    (`TFOptimizer._distribution_strategy`)."""
    return getattr(optimizer, "_distribution_strategy", None)


#: Per optimizer class: the private names its direct update reads.
_SLOT_NAMES = {
    keras.optimizers.Adam: ("_get_variable_index", "_momentums", "_velocities"),
    keras.optimizers.SGD: ("_get_variable_index", "momentums"),
}


def has_slot_internals(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether the slot lists and variable index `adam_slots` / `sgd_momentum` read exist."""
    names = _SLOT_NAMES.get(type(optimizer), ())
    return bool(names) and all(hasattr(optimizer, name) for name in names)


def adam_slots(optimizer: keras.optimizers.Adam, variable: Any) -> tuple[Any, Any, Any]:
    """`(m, v, v_hat or None)` of `variable` (`Adam._momentums`, `_velocities`,
    `_velocity_hats`, indexed by `BaseOptimizer._get_variable_index`)."""
    index = optimizer._get_variable_index(variable)  # noqa: SLF001
    v_hat = optimizer._velocity_hats[index] if optimizer.amsgrad else None  # noqa: SLF001
    return optimizer._momentums[index], optimizer._velocities[index], v_hat  # noqa: SLF001


def sgd_momentum(optimizer: keras.optimizers.SGD, variable: Any) -> Any:
    """The momentum slot of `variable` (`SGD.momentums` by `_get_variable_index`)."""
    return optimizer.momentums[optimizer._get_variable_index(variable)]  # noqa: SLF001


# -- layers -------------------------------------------------------------------------------


def seed_generator_states(layer: keras.layers.Layer) -> list[Any]:
    """Seed-generator state variables of `layer` and its sublayers, in tracking order
    (`Layer._flatten_layers`, `Layer._seed_generators`): `tf.train.Checkpoint` does not
    see them through the layer."""
    states, seen = [], set()
    for sub in layer._flatten_layers(include_self=True, recursive=True):  # noqa: SLF001
        for generator in getattr(sub, "_seed_generators", ()):
            if id(generator.state) not in seen:
                seen.add(id(generator.state))
                states.append(generator.state)
    return states


def direct_sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The layers a (non-Model) layer tracks directly (`Layer._layers`)."""
    return list(getattr(layer, "_layers", []))


def all_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """`layer` and every layer under it, each once (`Layer._flatten_layers`)."""
    return list(layer._flatten_layers(include_self=True, recursive=True))  # noqa: SLF001


def own_losses(layer: keras.layers.Layer) -> list[Any]:
    """The losses `layer` itself added with `add_loss` in its last call, not its sublayers'
    nor weight regularizers' (`Layer._get_own_losses`)."""
    return list(layer._get_own_losses())  # noqa: SLF001


class CheckpointedLists:
    """Mixin for a Keras layer that keeps sublayers or variables in list attributes
    (`self.gates = [Dense(...), ...]`), so that `tf.train.Checkpoint` saves them.

    Keras 3 wraps such lists in its own `TrackedList`, which TensorFlow's object graph
    does not follow (`Layer._trackable_children` of the TF backend lists the direct
    layer and variable attributes only): a checkpoint of the layer silently lacked
    every variable held in a list. This adds one node per such list, its items as
    children `"0"`, `"1"`, ... (keys `gates/0/_kernel`, `experts/stack/0/kernel`).
    """

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
        children = super()._trackable_children(save_type, **kwargs)  # type: ignore[misc]
        if save_type != "checkpoint":
            return children
        nodes = self.__dict__.setdefault("_multihead_list_nodes", {})
        for name, value in list(vars(self).items()):
            if (name in children or name.startswith("_") or not isinstance(value, (list, tuple))
                    or not value or not all(isinstance(v, (keras.layers.Layer, keras.Variable))
                                            for v in value)):
                continue
            items, node = nodes.get(name, ((), None))
            if node is None or len(items) != len(value) or any(a is not b for a, b in zip(items, value)):
                node = tf.__internal__.tracking.AutoTrackable()
                for i, item in enumerate(value):
                    setattr(node, str(i), item)
                nodes[name] = (tuple(value), node)  # one node per list, while the list is the same
            children[name] = node
        return children


def own_variables(layer: keras.layers.Layer) -> list[Any]:
    """The variables a layer created itself, not through sublayers
    (`Layer._trainable_variables` + `Layer._non_trainable_variables`)."""
    return list(getattr(layer, "_trainable_variables", [])) + list(
        getattr(layer, "_non_trainable_variables", []))


def functional_inputs(model: keras.Model) -> Any:
    """The input structure a functional model was built on (`Functional._inputs_struct`:
    a dict for named inputs), or None for other models."""
    return getattr(model, "_inputs_struct", None)


def build_shapes(model: keras.Model) -> dict[str, Any]:
    """The shapes a model was built with (`Layer._build_shapes_dict`), or `{}`."""
    return getattr(model, "_build_shapes_dict", None) or {}


# -- the fit loop -------------------------------------------------------------------------


#: The private keyword arguments Keras' `fit` passes to `model.evaluate` for
#: `validation_data` (`TensorFlowTrainer.fit`: `_use_cached_eval_dataset=True`), which an
#: `evaluate` override must accept.
FIT_EVALUATE_KWARGS = ("_use_cached_eval_dataset",)


def has_auto_name(layer: keras.layers.Layer) -> bool:
    """Whether `layer.name` is the one Keras made up for it, not one its author chose:
    the snake-cased class name, then `_<n>` (`keras.src.utils.naming.auto_name`)."""
    from keras.src.utils.naming import to_snake_case

    stem = re.escape(to_snake_case(type(layer).__name__))
    return re.fullmatch(f"{stem}(_[0-9]+)?", layer.name) is not None


# -- TensorFlow ---------------------------------------------------------------------------


def summary_writer_resource(writer: tf.summary.SummaryWriter) -> Any:
    """The resource handle `tf.summary.write` writes to (`ResourceSummaryWriter._resource`),
    or None for a writer without one."""
    return getattr(writer, "_resource", None)


def flat_call(concrete: Any) -> Callable[[list[tf.Tensor]], Any]:
    """A call of `concrete` (a `tf.function`'s concrete function) on its flat tensor inputs,
    in `tf.nest.flatten` order (`ConcreteFunction._call_flat` with its captured inputs), past
    the binding of `concrete(*args)` to its structured signature (a bind and a type cast per
    argument: about 85 of a small DQN step's 400 us on one core). The caller passes exactly
    the tensors of the signature `concrete` was traced for: no check is made."""
    return lambda flat: concrete._call_flat(flat, concrete.captured_inputs)  # noqa: SLF001


def keep_cond_functional(op: tf.Operation) -> None:
    """Marks an `If` op so the graph keeps it functional instead of lowering it to
    Switch/Merge (`Operation._set_attr`, attribute `_lower_using_switch_merge`): a
    lowered cond visits every node of the untaken branch on each run."""
    op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))  # noqa: SLF001


# -- processes ----------------------------------------------------------------------------


def end_cluster_process(code: int) -> None:
    """If this process joined a multi-worker cluster (its eager context has a coordination
    service, `context.context().coordination_service`), runs the exit handlers
    (`atexit._run_exitfuncs`: autograph's temporary files go, as at a normal exit), flushes
    and ends the process with `code` at once (`os._exit`); otherwise returns. The
    interpreter's own shutdown there can wait forever on TensorFlow's cluster threads
    (measured: a worker that had written all its results hung in `Py_FinalizeEx`)."""
    import atexit
    import os
    import sys

    from tensorflow.python.eager import context

    if context.context().coordination_service is None:
        return
    atexit._run_exitfuncs()  # noqa: SLF001
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # noqa: SLF001

