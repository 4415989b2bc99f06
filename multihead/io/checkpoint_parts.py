"""Checkpoint parts: the names under which a model, trainer and targets are saved.

The object graph of a multihead checkpoint is

    trunk                 the trunk layer
    heads/<name>          each head layer (with the layers a routing trunk owns
                          for that head, e.g. its MMoE gate: see `head_part`)
    rng                   the seed states of the model's random layers (Dropout, ...)
    optimizers/<name>     each head's optimizer (slots, iterations, and the
                          variables it was built on)
    trunk_update          the aggregated trunk update (trunk optimizer, loss
                          weighting, RNG), when the trainer has one
    step                  the trainer's step counter
    data                  the position of `Trainer.fit` in its data stream
    frozen                the trainer's per-head freeze flags (`Trainer.freeze`)
    loss_scales           each head's dynamic loss scale and growth counter
                          (float16, `Trainer.loss_scales`)
    targets/<name>        target networks (copies and sync counters)

so a checkpoint restores into a freshly built model in another process (Keras
auto-names such as `dense_7` never enter the keys), and any subset of parts can
be saved or restored: a trunk-only restore into a model with other heads works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from multihead import _keras_internals as internals
from multihead.training.keras_model import MultiHeadModel

if TYPE_CHECKING:
    from multihead.training.trainer import Trainer

#: Parts that name a group: `"heads"` is every `heads/<name>`, and so on.
GROUPS = ("heads", "optimizers", "targets")
#: The order parts are listed in (the order of the object graph in the module doc; `run`
#: is the `CheckpointManager`'s own record).
ORDER = ("trunk", "heads", "rng", "optimizers", "trunk_update", "step", "data", "frozen",
         "loss_scales", "targets", "run")
#: Parts that checkpoints written before they existed lack: restoring such a checkpoint
#: keeps their current value (no head frozen, the initial loss scales).
OPTIONAL = ("frozen", "loss_scales")


def target_map(targets: Mapping[str, Any] | None) -> dict[str, Any]:
    """`targets` as a dict, after checking every name and object can be a part.

    Raises:
        ValueError: a name is empty or holds '/'.
        TypeError: a target is not trackable.
    """
    found = dict(targets or {})
    for name, target in found.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"targets: name {name!r} is not allowed; use a non-empty name without '/'")
        if not isinstance(target, tf.__internal__.tracking.Trackable):
            raise TypeError(
                f"targets[{name!r}] must be a trackable object (a TargetNetwork or tf.Module), "
                f"got {type(target).__name__}"
            )
    return found


def available_parts(model: MultiHeadModel, trainer: Trainer | None = None,
                    targets: Mapping[str, Any] | None = None) -> list[str]:
    """Every part name that `save_checkpoint` can write for this model (trainer, targets).

    Example:
        >>> available_parts(model)                                   # doctest: +SKIP
        ['trunk', 'heads/y1', 'heads/y2', 'rng']

    Args:
        model: the model.
        trainer: its trainer; adds the optimizer, step and data parts.
        targets: name -> target network; adds a `targets/<name>` part each.

    Returns:
        Part names, in the order of the object graph.
    """
    parts = ["trunk"] + [f"heads/{h}" for h in model.head_names] + ["rng"]
    if trainer is not None:
        parts += list(trainer.checkpoint_state().parts())
    parts += [f"targets/{name}" for name in target_map(targets)]
    return parts


def expand_parts(parts: Sequence[str] | None, known: list[str], trainer: Trainer | None) -> list[str]:
    """The part names `parts` asks for (groups expanded), from the `known` ones.

    Args:
        parts: part names or groups; None asks for every known part.
        known: the parts available (`available_parts`).
        trainer: the trainer given, to say why an optimizer part is unknown without one.

    Raises:
        TypeError: `parts` is a string.
        ValueError: a part is unknown, or `parts` is empty.
    """
    if parts is None:
        return list(known)
    if isinstance(parts, str):
        raise TypeError(f"parts must be a list of part names, got the string {parts!r}; "
                        f"write parts=[{parts!r}]")
    wanted: list[str] = []
    for part in parts:
        if part in GROUPS:
            members = [k for k in known if k.startswith(part + "/")]
        else:
            members = [part] if part in known else []
        if not members:
            hint = ""
            if trainer is None and part.split("/")[0] in ("optimizers", "step", "data", "trunk_update",
                                                         "frozen", "loss_scales"):
                hint = " (optimizer, step, data and frozen parts need trainer=...)"
            elif part.startswith("targets"):
                hint = " (target parts need targets={name: target})"
            raise ValueError(f"unknown checkpoint part {part!r}{hint}; parts are {known}")
        wanted += [m for m in members if m not in wanted]
    if not wanted:
        raise ValueError("parts is empty; name at least one part or pass None for all")
    return wanted


def part_objects(model: MultiHeadModel, trainer: Trainer | None, targets: Mapping[str, Any],
                 parts: Sequence[str]) -> dict[str, Any]:
    """Part name -> the trackable object saved under it."""
    objects: dict[str, Any] = {}
    state = trainer.checkpoint_state().parts() if trainer is not None else {}
    for part in parts:
        kind, _, name = part.partition("/")
        if kind == "trunk":
            objects[part] = model.trunk
        elif kind == "heads":
            objects[part] = head_part(model, name)
        elif kind == "rng":
            objects[part] = group({
                "trunk": internals.seed_generator_states(model.trunk),
                "heads": group({h: internals.seed_generator_states(model.heads[h]) for h in model.head_names}),
            })
        elif part in state:  # optimizers/<head>, trunk_update, step, data, frozen, ...
            objects[part] = state[part]
        elif kind == "targets":
            objects[part] = targets[name]
    return objects


def head_part(model: MultiHeadModel, name: str) -> Any:
    """What `heads/<name>` saves: the head layer; for a trunk that owns layers for the
    head (a gate, an attention module), a node `{layer: head, trunk_owned: {0: ...}}`,
    so restoring the head part into a fresh model restores its gate too."""
    owned = list(model.trunk.head_owned_layers().get(name, ())) if model.routes_heads else []
    if not owned:
        return model.heads[name]
    return group({"layer": model.heads[name],
                  "trunk_owned": group({str(i): layer for i, layer in enumerate(owned)})})


def checkpoint_root(objects: Mapping[str, Any]) -> tf.train.Checkpoint:
    """The checkpoint root: `trunk`, `heads/<name>`, ... as nested nodes."""
    top: dict[str, Any] = {}
    for part, obj in objects.items():
        kind, _, name = part.partition("/")
        if name:
            top.setdefault(kind, {})[name] = obj
        else:
            top[kind] = obj
    return tf.train.Checkpoint(**{k: group(v) if isinstance(v, dict) else v for k, v in top.items()})


def group(children: Mapping[str, Any]) -> Any:
    """A node whose children are exactly `children`.

    Not a `tf.train.Checkpoint`: a head may be called `save` or `read`, and such a
    node would lose its methods to those names.
    """
    node = tf.__internal__.tracking.AutoTrackable()
    for name, child in children.items():
        setattr(node, name, child)
    return node


def check_ready(model: MultiHeadModel, trainer: Trainer | None) -> None:
    """Checks `model` (and `trainer`) have every variable a checkpoint holds.

    Builds the trainer's optimizers: their slots must exist before a save or restore.

    Raises:
        TypeError: `model` is not a `MultiHeadModel`.
        ValueError: the model is not built, or `trainer` trains another model.
    """
    if not isinstance(model, MultiHeadModel):
        raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
    if not model.built or not model.trunk.built:
        raise ValueError("the model has no variables yet: call model.build(input_shape) first")
    if trainer is not None:
        if trainer.model is not model:
            raise ValueError("trainer.model is not the model given; pass the trainer's own model")
        trainer.build_optimizers()
