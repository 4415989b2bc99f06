"""The `train:` keys that are the step's options: `StepOptions`' fields, by name.

`StepSection` declares one config key per field of `multihead.step.options.StepOptions`
that a config sets (with the field's default, choices and documentation), so adding an
option to the step adds its key here without an edit; `TrainConfig` extends it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from multihead.experiments.config.fields import field as _field
from multihead.step.options import StepOptions, config_fields, options_of

__all__ = ["StepSection", "step_options"]

#: `train:`'s keys of the step's options.
StepSection = dataclasses.make_dataclass(
    "StepSection",
    [(f.name, f.type, _field(f.default, choices=f.metadata["choices"], doc=f.metadata["doc"]))
     for f in config_fields()],
    namespace={"__module__": __name__, "__doc__": "`train:` the step's options."})


def step_options(train: Any) -> StepOptions:
    """The step's options a `train:` section sets."""
    return StepOptions(**options_of(train))
