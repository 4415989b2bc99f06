"""A task grouping as a sweep: one run per group, trained by `multihead sweep`.

`multihead report RUN --groups N --groups-config FILE` writes the run's own config
(`RUN/config.yaml`) with a `sweep:` section whose one grid axis is `train.only_heads`, one
value per group of the grouping (`multihead.monitoring.groupings`): `multihead sweep FILE`
then trains each group alone, with the run's trunk, data, optimizers, steps and seed (add
`--grid seed=0,1,2` for seeds), and `multihead compare` reads the grouped runs beside the
all-heads run (docs/affinity.md). Affinity logging is turned off in the grouped runs.

Example:
    >>> write_grouped_sweep("runs/all", grouping, "groups.yaml")   # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from multihead._boundary import BoundaryError, read_text, write_atomic
from multihead.experiments.config.errors import ConfigError
from multihead.experiments.config.yaml12 import MAX_BYTES, dump_yaml
from multihead.monitoring.groupings import Grouping

#: The config a run directory holds (`multihead train` writes it first).
RUN_CONFIG = "config.yaml"


def grouped_sweep(config: Mapping[str, Any], grouping: Grouping) -> dict[str, Any]:
    """`config` (a run's config, as plain data) with every head, no affinity logging, and a
    sweep whose grid axis `train.only_heads` holds one group per trial."""
    raw = dict(config)
    raw["train"] = {**(raw.get("train") or {}), "only_heads": None}
    raw["log"] = {**(raw.get("log") or {}), "affinity_every": 0}
    raw["sweep"] = {"grid": {"train.only_heads": [list(g.heads) for g in grouping.groups]}}
    return raw


def write_grouped_sweep(run_dir: str | os.PathLike[str], grouping: Grouping,
                        path: str | os.PathLike[str], command: str = "") -> None:
    """Writes `grouped_sweep` of the run's `config.yaml` to `path` (atomically).

    Raises:
        ConfigError: the run has no readable `config.yaml` (not written by `multihead train`).
    """
    from multihead.experiments.config.schema import parse_yaml

    run_dir = os.fspath(run_dir)
    try:
        text = read_text(run_dir, RUN_CONFIG, limit=MAX_BYTES)
    except BoundaryError as err:
        raise ConfigError(f"{run_dir!r}: cannot read its {RUN_CONFIG} ({err}); pass a run "
                          "directory written by multihead train") from None
    config = parse_yaml(text, os.path.join(run_dir, RUN_CONFIG))
    if not isinstance(config, dict):
        raise ConfigError(f"{os.path.join(run_dir, RUN_CONFIG)}: not a config mapping")
    groups = "; ".join(", ".join(g.heads) for g in grouping.groups)
    header = (f"# One run per group of the task grouping of {run_dir} ({groups}){command}.\n"
              f"# Train them with: multihead sweep {os.fspath(path)}\n")
    write_atomic(os.fspath(path), header + dump_yaml(grouped_sweep(config, grouping)))
