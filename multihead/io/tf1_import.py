"""Import of name-based TF1 checkpoints (`tf.compat.v1.train.Saver`) into a `MultiHeadModel`.

TF1 code named variables by `variable_scope` (`Agent/layer1/w1`); a
`MultiHeadModel` has no such names, so the import goes through an explicit
mapping from TF1 name patterns to **addresses** of the model's variables.

An address is `<part>/<sublayer index>/.../<variable name>`, where the part is
`trunk` or `heads/<name>`, sublayer indices count the layers of a `Sequential`
(or any layer's sublayers) from 0, and the variable name is Keras' short name:

    trunk/0/kernel        first layer of a Sequential trunk
    trunk/kernel          a trunk that is a single Dense layer
    heads/value/1/bias    second layer of head `value`

`variable_addresses(model)` lists them. A mapping value may also be a bare part
(`"trunk"`, `"heads/value"`): the TF1 variable then goes to the one variable of
that part with its shape (an error if none or several have it).

    report = import_tf1_checkpoint(path, model, {
        r"Agent/layer1/w1": "trunk/kernel",
        r"Agent/layer1/b1": "trunk/bias",
        r"Agent/layer2_(\\d)/(w|b)": r"heads/out\\1",      # by shape within the head
    }, dry_run=True)
    print(report)            # what would be assigned, unmatched names, shape mismatches
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from multihead.model.addresses import variable_addresses
from multihead.training.keras_model import MultiHeadModel


@dataclasses.dataclass
class ImportReport:
    """The outcome (or plan, for a dry run) of `import_tf1_checkpoint`.

    Attributes:
        assigned: TF1 name -> model address it is (or would be) assigned to.
        unmatched: TF1 names no pattern matched (optimizer slots, global step, ...).
        mismatches: `(tf1 name, address, checkpoint shape/dtype, model shape/dtype)`
            for pairs whose shape or dtype differ.
        unknown: `(tf1 name, address, reason)` for mapped names whose address is
            not a variable of the model, or a part where no single variable has
            the name's shape.
        conflicts: address -> the TF1 names mapped to it (more than one).
        not_loaded: model addresses no TF1 name is assigned to.
        applied: whether the values were assigned (False for a dry run or on error).
    """

    assigned: dict[str, str] = dataclasses.field(default_factory=dict)
    unmatched: list[str] = dataclasses.field(default_factory=list)
    mismatches: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    unknown: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    conflicts: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    not_loaded: list[str] = dataclasses.field(default_factory=list)
    applied: bool = False

    @property
    def ok(self) -> bool:
        """True if every mapped name has exactly one compatible target."""
        return not (self.mismatches or self.unknown or self.conflicts)

    def problems(self) -> list[str]:
        """One line per problem that blocks the import."""
        lines = [f"{n} -> {a}: checkpoint {c} vs model {m}" for n, a, c, m in self.mismatches]
        lines += [f"{n} -> {a}: {why}" for n, a, why in self.unknown]
        lines += [f"{a} <- {', '.join(names)}: several TF1 names map to one variable"
                  for a, names in self.conflicts.items()]
        return lines

    def __str__(self) -> str:
        lines = [f"assigned ({len(self.assigned)}):"]
        lines += [f"  {n} -> {a}" for n, a in self.assigned.items()]
        for title, items in (("problems", self.problems()), ("unmatched TF1 names", self.unmatched),
                             ("model variables not loaded", self.not_loaded)):
            lines.append(f"{title} ({len(items)}):")
            lines += [f"  {item}" for item in items]
        return "\n".join(lines)


def _describe(shape: Any, dtype: Any) -> str:
    return f"{tuple(shape)} {tf.as_dtype(dtype).name}"


def import_tf1_checkpoint(path: str | os.PathLike[str], model: MultiHeadModel,
                          mapping: Mapping[str, str], *, dry_run: bool = False,
                          strict: bool = False) -> ImportReport:
    """Assigns variables of a TF1 name-based checkpoint to the model's variables.

    Each TF1 variable name is matched against the patterns of `mapping` in
    order (regular expressions, whole-name match); the first that matches gives
    its target, expanded with the match's groups (`\\1`). Nothing is assigned
    unless every mapped name has exactly one target of the same shape and dtype.

    Args:
        path: the checkpoint prefix written by `tf.compat.v1.train.Saver.save`
            (or its directory, for the latest checkpoint in it).
        model: a built model.
        mapping: TF1 name pattern -> model address or part (see the module doc).
        dry_run: only report what would happen; assign nothing.
        strict: also treat TF1 names that match no pattern as an error.

    Returns:
        The report: assigned pairs, unmatched names, model variables not loaded.

    Raises:
        ValueError: the checkpoint cannot be read, a pattern is not a valid
            regular expression, or (unless `dry_run`) a mapped name has no
            compatible target; the message lists every problem.
    """
    if not isinstance(model, MultiHeadModel):
        raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
    patterns = _patterns(mapping)
    try:
        reader = tf.train.load_checkpoint(os.fspath(path))
    except (ValueError, tf.errors.OpError) as err:
        raise ValueError(f"cannot read TF1 checkpoint {os.fspath(path)!r}: "
                         f"{str(err).strip().splitlines()[0]}") from None
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    addresses = variable_addresses(model)
    parts = set(model.part_layers())
    report = ImportReport()
    targets: dict[str, list[str]] = {}
    for name in sorted(shapes):
        if name == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue
        match = next(((m, t) for p, t in patterns if (m := p.fullmatch(name))), None)
        if match is None:
            report.unmatched.append(name)
            continue
        address = _target(name, match, tuple(shapes[name]), dtypes[name], addresses, parts, report)
        if address is not None:
            targets.setdefault(address, []).append(name)
            report.assigned[name] = address
    report.conflicts = {a: names for a, names in targets.items() if len(names) > 1}
    loaded = set(report.assigned.values())
    report.not_loaded = [a for a in addresses if a not in loaded]
    if dry_run:
        return report
    problems = report.problems()
    if strict and report.unmatched:
        problems.append(f"{len(report.unmatched)} TF1 name(s) match no pattern "
                        f"({', '.join(report.unmatched[:3])}, ...) and strict=True")
    if problems:
        raise ValueError(
            f"cannot import {os.fspath(path)!r}: {'; '.join(problems)}. Fix the mapping "
            "(a dry run, dry_run=True, shows the plan); nothing was assigned"
        )
    for name, address in report.assigned.items():
        addresses[address].assign(np.asarray(reader.get_tensor(name)))
    report.applied = True
    return report


def _patterns(mapping: Mapping[str, str]) -> list[tuple[re.Pattern, str]]:
    """The mapping's patterns, compiled, with their targets."""
    if not isinstance(mapping, Mapping) or not mapping:
        raise ValueError("mapping must be a non-empty dict of TF1 name pattern -> model address or part")
    patterns = []
    for pattern, target in mapping.items():
        try:
            patterns.append((re.compile(pattern), target))
        except re.error as err:
            raise ValueError(f"mapping: pattern {pattern!r} is not a regular expression ({err})") from None
    return patterns


def _target(name: str, match: tuple[re.Match, str], shape: tuple[int, ...], dtype: Any,
            addresses: Mapping[str, Any], parts: set[str], report: ImportReport) -> str | None:
    """The model address TF1 variable `name` goes to, or None after recording in `report` why
    it has none (an unknown address, a part without exactly one variable of its shape, a
    shape or dtype mismatch)."""
    m, template = match
    try:
        address = m.expand(template)
    except (re.error, IndexError) as err:
        raise ValueError(f"mapping: target {template!r} for {name!r}: {err}") from None
    if address in parts:
        prefix = address + "/"
        same = [a for a, v in addresses.items() if a.startswith(prefix) and tuple(v.shape) == shape]
        if len(same) != 1:
            why = (f"no variable of {address} has shape {shape}" if not same else
                   f"{len(same)} variables of {address} have shape {shape} ({', '.join(same)}); "
                   "map this name to one of them")
            report.unknown.append((name, address, why))
            return None
        address = same[0]
    if address not in addresses:
        report.unknown.append((name, address, "the model has no variable at this address "
                               "(see multihead.variable_addresses(model))"))
        return None
    var = addresses[address]
    if tuple(var.shape) != shape or tf.as_dtype(var.dtype) != dtype:
        report.mismatches.append((name, address, _describe(shape, dtype), _describe(var.shape, var.dtype)))
        return None
    return address
