"""Short names for groups of runs: the config keys that set them apart, at a glance.

A group of runs is named by the flattened config keys whose values differ between the
groups (seeds aside). Spelled out, an aggregated trunk against `per_head` lists every
subkey of `train.trunk` (`train.trunk.aggregator=upgrad, train.trunk.dtype=float32, ...`).
`group_labels` shortens that:

- a key a group does not set (None) is left out, and so is a subkey at its schema default
  whose parent differs in kind between the groups (`train.trunk.dtype=float32` beside a
  `train.trunk: per_head` group), unless that would leave the group unnamed;
- `X.aggregator=NAME` is written `X=NAME` when `X` itself differs (`per_head` elsewhere);
- a key is written by its shortest dotted suffix that no other differing key ends with
  (`train.trunk` -> `trunk`, `model.heads.y1.weight` -> `y1.weight`), shortest first.

Groups whose short names would coincide keep their full ones.

Example:
    >>> group_labels([{"train.trunk": "per_head", "train.trunk.aggregator": None},
    ...               {"train.trunk": None, "train.trunk.aggregator": "upgrad",
    ...                "train.trunk.dtype": "float32"}])
    ['trunk=per_head', 'trunk=upgrad']
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Mapping, Sequence

import yaml

__all__ = ["group_labels", "schema_default"]

_MISSING = object()


@functools.lru_cache(maxsize=1)
def _defaults() -> tuple[tuple[re.Pattern, Any], ...]:
    """(key path pattern, default value) of every key of the config reference; placeholders
    such as `<head>` match one path segment."""
    from multihead.experiments.config.reference import key_rows

    out = []
    for row in key_rows():
        text = row.default.strip("`")
        if text in ("required", "(section)"):
            continue
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        pattern = re.escape(row.path)
        pattern = re.sub(r"\\<[^.>]+\\>|<[^.>]+>", r"[^.]+", pattern)
        out.append((re.compile(pattern + r"\Z"), value))
    return tuple(out)


def schema_default(key: str) -> Any:
    """The default of config key path `key` (`train.trunk.dtype`), or a sentinel when the
    schema gives none."""
    for pattern, value in _defaults():
        if pattern.match(key):
            return value
    return _MISSING


def _text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _shown(hparams: Mapping[str, Any], varying: Sequence[str]) -> dict[str, Any]:
    """The keys that name one group: set, not at their default (unless nothing else is)."""
    present = {k: v for k, v in hparams.items() if v is not None}
    chosen = {k: v for k, v in present.items()
              if k.rpartition(".")[0] not in varying or schema_default(k) != v}
    if not chosen:
        chosen = present
    renamed = {}
    for key, value in chosen.items():
        parent = key.removesuffix(".aggregator")
        renamed[parent if key != parent and parent in varying else key] = value
    return renamed


def _short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Key -> its shortest dotted suffix that no other key ends with."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(other != key and (other == suffix or other.endswith("." + suffix)) for other in keys):
                out[key] = suffix
                break
        else:
            out[key] = key
    return out


def group_labels(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """One short label per group, from each group's differing hyperparameters (see the
    module docstring); `all` for one group whose runs differ only in seeds."""
    varying = list(dict.fromkeys(k for g in groups for k in g))
    shown = [_shown(g, varying) for g in groups]
    short = _short_keys(list(dict.fromkeys(k for s in shown for k in s)))
    labels = []
    for items, full in zip(shown, groups):
        ordered = sorted(items.items(), key=lambda kv: (len(short[kv[0]]), short[kv[0]]))
        labels.append(", ".join(f"{short[k]}={_text(v)}" for k, v in ordered))
    fulls = [", ".join(f"{k}={_text(v)}" for k, v in g.items()) for g in groups]
    return [label if labels.count(label) == 1 else full for label, full in zip(labels, fulls)] \
        if groups and any(groups) else ["all"] * len(groups)
