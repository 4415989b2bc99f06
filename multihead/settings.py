"""Rules between settings, written once for the Python API and the configs.

A rule names the setting that breaks it by a *field* (`"trunk"`,
`"trunk.rep_grad"`, `"objectives.every"` with a head) and raises `SettingError`,
whose `.field` (and `.head`) say which one. The text is spelled by a `Spelling`:
`PYTHON` writes the Trainer's argument names (`trunk='per_head'`); the config layer
passes its own spelling, which maps each field to its key path
(`train.trunk: per_head`), so one rule gives both wordings and no layer has to
recognise another's message. The rules of the step's own options sit with their
fields (`multihead.step.options`) and use the same spellings.

This module imports neither TensorFlow nor Keras: the config layer calls it while
validating a file.

Example:
    >>> check_loss_scaling(loss_scaling=True, aggregated=True, spell=PYTHON)
    Traceback (most recent call last):
    multihead.settings.SettingError: trunk: trunk aggregation does not support float16 loss scaling (a scale per head) yet; set trunk='per_head', or compute in bfloat16, which needs no loss scale
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Protocol, Sequence


class SettingError(ValueError):
    """A setting that breaks a rule, or a rule between settings.

    Attributes:
        field: the setting at fault, e.g. `"trunk.rep_grad"` or `"objectives.every"`.
        head: the head whose setting it is, for the `objectives.*` fields; else None.
    """

    def __init__(self, field: str, message: str, head: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.head = head


class SettingTypeError(SettingError, TypeError):
    """A setting of the wrong type (a `TypeError` too, as before it named its field)."""


@contextlib.contextmanager
def setting(field: str) -> Iterator[None]:
    """Within: a `ValueError` or `TypeError` becomes a `SettingError` of `field` (one that
    names its field already passes unchanged), e.g. a method constructor's own check."""
    try:
        yield
    except SettingError:
        raise
    except TypeError as err:
        raise SettingTypeError(field, str(err)) from err
    except ValueError as err:
        raise SettingError(field, str(err)) from err


class Spelling(Protocol):
    """How a layer writes fields and values in messages."""

    def key(self, field: str, head: str | None = None) -> str:
        """The name of `field` (of `head`) as the user wrote it."""

    def value(self, value: Any) -> str:
        """A value as the user would write it."""

    def setting(self, field: str, value: Any, head: str | None = None) -> str:
        """`field` set to `value`, as the user would write it."""


class PythonSpelling:
    """The Trainer's argument names: `trunk='per_head'`, `objectives['b'].every`."""

    def key(self, field: str, head: str | None = None) -> str:
        if head is not None and field.startswith("objectives."):
            return f"objectives[{head!r}].{field.partition('.')[2]}"
        return field

    def value(self, value: Any) -> str:
        return repr(value)

    def setting(self, field: str, value: Any, head: str | None = None) -> str:
        return f"{self.key(field, head)}={value!r}"


#: The spelling of the Python API.
PYTHON = PythonSpelling()

#: Keras optimizer classes refused as a head's or the trunk's optimizer -> why, and what to
#: give instead (the Python API checks the object, a config its `class_name`).
REFUSED_OPTIMIZERS = {
    "LossScaleOptimizer": (
        "multihead does loss scaling per head, not with one scale for all heads: give the inner "
        "optimizer; a model that computes in float16 (mixed_float16) gets a dynamic loss scale "
        "per head (Trainer(loss_scale=...), train.mixed_precision: float16)"),
}


def check_loss_scaling(loss_scaling: bool, aggregated: bool, spell: Spelling) -> None:
    """Per-head loss scales (float16) need each head's optimizer to apply its own gradient:
    trunk aggregation is refused with them.

    Args:
        loss_scaling: whether each head has a dynamic loss scale (float16).
        aggregated: whether the trunk aggregates the heads' gradients.
        spell: the spelling of the calling layer.
    """
    if loss_scaling and aggregated:
        raise SettingError("trunk", (
            f"{spell.key('trunk')}: trunk aggregation does not support float16 loss scaling (a "
            f"scale per head) yet; set {spell.setting('trunk', 'per_head')}, or compute in "
            "bfloat16, which needs no loss scale"))


def check_strategy_limits(strategy: str | None, *, rep_grad: bool,
                          loss_weighting: str | None, spell: Spelling) -> None:
    """What a `tf.distribute` strategy does not support: trunk aggregation at the trunk
    output (`rep_grad`) or by a loss weighting (XLA: `multihead.step.options`).

    Args:
        strategy: how the message names the strategy, or None for one device.
        rep_grad: whether the trunk aggregates at its output.
        loss_weighting: the trunk's loss weighting, or None for a gradient aggregator
            (or no trunk aggregation).
        spell: the spelling of the calling layer.
    """
    if strategy is None:
        return
    if rep_grad:
        raise SettingError("trunk.rep_grad", (
            f"{spell.key('trunk.rep_grad')}: {spell.value(True)} is not supported with "
            f"{strategy} yet; set {spell.setting('trunk.rep_grad', False)} (parameter space), "
            "or train on one device"))
    if loss_weighting is not None:
        raise SettingError("trunk.aggregator", (
            f"{spell.key('trunk.aggregator')}: {loss_weighting} (a loss weighting) is not "
            f"supported with {strategy} yet; use a gradient aggregator such as sum, mean, "
            "pcgrad or mgda, or train on one device"))


def check_affinity(affinity_every: int, logging: bool, strategy: str | None,
                   spell: Spelling) -> None:
    """Inter-task affinities are written to TensorBoard by the step on one device.

    Args:
        affinity_every: the affinity cadence (0: off).
        logging: whether TensorBoard logging is on.
        strategy: how the message names the `tf.distribute` strategy, or None for one device.
        spell: the spelling of the calling layer.
    """
    if not affinity_every:
        return
    if not logging:
        raise SettingError("affinity_every", (
            f"{spell.key('affinity_every')}: the affinities are written to TensorBoard, which "
            f"is off ({spell.setting('log_dir', None)}); turn it on, or set "
            f"{spell.setting('affinity_every', 0)}"))
    if strategy is not None:
        raise SettingError("affinity_every", (
            f"{spell.key('affinity_every')}: inter-task affinity is not supported with "
            f"{strategy} yet; set {spell.setting('affinity_every', 0)}, or train on one device"))


def check_trunk_aggregation(schedule: str, heads: Mapping[str, tuple[bool, int]],
                            spell: Spelling) -> None:
    """What trunk aggregation needs of the schedule and the heads.

    Args:
        schedule: `"simultaneous"` or `"sequential"`.
        heads: head -> `(trains_trunk, every)`.
        spell: the spelling of the calling layer.
    """
    if schedule != "simultaneous":
        raise SettingError("schedule", (
            f"{spell.key('schedule')}: trunk aggregation needs "
            f"{spell.setting('schedule', 'simultaneous')} (all heads' gradients at the same "
            f"parameters), got {spell.value(schedule)}; or set {spell.setting('trunk', 'per_head')}"))
    trunk_heads = [h for h, (trains_trunk, _) in heads.items() if trains_trunk]
    if not trunk_heads:
        raise SettingError("trunk", (
            f"{spell.key('trunk')}: trunk aggregation needs a head that trains the trunk, but "
            f"every head has {spell.setting('objectives.trains_trunk', False)}"))
    for head in trunk_heads:
        every = heads[head][1]
        if every != 1:
            raise SettingError("objectives.every", (
                f"{spell.key('objectives.every', head)}: must be 1 with trunk aggregation, but "
                f"head {head!r} has every={every}: every head that trains the trunk is aggregated "
                f"on every step; or set {spell.setting('objectives.trains_trunk', False, head)} "
                "for a head updated less often"), head=head)


def check_rep_grad_data(rep_grad: bool, per_head_data: bool, spell: Spelling) -> None:
    """Aggregating at the trunk output needs one batch for all heads."""
    if rep_grad and per_head_data:
        raise SettingError("trunk.rep_grad", (
            f"{spell.key('trunk.rep_grad')}: {spell.setting('trunk.rep_grad', True)} combines "
            "the heads' gradients at the trunk output, so it needs one batch for all heads; "
            "give one dataset, or set " + spell.setting("trunk.rep_grad", False)))


def check_rep_grad_trunk(rep_grad: bool, trunk: str, routes_heads: bool,
                         spell: Spelling, tapped: Sequence[str] = ()) -> None:
    """Aggregating at the trunk output needs one output shared by every head.

    Args:
        rep_grad: whether the trunk aggregates at its output.
        trunk: the trunk's class name.
        routes_heads: whether the trunk gives each head features of its own (MMoE, ...).
        spell: the spelling of the calling layer.
        tapped: the heads that read a trunk tap (an intermediate block's output).
    """
    if rep_grad and tapped:
        raise SettingError("trunk.rep_grad", (
            f"{spell.key('trunk.rep_grad')}: {spell.setting('trunk.rep_grad', True)} combines "
            f"the heads' gradients at one shared trunk output, but heads {list(tapped)} read "
            f"trunk taps; set {spell.setting('trunk.rep_grad', False)} (parameter space)"))
    if rep_grad and routes_heads:
        raise SettingError("trunk.rep_grad", (
            f"{spell.key('trunk.rep_grad')}: {spell.setting('trunk.rep_grad', True)} combines "
            f"the heads' gradients at one shared trunk output, but the trunk {trunk} gives each "
            f"head its own features; set {spell.setting('trunk.rep_grad', False)} "
            "(parameter space)"))
