"""Single-task baselines from a multi-task config: one head alone, same trunk, same data.

`multihead train CONFIG --only-head y1` trains the config with every other head dropped.
The baseline a multi-task run is compared with (Δm%, `multihead compare --baseline`) must
differ from it only in the heads it trains, so:

- the trunk, the kept head (layers, loss, optimizer, metrics, weight, cadence), the schedule,
  the steps, the batch size and the seed are the config's own;
- the data is the same: the synthetic kinds (`mmoe`, `mixed`) still generate every task of
  the config (`data.tasks` is set to them) and drop the others, `data.targets` keeps the
  head's target;
- an aggregated trunk (`train.trunk: {aggregator: ...}`) becomes `per_head`: with one head
  there is nothing to aggregate, and the head's own optimizer trains the trunk, as in
  single-task training;
- callbacks and trunk taps (`model.taps`) of other heads are dropped; a callback that
  monitors another head is an error.
"""

from __future__ import annotations

from typing import Any, Sequence

from multihead._checks import suggest
from multihead.experiments.config.schema import ConfigError, ExperimentConfig, from_dict, to_dict
from multihead.monitoring.metric_key import MetricKey


def only_head(config: ExperimentConfig, head: str, source: str = "--only-head",
              allow_import: Sequence[str] = ()) -> ExperimentConfig:
    """The single-task baseline of `config`: `head` alone (see the module docstring).

    Args:
        config: a validated multi-task config.
        head: the head to keep.
        source: what errors are prefixed with.
        allow_import: the modules `config` was allowed to import (it is validated again).

    Returns:
        A new validated config; `config` is not changed.

    Raises:
        ConfigError: `config` has no head `head`, or a callback monitors another head.

    Example:
        >>> baseline = only_head(load_config("experiments/quickstart.yaml"), "y1")  # doctest: +SKIP
        >>> list(baseline.model.heads)                                               # doctest: +SKIP
        ['y1']
    """
    heads = list(config.model.heads)
    if head not in heads:
        raise ConfigError(f"{source} {head!r}: the model has no head {head!r}{suggest(head, heads)}; "
                          f"its heads are {heads}")
    raw: dict[str, Any] = to_dict(config)
    raw["model"]["heads"] = {head: raw["model"]["heads"][head]}
    if raw["model"].get("taps"):  # a dropped head's tap names a head the baseline has not
        raw["model"]["taps"] = {h: tap for h, tap in raw["model"]["taps"].items() if h == head}
    data = raw["data"]
    if data.get("per_head"):  # one dataset per head: keep this head's, drawn every step
        data["per_head"] = {head: data["per_head"][head]}
        data["sampling_weights"] = {}
        data["sampling"] = "all"
    elif data["kind"] in ("mmoe", "mixed") and data.get("tasks") is None:
        data["tasks"] = heads  # the task list decides the generated data: keep it
    for key in ("missing_label", "sample_weights"):  # the kept head's own
        if data.get(key):
            data[key] = {k: v for k, v in data[key].items() if k == head}
    if data.get("allow_empty_heads"):
        data["allow_empty_heads"] = [h for h in data["allow_empty_heads"] if h == head]
    if isinstance(data.get("targets"), dict):
        data["targets"] = {head: data["targets"][head]} if head in data["targets"] else None
    if isinstance(raw["train"]["trunk"], dict):
        raw["train"]["trunk"] = "per_head"
    callbacks = raw["callbacks"]
    callbacks["reduce_lr_on_plateau"] = [entry for entry in callbacks["reduce_lr_on_plateau"]
                                         if entry["head"] == head]
    for name in ("early_stopping", "best_checkpoint"):
        section = callbacks.get(name)
        monitor = section.get("monitor") if section else None
        if monitor and MetricKey.parse(monitor).head not in (None, head):
            raise ConfigError(f"{source} {head!r}: callbacks.{name}.monitor is {monitor!r}, a head "
                              f"the baseline drops; add --set callbacks.{name}.monitor={MetricKey(head, 'loss')}")
    return from_dict(raw, f"{source} {head}", allow_import)
