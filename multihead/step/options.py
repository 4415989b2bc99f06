"""`StepOptions`: how the step runs, one frozen object passed whole.

The Trainer builds it once from its keywords (`Trainer(jit_compile=True)` is
`StepOptions(jit_compile=True)`), a config's `train:` keys map onto its fields by
name, and the step hands it on whole to what reads it: the compiled loops
(`multihead.step.compiled`), the applier (`multihead.step.applier`), the
per-head trunk rule (`multihead.step.trunk_rule`) and the aggregated one
(`multihead.step.trunk_update`). An option is documented and
checked here, on its field, and read by its consumer; no layer in between
lists it.

This module imports neither TensorFlow nor Keras: the config layer reads its
fields while validating a file.

Example:
    >>> options = StepOptions.from_keywords(schedule="sequential", fused_updates=True)
    >>> options.schedule, options.fused_updates, options.batched
    ('sequential', True, False)
    >>> StepOptions(fused_updates="yes")
    Traceback (most recent call last):
    ValueError: fused_updates: must be one of [False, True], got 'yes'
"""

import dataclasses
from typing import Any, Mapping, Union

from multihead._checks import check_choice, suggest
from multihead.settings import SettingError, Spelling

__all__ = ["SCHEDULES", "StepOptions", "check_jit_logging", "check_jit_strategy",
           "config_options"]

#: The schedules of the heads' updates within a step (see `multihead.step.train_step`).
SCHEDULES = ("simultaneous", "sequential")

#: The values of the batched backward pass option.
BATCHED_CHOICES = ("auto", True, False)


def _option(default: Any, doc: str, *, choices: tuple[Any, ...] | None = None,
            config: bool = True) -> Any:
    """A field of `StepOptions`: its default, the values it allows, its one-line
    documentation (the config key reference shows it) and whether a config's `train:`
    section sets it by name."""
    return dataclasses.field(default=default,
                             metadata={"doc": doc, "choices": choices, "config": config})


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """How the step runs: the Trainer's step keywords, and a config's `train:` keys of
    the same names.

    Attributes:
        schedule: `"simultaneous"` (every due head's gradient at the same parameters,
            then each optimizer applies its own) or `"sequential"` (heads update one
            after another, each seeing the parameters the previous one left; see
            `multihead.step.train_step`).
        jit_compile: XLA-compile the step (off by default: slower on CPU). Needs
            TensorBoard logging off (`log_dir=None`) and no `tf.distribute` strategy.
        batched_backward: with the per-head trunk, take the heads' trunk gradients
            in one vectorised backward pass (`True`), equal to one pass per head to
            float32 rounding, or one pass per head (`False`); `"auto"`: off, as the
            batched pass was measured slower on CPU (see
            `multihead.step.batched_backward`).
        fused_updates: plain Adam and SGD optimizers (the heads' and the trunk
            optimizer's) update each variable with one fused TF1 kernel
            (`ResourceApplyAdam`, `ResourceApplyKerasMomentum`) on their own slots:
            faster, TF1's numerics rather than bitwise Keras' (see
            docs/training.md and `multihead.step.adam_sgd_ops`); other optimizers,
            and steps under a strategy, keep Keras' update.
        loss_scale: each head's dynamic loss scale, for a model that computes in
            float16 (`dtype=keras.DTypePolicy("mixed_float16")` on its layers):
            `"auto"` gives every head a `DynamicLossScale()` when some layer computes
            in float16, none otherwise; a `DynamicLossScale` gives every head one with
            these options; None: no loss scaling. A head whose scaled gradient
            overflows skips the step (whatever its `on_nonfinite`) and halves its
            scale, the other heads and the trunk proceed (see
            `multihead.step.loss_scales`). Not with trunk aggregation. A config sets
            it through `train.mixed_precision: float16`.
        one_pass_backward: with an aggregated trunk whose combination is linear in the
            heads' gradients (constant weights: `sum`, `mean`, fixed `weights`, with or
            without a loss weighting that reads no gradient), take the trunk gradient
            as one backward pass of the weighted loss on steps that do not log, equal
            to the per-head passes to float32 rounding; a step whose one-pass result
            is not finite, or with a head that is not due, redoes it per head within
            the step (see `multihead.step.one_pass`). `False`: one pass per head on
            every step (bitwise the per-head path).
    """

    schedule: str = _option("simultaneous", "how the heads' updates follow each other in a step",
                            choices=SCHEDULES)
    jit_compile: bool = _option(False, "XLA; measured slower on CPU")
    batched_backward: Union[bool, str] = _option(
        "auto", "per_head trunk: the heads' trunk gradients in one vectorised backward pass "
                "(equal to float32 rounding); auto: off, measured slower on CPU",
        choices=BATCHED_CHOICES)
    fused_updates: bool = _option(False, "plain Adam/SGD through TF1's fused kernels: faster, "
                                         "TF1's numerics (not bitwise Keras')")
    loss_scale: Any = _option("auto", "each head's dynamic loss scale (float16)", config=False)
    one_pass_backward: bool = _option(
        True, "aggregated trunk with constant weights: one backward pass of the weighted loss "
              "on steps that do not log (equal to the per-head passes to float32 rounding); "
              "false: one pass per head")

    def __post_init__(self) -> None:
        check_choice(self.schedule, "schedule", SCHEDULES)
        if not any(self.batched_backward is c if isinstance(c, bool) else self.batched_backward == c
                   for c in BATCHED_CHOICES):
            raise ValueError(f"batched_backward: expected 'auto', True or False, got "
                             f"{self.batched_backward!r}")
        check_choice(self.fused_updates, "fused_updates", (False, True))
        check_choice(self.one_pass_backward, "one_pass_backward", (False, True))
        if not (self.loss_scale is None or _is_auto(self.loss_scale)
                or _is_loss_scale(self.loss_scale)):
            raise TypeError(f"loss_scale must be 'auto', a DynamicLossScale or None, got "
                            f"{self.loss_scale!r}")

    @classmethod
    def from_keywords(cls, **keywords: Any) -> "StepOptions":
        """The options of `Trainer(**keywords)`: each keyword sets the field of its name.

        Raises:
            TypeError: a keyword that is no field (as Python does for an unknown keyword
                argument), with the closest field.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        for key in keywords:
            if key not in names:
                raise TypeError(f"Trainer() got an unexpected keyword argument {key!r}"
                                f"{suggest(key, names)}; the step's options are {names}")
        return cls(**keywords)

    @property
    def batched(self) -> bool:
        """Whether the per-head trunk takes the heads' trunk gradients in one batched pass.

        `"auto"` is on only where the batched pass was measured faster than one pass per
        head: no device so far (docs/performance.md), so it is off.
        """
        return self.batched_backward is True

    def check(self, *, logging: bool, strategy: str | None, spell: Spelling) -> None:
        """The rules between these options and the other settings (see `multihead.settings`).

        Args:
            logging: whether TensorBoard logging is on.
            strategy: how a message names the `tf.distribute` strategy, or None for one
                device.
            spell: the spelling of the calling layer.
        """
        check_jit_strategy(self.jit_compile, strategy, spell)
        check_jit_logging(self.jit_compile, logging, spell)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def _is_loss_scale(value: Any) -> bool:
    """Whether `value` is a `DynamicLossScale` (imported only then: it imports TensorFlow)."""
    from multihead.step.loss_scales import DynamicLossScale

    return isinstance(value, DynamicLossScale)


def config_options() -> tuple[str, ...]:
    """The fields a config's `train:` section sets by name (its keys of the same names)."""
    return tuple(f.name for f in dataclasses.fields(StepOptions) if f.metadata["config"])


def config_fields() -> list[dataclasses.Field]:
    """The fields of `config_options`, for the config schema to declare as `train:` keys."""
    return [f for f in dataclasses.fields(StepOptions) if f.metadata["config"]]


def options_of(section: Any) -> Mapping[str, Any]:
    """The step's options a config section holds (its attributes of `config_options`)."""
    return {name: getattr(section, name) for name in config_options()}


def check_jit_logging(jit: bool, logging: bool, spell: Spelling) -> None:
    """XLA cannot compile summary ops: XLA needs TensorBoard logging off."""
    field = "jit_compile"
    if jit and logging:
        raise SettingError(field, (
            f"{spell.key(field)}: XLA cannot compile the summary ops that TensorBoard "
            f"logging adds to the step; set {spell.setting('log_dir', None)} to train with XLA"))


def check_jit_strategy(jit: bool, strategy: str | None, spell: Spelling) -> None:
    """A `tf.distribute` strategy (named `strategy`; None: one device) does not support XLA."""
    field = "jit_compile"
    if strategy is not None and jit:
        raise SettingError(field, (
            f"{spell.key(field)}: {spell.value(True)} is not supported with {strategy}; "
            f"set {spell.setting(field, False)}"))
