"""Single-task baselines and task groupings from a multi-task config: some heads alone, same
trunk, same data.

`multihead train CONFIG --only-head y1` trains the config with every other head dropped;
`--only-head y1,y3` (or `train.only_heads: [y1, y3]`, a sweep axis: one run per group of a
task grouping, docs/affinity.md) keeps those heads.
The baseline a multi-task run is compared with (Δm%, `multihead compare --baseline`) must
differ from it only in the heads it trains, so:

- the trunk, the kept head (layers, loss, optimizer, metrics, weight, cadence), the schedule,
  the steps, the batch size and the seed are the config's own;
- the data is the same: the synthetic kinds (`mmoe`, `mixed`) still generate every task of
  the config (`data.tasks` is set to them) and drop the others, `data.targets` keeps the
  head's target;
- an aggregated trunk (`train.trunk: {aggregator: ...}`) becomes `per_head` for one head:
  there is nothing to aggregate, and the head's own optimizer trains the trunk, as in
  single-task training; several heads keep it;
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
    return only_heads(config, [head], source, allow_import)


def only_heads(config: ExperimentConfig, keep: Sequence[str], source: str = "--only-head",
               allow_import: Sequence[str] = ()) -> ExperimentConfig:
    """`config` with the heads `keep` alone, in the model's order (see the module docstring);
    `train.only_heads` records them.

    Raises:
        ConfigError: `config` has no head of `keep`, or a callback monitors another head.
    """
    heads = list(config.model.heads)
    for head in keep:
        if head not in heads:
            raise ConfigError(f"{source} {head!r}: the model has no head {head!r}"
                              f"{suggest(head, heads)}; its heads are {heads}")
    kept = [h for h in heads if h in keep]
    label = ",".join(keep)
    raw: dict[str, Any] = to_dict(config)
    raw["model"]["heads"] = {h: raw["model"]["heads"][h] for h in kept}
    raw["train"]["only_heads"] = kept
    if raw["model"].get("taps"):  # a dropped head's tap names a head the run has not
        raw["model"]["taps"] = {h: tap for h, tap in raw["model"]["taps"].items() if h in kept}
    data = raw["data"]
    if data.get("per_head"):  # one dataset per head: keep these heads', drawn every step
        data["per_head"] = {h: data["per_head"][h] for h in kept}
        data["sampling_weights"] = {}
        data["sampling"] = "all"
    elif data["kind"] in ("mmoe", "mixed") and data.get("tasks") is None:
        data["tasks"] = heads  # the task list decides the generated data: keep it
    for key in ("missing_label", "sample_weights"):  # the kept heads' own
        if data.get(key):
            data[key] = {k: v for k, v in data[key].items() if k in kept}
    if data.get("allow_empty_heads"):
        data["allow_empty_heads"] = [h for h in data["allow_empty_heads"] if h in kept]
    if isinstance(data.get("targets"), dict):
        targets = {h: data["targets"][h] for h in kept if h in data["targets"]}
        data["targets"] = targets or None
    if isinstance(raw["train"]["trunk"], dict) and len(kept) == 1:
        raw["train"]["trunk"] = "per_head"
    callbacks = raw["callbacks"]
    callbacks["reduce_lr_on_plateau"] = [entry for entry in callbacks["reduce_lr_on_plateau"]
                                         if entry["head"] in kept]
    for name in ("early_stopping", "best_checkpoint"):
        section = callbacks.get(name)
        monitor = section.get("monitor") if section else None
        if monitor and MetricKey.parse(monitor).head not in (None, *kept):
            raise ConfigError(f"{source} {label!r}: callbacks.{name}.monitor is {monitor!r}, a "
                              f"head the run drops; add --set callbacks.{name}.monitor="
                              f"{MetricKey(kept[0], 'loss')}")
    return from_dict(raw, f"{source} {label}", allow_import)


def selected_heads(config: ExperimentConfig, source: str,
                   allow_import: Sequence[str] = ()) -> ExperimentConfig:
    """`config` with the heads of its `train.only_heads` alone (`only_heads`), or `config`
    when it sets none."""
    if config.train.only_heads is None:
        return config
    return only_heads(config, config.train.only_heads, f"{source}: train.only_heads",
                      allow_import)


def head_list(text: str) -> list[str]:
    """`--only-head y1,y3`: the head names, in order."""
    return [h.strip() for h in text.split(",") if h.strip()]
