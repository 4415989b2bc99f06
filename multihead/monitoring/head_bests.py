"""Per-head truth for the summaries: each head's best evaluation, whether and when it froze,
where its best checkpoint is, and how its final value compares with the constant baseline.

Read from a run's `metrics.json` (plain JSON, no TensorFlow), so the end-of-run table,
`multihead report` and `multihead compare` say the same thing.

Example:
    >>> metrics = {"steps": 40, "eval": {"a": {"loss": 0.5}},
    ...            "head_early_stopping": {"a": {"monitor": "eval/a/loss", "mode": "min",
    ...                                          "best_step": 20, "best_value": 0.4,
    ...                                          "stopped_step": 30, "reason": "..."}}}
    >>> best = head_bests(metrics)["a"]
    >>> best.best_value, best.best_step, best.frozen_step, best.final_is_best
    (0.4, 20, 30, False)
    >>> versus_baseline("accuracy", 0.75, 0.5), versus_baseline("loss", 0.25, 0.5)
    (50.0, 50.0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from multihead.monitoring.metric_key import MetricKey, metric_direction


def versus_baseline(metric: str, value: float | None, base: float | None) -> float | None:
    """How much better than the constant baseline `value` is, in % of |baseline|: positive
    when better, whichever way `metric` improves (`(B - M) / |B|` for a lower-is-better
    metric, `(M - B) / |B|` for a higher-is-better one, as Δm% takes it). None when the
    metric's direction is unknown, or either number is missing, not finite, or B is 0."""
    mode = metric_direction(metric)
    if mode is None or value is None or base is None:
        return None
    if not (math.isfinite(value) and math.isfinite(base)) or base == 0:
        return None
    sign = 1.0 if mode == "min" else -1.0
    return 100.0 * sign * (base - value) / abs(base)


def format_versus(percent: float | None) -> str:
    """`+12.3% better`, `-4.0% worse` or `-`."""
    if percent is None:
        return "-"
    return f"{percent:+.1f}% {'better' if percent >= 0 else 'worse'}"


@dataclasses.dataclass(frozen=True)
class HeadBest:
    """One head's best evaluation of a run.

    Attributes:
        monitor: the number watched (`eval/<head>/loss`).
        best_value, best_step: its best value and the step of that evaluation.
        frozen_step: the step per-head early stopping froze the head at, or None.
        reason: why it was frozen, or None.
        checkpoint: its best checkpoint, relative to the run directory (`best/<head>/...`),
            or None without `callbacks.best_checkpoint.per_head`.
        final_value: the monitored number of the weights the run ends with, or None.
        final_is_best: whether the final value equals the best one (None: not known).
    """

    monitor: str
    best_value: float | None
    best_step: int | None
    frozen_step: int | None = None
    reason: str | None = None
    checkpoint: str | None = None
    final_value: float | None = None

    @property
    def final_is_best(self) -> bool | None:
        if self.best_value is None or self.final_value is None:
            return None
        return self.final_value == self.best_value

    def to_dict(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), final_is_best=self.final_is_best)


def head_bests(metrics: Mapping[str, Any]) -> dict[str, HeadBest]:
    """Head -> its `HeadBest`, from a run's `metrics.json` (empty when the run had neither
    per-head early stopping nor per-head best checkpoints). Entries of the wrong type are
    read as missing: the file may come from anywhere."""
    stopping, checkpoints = _mapping(metrics.get("head_early_stopping")), \
        _mapping(metrics.get("head_best_checkpoints"))
    final = _mapping(metrics.get("eval"))
    out = {}
    for head in list(stopping) + [h for h in checkpoints if h not in stopping]:
        watch, best = _mapping(stopping.get(head)), _mapping(checkpoints.get(head))
        monitor = _text_or_none(watch.get("monitor")) or _text_or_none(best.get("monitor")) \
            or f"eval/{head}/loss"
        try:
            key = MetricKey.parse(monitor)
        except ValueError:
            key = MetricKey(str(head))
        value = _number_or_none(watch.get("best_value", best.get("value")))
        out[str(head)] = HeadBest(
            monitor=monitor, best_value=value,
            best_step=_int_or_none(watch.get("best_step", best.get("step"))),
            frozen_step=_int_or_none(watch.get("stopped_step")),
            reason=_text_or_none(watch.get("reason")),
            checkpoint=_text_or_none(best.get("path")),
            final_value=_number_or_none(_mapping(final.get(key.head)).get(key.metric)))
    return out


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _number_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def format_head_bests(bests: Mapping[str, HeadBest]) -> list[str]:
    """The per-head lines of a summary: best value and step, frozen at, best checkpoint,
    and a last line naming the heads whose final weights are not their best."""
    if not bests:
        return []
    rows = [("head", "monitor", "best", "at step", "frozen at", "final", "best checkpoint")]
    for head, b in bests.items():
        rows.append((head, b.monitor, _number(b.best_value), _text(b.best_step),
                     _text(b.frozen_step) if b.frozen_step is not None else "no",
                     _number(b.final_value), b.checkpoint or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["", "per head: the best evaluation, when the head froze, its best checkpoint"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    behind = [h for h, b in bests.items() if b.final_is_best is False]
    if behind:
        lines.append(f"the final model is not the best for: {', '.join(behind)} (each head's "
                     "best is in its best checkpoint; callbacks.best_checkpoint.restore_heads "
                     "ends a run with each head's layers from it)")
    return lines


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
