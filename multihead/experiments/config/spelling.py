"""How a config spells the core's setting fields (`multihead.settings`): key paths and YAML
values, so a rule written once in the core words its error for a config."""

from __future__ import annotations

from typing import Any, Sequence

from multihead.step.options import config_options


class ConfigSpelling:
    """The key paths and YAML values of the core's setting fields (`multihead.settings`),
    so a rule written once in the core words its error for a config."""

    _KEYS = {**{name: f"train.{name}" for name in config_options()},
             "log_dir": "log.tensorboard", "trunk": "train.trunk",
             "affinity_every": "log.affinity_every",
             "trunk.rep_grad": "train.trunk.rep_grad", "trunk.aggregator": "train.trunk.aggregator",
             "trunk.dtype": "train.trunk.dtype", "trunk.options": "train.trunk.options",
             "trunk.loss_weighting": "train.trunk.loss_weighting",
             "trunk.loss_weighting_options": "train.trunk.loss_weighting_options"}

    def __init__(self, standalone: Sequence[str] = ()) -> None:
        self._standalone = frozenset(standalone)

    def key(self, field: str, head: str | None = None) -> str:
        if field.startswith("objectives."):  # an objective's setting
            name = field.partition(".")[2]
            if head is None:
                return name
            section = "objectives" if head in self._standalone else "model.heads"
            return f"{section}.{head}.{name}"
        return self._KEYS[field]

    def value(self, value: Any) -> str:
        if isinstance(value, bool) or value is None:
            return {True: "true", False: "false", None: "null"}[value]
        return str(value)

    def setting(self, field: str, value: Any, head: str | None = None) -> str:
        if field == "log_dir":  # the API's log directory is the config's switch
            return f"log.tensorboard: {self.value(value is not None)}"
        return f"{self.key(field, head)}: {self.value(value)}"


#: The spelling of a config with no standalone objectives.
CONFIG = ConfigSpelling()
