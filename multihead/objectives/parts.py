"""What each objective reads and trains: its outputs, its prediction, its var_list.

An objective named for a head reads that head and trains the trunk and that head,
as `optimizer.minimize(loss, var_list=trunk + head)` always did. Any objective may
instead declare what it reads (heads, the trunk's output), how it combines them into
the prediction its loss sees, and which parts it trains, by address (`trunk`,
`heads/<name>`, `trunk/<index>`): ESMM's CTCVR loss reads the CTR and CVR heads and
trains both with the trunk; DDPG's actor loss reads the critic and trains the actor
alone. `resolve_parts` turns the declaration into exactly the variables the
objective's optimizer is built on, by object identity; every name it cannot resolve
is a one-line error naming the objective.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf

from multihead._autograph import converted
from multihead._checks import check_name
from multihead.model.addresses import variable_addresses
from multihead.model.model_view import HeadsModel
from multihead.objectives.objective import COMBINERS, Objective
from multihead.model.taps import resolve_block

#: The read naming the trunk's output.
TRUNK = "trunk"


@dataclasses.dataclass(frozen=True)
class ObjectiveParts:
    """An objective's reads and trained variables, resolved against a model.

    Attributes:
        name: the objective's name.
        prediction: what its loss compares with its labels, from the outputs it reads.
        trains: the addresses of the parts it trains, as declared (or defaulted).
        trained_heads: the heads it trains, in model order.
        var_list: what its optimizer is built on: the trained variables in model
            order (trunk first), without the trunk's under trunk aggregation.
        trains_trunk: whether it trains any trunk variable.
    """

    name: str
    prediction: Prediction
    trains: tuple[str, ...]
    trained_heads: tuple[str, ...]
    var_list: tuple[keras.Variable, ...]
    trains_trunk: bool

    @property
    def reads(self) -> tuple[str, ...]:
        """The outputs its loss reads: head names, or `"trunk"`."""
        return self.prediction.reads

    @property
    def is_plain(self) -> bool:
        """Whether it is a head's objective as before: it reads its own head alone."""
        return self.reads == (self.name,) and self.prediction.combine is None


def objective_order(model: HeadsModel, objectives: Mapping[str, Objective]) -> list[str]:
    """The objectives' names: those named for heads in head order, then the others in the
    order given."""
    return ([h for h in model.head_names if h in objectives]
            + [n for n in objectives if n not in model.head_names])


def check_objectives(model: HeadsModel, objectives: Mapping[str, Objective]) -> None:
    """Every objective is an `Objective` with a usable name; one that is not named for a
    head says what it reads, and reads only outputs the model has; every head is trained
    by an objective.

    Raises:
        TypeError: an entry that is not an `Objective`.
        ValueError: naming the objective or head.
    """
    if not isinstance(objectives, Mapping) or not objectives:
        raise ValueError("objectives must be a non-empty dict of name -> multihead.Objective")
    for name, objective in objectives.items():
        if not isinstance(objective, Objective):
            raise TypeError(
                f"objectives[{name!r}] must be a multihead.Objective, got {type(objective).__name__}")
        check_name(name, "objective")
        if name not in model.head_names and objective.reads is None:
            raise ValueError(
                f"objective {name!r} is not named for a head (the heads are "
                f"{list(model.head_names)}): give it reads=[...] (the outputs its loss reads), "
                "or name it after the head it trains")
        reads_of(model, name, objective)
    trained = {h for name, o in objectives.items() for h in _declared_heads(model, name, o)}
    untrained = [h for h in model.head_names if h not in trained]
    if untrained:
        raise ValueError(
            f"head {untrained[0]!r} has no objective: give every head an Objective, or add "
            f"'heads/{untrained[0]}' to the trains of an objective (objectives cover "
            f"{sorted(objectives)})")


def _declared_heads(model: HeadsModel, name: str, objective: Objective) -> list[str]:
    """The heads an objective trains, by its declaration."""
    if objective.trains is not None:
        return [a[len("heads/"):] for a in objective.trains if a.startswith("heads/")]
    return [r for r in reads_of(model, name, objective) if not _reads_trunk(r)]


def resolve_parts(model: HeadsModel, objectives: Mapping[str, Objective],
                  aggregated: bool = False) -> dict[str, ObjectiveParts]:
    """Each objective's reads and var_list (see `ObjectiveParts`), in `objective_order`.

    Args:
        model: the built model.
        objectives: name -> objective (checked by `check_objectives`).
        aggregated: the trunk has its own optimizer (trunk aggregation): the
            objectives' var_lists leave the trunk out.

    Raises:
        ValueError: naming the objective: an unknown read or part, a part that holds
            no trainable variable, an objective that trains nothing.
    """
    parts = _part_variables(model)
    resolved = {}
    for name in objective_order(model, objectives):
        resolved[name] = _resolve(model, name, objectives[name], parts, aggregated)
    return resolved


def _part_variables(model: HeadsModel) -> dict[str, list[keras.Variable]]:
    """Address -> its trainable variables: `trunk`, each `heads/<name>`, and each trunk
    sublayer by index path (`trunk/0`, `trunk/1/0`, ...)."""
    parts: dict[str, list[keras.Variable]] = {TRUNK: list(model.trunk_variables)}
    parts.update({f"heads/{h}": list(model.head_variables(h)) for h in model.head_names})
    shared = {id(v) for v in parts[TRUNK]}
    for address, var in variable_addresses(model).items():
        if not address.startswith(TRUNK + "/") or id(var) not in shared:
            continue
        path = address.split("/")[1:-1]
        for depth in range(1, len(path) + 1):
            parts.setdefault("/".join([TRUNK, *path[:depth]]), []).append(var)
    return parts


def reads_of(model: HeadsModel, name: str, objective: Objective) -> tuple[str, ...]:
    """The outputs objective `name` reads (its own head by default), checked."""
    where = f"objective {name!r}"
    reads = tuple(objective.reads) if objective.reads is not None else (name,)
    for read in reads:
        if read.startswith(TRUNK + "/"):  # a trunk tap: the trunk must have that block
            resolve_block(model.trunk, read, f"{where}: reads {read!r}")
            continue
        if read != TRUNK and read not in model.head_names:
            raise ValueError(f"{where}: reads unknown output {read!r}; the outputs are the heads "
                             f"{list(model.head_names)}, 'trunk' and 'trunk/<block>'")
    if TRUNK in reads and model.routes_heads:
        raise ValueError(f"{where}: reads 'trunk', but the trunk {type(model.trunk).__name__} "
                         "gives each head its own features; read the heads instead")
    if len(reads) > 1 and objective.combine is None:
        raise ValueError(f"{where}: reads {list(reads)}: give combine= (a callable of the "
                         f"outputs, or one of {list(COMBINERS)}) to make one prediction of them")
    return reads


class Prediction:
    """What an objective's loss compares with its labels: `prediction(outputs, inputs)`,
    from the outputs it reads (`outputs` may hold more).

    Args:
        name: the objective's name (for messages).
        reads: the outputs it reads.
        combine: `combine(outputs, inputs)`, or None: the single output read.
    """

    def __init__(self, name: str, reads: tuple[str, ...],
                 combine: Callable[[Mapping[str, Any], Any], Any] | None) -> None:
        self.name = name
        self.reads = reads
        self.combine = combine

    def __call__(self, outputs: Mapping[str, Any], inputs: Any) -> Any:
        if self.combine is None:
            return outputs[self.reads[0]]
        return self.combine({r: outputs[r] for r in self.reads}, inputs)

    def check(self, outputs: Mapping[str, Any], inputs: Any) -> None:
        """Raises unless the combination depends on every output read (eagerly, on a tape).

        Raises:
            ValueError: naming the objective and the output its combination ignores.
        """
        if self.combine is None:
            return
        watched = {r: tf.nest.map_structure(tf.identity, outputs[r]) for r in self.reads}
        with tf.GradientTape() as tape:
            tape.watch(tf.nest.flatten(watched))
            prediction = self.combine(watched, inputs)
        grads = tape.gradient(tf.nest.flatten(prediction),
                              [tf.nest.flatten(watched[r]) for r in self.reads])
        unused = [r for r, g in zip(self.reads, grads) if all(x is None for x in g)]
        if unused:
            raise ValueError(
                f"objective {self.name!r}: its combine does not depend on {unused[0]!r}, which "
                f"it reads; drop {unused[0]!r} from reads or use it in combine")


def prediction_fn(model: HeadsModel, name: str, objective: Objective) -> Prediction:
    """The `Prediction` of objective `name`."""
    return Prediction(name, reads_of(model, name, objective), _combiner(objective.combine))


def declares_trunk(objective: Objective) -> bool:
    """Whether the objective trains trunk variables, by its declaration alone."""
    if objective.trains is not None:
        return any(a == TRUNK or a.startswith(TRUNK + "/") for a in objective.trains)
    return objective.trains_trunk and not _zero(objective.trunk_scale)


def _resolve(model: HeadsModel, name: str, objective: Objective,
             parts: Mapping[str, list[keras.Variable]], aggregated: bool) -> ObjectiveParts:
    where = f"objective {name!r}"
    reads = reads_of(model, name, objective)
    trains = tuple(objective.trains) if objective.trains is not None else (
        ((TRUNK,) if declares_trunk(objective) else ())
        + tuple(f"heads/{r}" for r in reads if not _reads_trunk(r)))
    if not trains:
        raise ValueError(f"{where}: trains nothing: give trains=[...] (e.g. 'trunk', "
                         "'heads/<name>')")
    chosen: dict[int, keras.Variable] = {}
    for address in trains:
        if address == TRUNK:  # the trunk variables its reads depend on (below a tap)
            chosen.update((id(v), v) for v in _trunk_read(model, reads, parts[TRUNK]))
            continue
        if address not in parts:
            known = [p for p in parts if p.count("/") <= 1 and not p[len(TRUNK) + 1:].isdigit()]
            raise ValueError(f"{where}: trains unknown part {address!r}; the parts are {known} "
                             "and the trunk's sublayers by index (e.g. 'trunk/0')")
        if not parts[address]:
            raise ValueError(f"{where}: trains part {address!r}, which holds no trainable variable")
        chosen.update((id(v), v) for v in parts[address])
    trunk_ids = {id(v) for v in parts[TRUNK]}
    ordered = ([v for v in parts[TRUNK] if id(v) in chosen]
               + [v for h in model.head_names for v in model.head_variables(h) if id(v) in chosen])
    trains_trunk = any(id(v) in trunk_ids for v in ordered)
    var_list = [v for v in ordered if not (aggregated and id(v) in trunk_ids)]
    if not var_list:
        raise ValueError(f"{where}: under trunk aggregation the trunk optimizer updates the "
                         "trunk, so it has no variable of its own to train: add a head to trains")
    trained_heads = tuple(h for h in model.head_names
                          if any(id(v) in chosen for v in model.head_variables(h)))
    return ObjectiveParts(name, Prediction(name, reads, _combiner(objective.combine)), trains,
                          trained_heads, tuple(var_list), trains_trunk)


def _trunk_read(model: HeadsModel, reads: tuple[str, ...],
                trunk: list[keras.Variable]) -> list[keras.Variable]:
    """The trunk variables the outputs `reads` depend on: all of `trunk`, unless every read
    is a trunk tap (`trunk/<block>`) or a head on one (`MultiHeadModel(taps=...)`): then
    those of the blocks up to the deepest tap, by identity (see `multihead.model.taps`)."""
    taps = {r: f"{TRUNK}/{i}" for r, i in getattr(model, "tap_indices", {}).items()}
    taps.update((r, r) for r in reads if r.startswith(TRUNK + "/"))  # a tap read directly
    if not reads or any(r not in taps for r in reads):
        return trunk
    below = {id(v) for r in reads for v in model.tap_variables(taps[r])}
    return [v for v in trunk if id(v) in below]


def _reads_trunk(read: str) -> bool:
    """Whether `read` is the trunk's output or a trunk tap (`trunk/<block>`)."""
    return read == TRUNK or read.startswith(TRUNK + "/")


def _zero(scale: Any) -> bool:
    return not callable(scale) and float(scale) == 0.0


def _combiner(combine: Any) -> Callable[[Mapping[str, Any], Any], Any] | None:
    """`combine` as a function of `(outputs, inputs)`."""
    if combine is None:
        return None
    if isinstance(combine, str):
        fold = COMBINERS[combine]
        return lambda outputs, inputs: fold(list(outputs.values()))
    try:
        takes_inputs = len([p for p in inspect.signature(combine).parameters.values()
                            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 2
    except (TypeError, ValueError):
        takes_inputs = False
    user = converted(combine)  # may branch on tensors
    if takes_inputs:
        return user
    return lambda outputs, inputs: user(outputs)
