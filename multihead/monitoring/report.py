"""`multihead report RUN_DIR`: a per-head summary of a run, read back from its event files.

For each head: final and best training loss, the mean norm of the trunk part and
of the head part of the gradient its optimizer applied, and the mean update
ratio (with an aggregated trunk, also the head's mean aggregation weight, loss
weight and trunk-gradient norm fed to the aggregator, and the mean norm of the
aggregated trunk gradient); a line per empty column says why it is empty; then the heads x heads matrix of mean trunk-gradient cosines (negative:
the heads pull the shared trunk in conflicting directions). The numbers are the
ones `multihead.Monitor` logged (`loss/<head>`, `grad_norm/<head>/trunk|head`,
`update_ratio/<head>`, `grad_cosine/<a>/<b>`, or `agg_cosine/<a>/<b>` when one
trunk optimizer applied the heads' aggregated gradient), averaged over the logged
steps. Tags are read through `multihead.monitoring.tags`, the schema the writers use.

Example:
    >>> report = load_report("runs/quickstart-20260101-120000")   # doctest: +SKIP
    >>> print(format_report(report))                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from multihead._boundary import BoundaryError, inside, is_regular, read_json, temp_file
from multihead._records import read_records
from multihead.monitoring import tags
from multihead.monitoring.head_bests import (
    HeadBest, format_head_bests, format_versus, head_bests, versus_baseline)


class ReportError(ValueError):
    """The run directory cannot be reported on (no event files, no per-head losses)."""


class Series(NamedTuple):
    """One scalar tag over time: `steps[i]` -> `values[i]`, sorted by step."""

    steps: np.ndarray
    values: np.ndarray


@dataclasses.dataclass(frozen=True)
class HeadSummary:
    """What a run did to one head (None: not logged for this head).

    Attributes:
        head: the head's name.
        final_loss: the last logged training loss, and `final_step` its step.
        best_loss: the lowest logged training loss, and `best_step` its step.
        mean_trunk_grad_norm: mean L2 norm of the trunk part of the applied gradient.
        mean_head_grad_norm: mean L2 norm of the head part of the applied gradient.
        mean_update_ratio: mean of `||update|| / ||weights||` over the head's var_list.
        eval_loss: the last evaluation loss (the `eval` run), if any.
        mean_agg_weight: with an aggregated trunk, the mean weight the aggregator gave
            the head's trunk gradient (`agg_weight/<head>`).
        mean_agg_loss_weight: the mean weight a loss weighting gave the head's loss.
        mean_agg_trunk_grad_norm: the mean norm of the head's trunk gradient fed to the
            aggregator (`agg_trunk_grad_norm/<head>`).
        eval_metrics: the loss and every metric of the last evaluation, `{name: value}`
            (empty without evaluations), and `eval_step` its step.
        baseline: the constant predictor's values, `{name: value}`, from the run's
            `metrics.json` (empty when it has none).
    """

    head: str
    final_loss: float
    final_step: int
    best_loss: float
    best_step: int
    mean_trunk_grad_norm: float | None
    mean_head_grad_norm: float | None
    mean_update_ratio: float | None
    eval_loss: float | None
    mean_agg_weight: float | None = None
    mean_agg_loss_weight: float | None = None
    mean_agg_trunk_grad_norm: float | None = None
    eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    eval_step: int | None = None
    baseline: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RunReport:
    """A run's per-head summaries and gradient-conflict matrix.

    Attributes:
        run_dir: the directory reported on.
        heads: head names, in the order they were logged.
        summaries: head -> `HeadSummary`.
        conflict: `conflict[a][b]` = mean cosine of a's and b's trunk gradients
            over the steps both were updated (`grad_cosine`, else `agg_cosine`; 1 on
            the diagonal, None when never logged, e.g. a head with `trains_trunk=False`).
        train: every scalar tag of the `train` run.
        eval: every scalar tag of the `eval` run (empty without evaluations).
        utilisation: for a trunk with gates (MMoE, PLE, ...), head -> the mean weight its
            gate gave each expert (`gate/<head>/expert_<i>`) at the last logged step;
            empty without gates. One expert near 1 is expert collapse.
        gate_entropy: head -> the mean entropy of its gate weights at that step.
        mean_agg_update_norm: with an aggregated trunk, the mean norm of the aggregated
            trunk gradient the trunk optimizer applied (`agg_update_norm`); else None.
        head_bests: with per-head early stopping or best checkpoints, head -> its best
            evaluation, freeze and best checkpoint (`metrics.json`).
        affinity: with affinity logging (`log.affinity_every`), `affinity[i][j]` = the mean
            over the logged steps of the inter-task affinity of head i onto head j
            (`affinity/<i>/<j>`, NaN steps left out), for every head i that moved the
            trunk; empty without.
    """

    run_dir: str
    heads: tuple[str, ...]
    summaries: dict[str, HeadSummary]
    conflict: dict[str, dict[str, float | None]]
    train: dict[str, Series]
    eval: dict[str, Series]
    utilisation: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    gate_entropy: dict[str, float] = dataclasses.field(default_factory=dict)
    mean_agg_update_norm: float | None = None
    head_bests: dict[str, HeadBest] = dataclasses.field(default_factory=dict)
    affinity: dict[str, dict[str, float | None]] = dataclasses.field(default_factory=dict)

    @property
    def aggregated(self) -> bool:
        """Whether one trunk optimizer applied an aggregate of the heads' trunk gradients."""
        return self.mean_agg_update_norm is not None


# -- reading event files ---------------------------------------------------------------


def _event_files(directory: str) -> list[str]:
    """The event files of `directory`: regular files only (a symlink may lead out of the run,
    and a FIFO named like an event file would block the reader forever)."""
    return sorted(p for p in glob.glob(os.path.join(glob.escape(directory), "events.out.tfevents.*"))
                  if is_regular(p))


def _run_folder(run_dir: str, name: str) -> str:
    try:
        return inside(run_dir, name)
    except BoundaryError as err:
        raise ReportError(str(err)) from None


def read_scalars(directory: str) -> dict[str, Series]:
    """Every scalar summary in the event files of `directory` (not recursive).

    When a step was written twice (a resumed run), the later value wins. The records are read
    in Python (`multihead._records.read_records`: every header checked, a length beyond the
    file or the bound is a `ReportError` naming the file and offset) and parsed with
    TensorBoard's protos: no TensorFlow is imported.
    """
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    points: dict[str, dict[int, float]] = {}
    for path in _event_files(directory):
        try:  # a live writer's last record may be torn
            records = read_records(path, partial_tail=True)
        except BoundaryError as err:
            raise ReportError(str(err)) from None
        for number, data in enumerate(records):
            try:
                event = event_pb2.Event.FromString(data)
            except DecodeError:
                raise ReportError(f"{path}: record {number} is not an event; the file is corrupt") from None
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("tensor"):
                    array = tensor_util.make_ndarray(value.tensor)
                    if array.ndim != 0 or not np.issubdtype(array.dtype, np.number):
                        continue  # text, histograms, layouts
                    scalar = float(array)
                elif value.HasField("simple_value"):
                    scalar = float(value.simple_value)
                else:
                    continue
                points.setdefault(value.tag, {})[int(event.step)] = scalar
    series = {}
    for tag, by_step in points.items():
        steps = np.array(sorted(by_step), dtype=np.int64)
        series[tag] = Series(steps, np.array([by_step[s] for s in steps], dtype=np.float64))
    return series


def _train_dir(run_dir: str) -> str:
    train = _run_folder(run_dir, "train")
    if os.path.isdir(train) and _event_files(train):
        return train
    if _event_files(run_dir):  # the train directory itself, or a plain log dir
        return run_dir
    raise ReportError(
        f"{run_dir!r} has no TensorBoard event files (looked for {train}/events.out.tfevents.* "
        "and in the directory itself): pass a run directory written by `multihead train` "
        "or by a Trainer with log_dir"
    )


# -- the report ------------------------------------------------------------------------


def _mean(series: Series | None) -> float | None:
    if series is None or not len(series.values):
        return None
    return float(np.mean(series.values))


def _heads_in_order(train: Mapping[str, Series]) -> tuple[str, ...]:
    # Tags were first written at the same step in the step's head order, and the
    # dict keeps the order tags were first read in.
    parsed = (tags.parse(tag) for tag in train)
    return tuple(p.heads[0] for p in parsed if p is not None and p.kind == tags.LOSS)


def _pair_series(train: Mapping[str, Series], kind: str) -> dict[frozenset[str], Series]:
    """Unordered head pair -> the series of `<kind>/<a>/<b>`."""
    pairs = {}
    for tag, series in train.items():
        parsed = tags.parse(tag)
        if parsed is not None and parsed.kind == kind:
            pairs[frozenset(parsed.heads)] = series
    return pairs


def load_report(run_dir: str | os.PathLike[str]) -> RunReport:
    """Reads a run's event files and summarizes them per head.

    Args:
        run_dir: a run directory (with `train/` and maybe `eval/` event
            directories), or a directory holding event files directly.

    Raises:
        ReportError: the directory does not exist, has no event files, or no
            `loss/<head>` scalars.
    """
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ReportError(f"run directory {run_dir!r} does not exist")
    train_dir = _train_dir(run_dir)
    train = read_scalars(train_dir)
    heads = _heads_in_order(train)
    if not heads:
        raise ReportError(
            f"the event files in {train_dir!r} have no loss/<head> scalars: was the run written by "
            "multihead's Monitor (Trainer(log_dir=...) or `multihead train`)?"
        )
    eval_dir = _run_folder(run_dir, "eval")
    evals = read_scalars(eval_dir) if train_dir != run_dir and os.path.isdir(eval_dir) else {}
    metrics = _run_metrics(run_dir) if train_dir != run_dir else {}
    baselines = _baselines(metrics)
    summaries = {}
    for head in heads:
        loss = train[tags.loss(head)]
        finite = np.where(np.isfinite(loss.values), loss.values, np.inf)
        best = int(np.argmin(finite))
        eval_loss = evals.get(tags.eval_metric(tags.LOSS, head))
        last = _last_evaluation(evals, head)
        summaries[head] = HeadSummary(
            head=head,
            final_loss=float(loss.values[-1]),
            final_step=int(loss.steps[-1]),
            best_loss=float(loss.values[best]),
            best_step=int(loss.steps[best]),
            mean_trunk_grad_norm=_mean(train.get(tags.trunk_grad_norm(head))),
            mean_head_grad_norm=_mean(train.get(tags.head_grad_norm(head))),
            mean_update_ratio=_mean(train.get(tags.update_ratio(head))),
            eval_loss=float(eval_loss.values[-1]) if eval_loss is not None else None,
            mean_agg_weight=_mean(train.get(tags.agg_weight(head))),
            mean_agg_loss_weight=_mean(train.get(tags.agg_loss_weight(head))),
            mean_agg_trunk_grad_norm=_mean(train.get(tags.agg_trunk_grad_norm(head))),
            eval_metrics=last[1], eval_step=last[0], baseline=baselines.get(head, {}),
        )
    # Each head's optimizer updating the trunk logs `grad_cosine`; one trunk optimizer
    # fed the heads' aggregated gradients logs the same cosine as `agg_cosine`.
    cosines = {**_pair_series(train, tags.AGG_COSINE), **_pair_series(train, tags.GRAD_COSINE)}
    trunk_heads = {h for h in heads if summaries[h].mean_trunk_grad_norm is not None}
    trunk_heads |= {h for h in heads if tags.agg_trunk_grad_norm(h) in train}
    trunk_heads |= {h for pair in cosines for h in pair}
    conflict: dict[str, dict[str, float | None]] = {a: {} for a in heads}
    for a in heads:
        for b in heads:
            if a == b:
                conflict[a][b] = 1.0 if a in trunk_heads else None
            else:
                conflict[a][b] = _mean(cosines.get(frozenset((a, b))))
    utilisation, entropy = _gate_utilisation(train, heads)
    return RunReport(run_dir, heads, summaries, conflict, train, evals, utilisation, entropy,
                     _mean(train.get(tags.AGG_UPDATE_NORM)), head_bests(metrics),
                     _affinity(train, heads))


def _affinity(train: Mapping[str, Series], heads: Sequence[str]) -> dict[str, dict[str, float | None]]:
    """`[i][j]`: the mean of `affinity/<i>/<j>` over its finite logged values (None: none)."""
    means: dict[str, dict[str, float | None]] = {}
    for tag, series in train.items():
        parsed = tags.parse(tag)
        if parsed is None or parsed.kind != tags.AFFINITY:
            continue
        finite = series.values[np.isfinite(series.values)]
        means.setdefault(parsed.heads[0], {})[parsed.heads[1]] = (
            float(np.mean(finite)) if len(finite) else None)
    order = {h: k for k, h in enumerate(heads)}

    def rank(head: str) -> int:
        return order.get(head, len(order))

    return {i: {j: means[i][j] for j in sorted(means[i], key=rank)} for i in sorted(means, key=rank)}


def _last_evaluation(evals: Mapping[str, Series], head: str) -> tuple[int | None, dict[str, float]]:
    """The step of `head`'s last evaluation and its `{metric: value}` there (`<metric>/<head>`
    tags of the eval run; the loss first)."""
    series = {tag[:-len(head) - 1]: s for tag, s in evals.items()
              if tag.endswith(f"/{head}") and len(s.steps)}
    if not series:
        return None, {}
    step = max(int(s.steps[-1]) for s in series.values())
    values = {name: float(s.values[-1]) for name, s in series.items() if s.steps[-1] == step}
    order = sorted(values, key=lambda name: name != tags.LOSS)
    return step, {name: values[name] for name in order}


def _run_metrics(run_dir: str) -> Mapping[str, Any]:
    """The run's `metrics.json`, or nothing when it has none (not finished)."""
    try:
        metrics = read_json(run_dir, "metrics.json")
    except BoundaryError:
        return {}
    return metrics if isinstance(metrics, dict) else {}


def _baselines(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Head -> the constant predictor's `{metric: value}` of a `metrics.json` (none for a
    run that is not supervised)."""
    baseline = metrics.get("baseline")
    if not isinstance(baseline, dict):
        return {}
    return {str(h): {str(m): float(v) for m, v in values.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for h, values in baseline.items() if isinstance(values, dict)}


def _gate_utilisation(train: Mapping[str, Series], heads: Sequence[str],
                      ) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Head -> mean gate weight per expert, and head -> gate entropy, at the last logged step."""
    experts: dict[str, dict[int, float]] = {}
    entropy: dict[str, float] = {}
    for tag, series in train.items():
        parsed = tags.parse(tag)
        if parsed is None or parsed.kind != tags.GATE or parsed.heads[0] not in heads:
            continue
        head = parsed.heads[0]
        if parsed.part == tags.GATE_ENTROPY:
            entropy[head] = float(series.values[-1])
        else:
            experts.setdefault(head, {})[int(parsed.part[len(tags.GATE_EXPERT):])] = float(series.values[-1])
    utilisation = {h: [experts[h][i] for i in sorted(experts[h])] for h in heads if h in experts}
    return utilisation, entropy


def report_to_dict(report: RunReport) -> dict[str, Any]:
    """The report as JSON-ready data (what `multihead report --json` prints)."""
    def clean(x: Any) -> Any:
        if isinstance(x, dict):  # a head's eval metrics and baseline
            return {k: clean(v) for k, v in x.items()}
        return None if isinstance(x, float) and not math.isfinite(x) else x

    return {
        "run_dir": report.run_dir,
        "heads": {h: {k: clean(v) for k, v in dataclasses.asdict(s).items() if k != "head"}
                  for h, s in report.summaries.items()},
        "conflict": {a: {b: clean(v) for b, v in row.items()} for a, row in report.conflict.items()},
        "gate_utilisation": {h: [clean(v) for v in row] for h, row in report.utilisation.items()},
        "gate_entropy": {h: clean(v) for h, v in report.gate_entropy.items()},
        "mean_agg_update_norm": clean(report.mean_agg_update_norm),
        "head_bests": {h: {k: clean(v) for k, v in b.to_dict().items()}
                       for h, b in report.head_bests.items()},
        "affinity": {i: {j: clean(v) for j, v in row.items()} for i, row in report.affinity.items()},
        "empty": _why_empty(report),
    }


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


#: The per-head table's optional columns: (header, HeadSummary field, digits).
_AGG_COLUMNS = (("agg weight", "mean_agg_weight", 4), ("loss weight", "mean_agg_loss_weight", 4),
                ("agg trunk grad norm", "mean_agg_trunk_grad_norm", 4))


def _why_empty(report: RunReport) -> dict[str, dict[str, str]]:
    """Column -> head -> why that head's cell of the per-head table is `-`."""
    empty: dict[str, dict[str, str]] = {}
    for s in report.summaries.values():
        if s.mean_trunk_grad_norm is None:
            empty.setdefault("trunk grad norm", {})[s.head] = (
                "aggregated: one trunk optimizer applied the heads' weighted trunk gradients "
                f"(see agg trunk grad norm, and {tags.AGG_UPDATE_NORM})"
                if s.mean_agg_trunk_grad_norm is not None
                else "the head does not train the trunk (trains_trunk=False)")
        if s.mean_head_grad_norm is None:
            empty.setdefault("head grad norm", {})[s.head] = "the head has no variables of its own"
        if report.aggregated and s.mean_agg_trunk_grad_norm is None:
            empty.setdefault("agg weight, agg trunk grad norm", {})[s.head] = (
                "the head is not aggregated (trains_trunk=False)")
        elif report.aggregated and s.mean_agg_weight is None:
            empty.setdefault("agg weight", {})[s.head] = (
                "the aggregator combines coordinate-wise, with no weight per head")
    return empty


def _empty_lines(report: RunReport) -> list[str]:
    """One line per (columns, reason): `trunk grad norm: -  for a, b: aggregated: ...`."""
    lines = []
    for column, by_head in _why_empty(report).items():
        for reason in dict.fromkeys(by_head.values()):
            heads = ", ".join(h for h, r in by_head.items() if r == reason)
            lines.append(f"{column}: -  for {heads}: {reason}")
    return lines


def format_report(report: RunReport) -> str:
    """The human-readable report: the per-head table (with an aggregated trunk: each
    head's aggregation weight), why a cell is empty, then the conflict matrix."""
    has_eval = any(s.eval_loss is not None for s in report.summaries.values())
    summaries = report.summaries.values()
    extra = [c for c in _AGG_COLUMNS if any(getattr(s, c[1]) is not None for s in summaries)]
    header = (("head", "train loss (last logged)", "best train loss", "trunk grad norm",
               "head grad norm", "update ratio") + tuple(c[0] for c in extra)
              + (("eval loss",) if has_eval else ()))
    rows = [header]
    for s in summaries:
        rows.append((s.head, f"{_fmt(s.final_loss)} @{s.final_step}",
                     f"{_fmt(s.best_loss)} @{s.best_step}", _fmt(s.mean_trunk_grad_norm),
                     _fmt(s.mean_head_grad_norm), _fmt(s.mean_update_ratio, 3))
                    + tuple(_fmt(getattr(s, field), digits) for _, field, digits in extra)
                    + ((_fmt(s.eval_loss),) if has_eval else ()))
    lines = [f"run {report.run_dir}", ""] + _table(rows) + _empty_lines(report)
    if has_eval:
        lines += ["", "last evaluation, every metric (baseline: the best constant predictor)"]
        table = [("head", "step", "metric", "eval", "baseline", "vs baseline")]
        for s in report.summaries.values():
            for name, value in s.eval_metrics.items():
                base = s.baseline.get(name)
                table.append((s.head, str(s.eval_step), name, _fmt(value), _fmt(base),
                              format_versus(versus_baseline(name, value, base))))
        lines += _table(table)
    lines += format_head_bests(report.head_bests)
    if report.aggregated:
        lines += ["", f"aggregated trunk gradient norm ({tags.AGG_UPDATE_NORM}), mean over logged "
                  f"steps: {_fmt(report.mean_agg_update_norm)}"]
    lines += ["", "trunk gradient cosine, mean over logged steps (< 0: the heads conflict)"]
    matrix = [("",) + report.heads]
    for a in report.heads:
        matrix.append((a,) + tuple(
            "-" if report.conflict[a][b] is None else f"{report.conflict[a][b]:+.3f}"
            for b in report.heads))
    lines += _table(matrix)
    if report.affinity:
        lines += ["", "inter-task affinity of the row's update onto the column's loss, mean over "
                  "logged steps (> 0: it lowers it)"]
        columns = [h for h in report.heads if any(h in row for row in report.affinity.values())]
        table = [("",) + tuple(columns)]
        for i, row in report.affinity.items():
            table.append((i,) + tuple("-" if row.get(j) is None else f"{row[j]:+.3g}"
                                      for j in columns))
        lines += _table(table)
    if report.utilisation:
        width = max(len(row) for row in report.utilisation.values())
        lines += ["", "gate utilisation: mean gate weight per expert at the last logged step "
                  "(one expert near 1: collapse)"]
        table = [("head",) + tuple(f"e{i}" for i in range(width)) + ("entropy",)]
        for head, row in report.utilisation.items():
            table.append((head,) + tuple(f"{v:.3f}" for v in row) + ("",) * (width - len(row))
                         + (_fmt(report.gate_entropy.get(head), 3),))
        lines += _table(table)
    return "\n".join(lines)


# -- the figure ------------------------------------------------------------------------


def _plot_utilisation(ax: Any, report: RunReport) -> None:
    """Heads x experts heatmap of the mean gate weights (0 to 1)."""
    heads = list(report.utilisation)
    width = max(len(row) for row in report.utilisation.values())
    matrix = np.full((len(heads), width), np.nan)
    for i, head in enumerate(heads):
        matrix[i, :len(report.utilisation[head])] = report.utilisation[head]
    ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(width), [str(i) for i in range(width)])
    ax.set_yticks(range(len(heads)), heads)
    for i in range(len(heads)):
        for j in range(width):
            if np.isfinite(matrix[i, j]):
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize="small",
                        color="black" if matrix[i, j] > 0.5 else "white")
    ax.set(title="gate utilisation (mean weight)", xlabel="expert")

FIGSIZE = (15.0, 4.5)
DPI = 100


def plot_report(report: RunReport, path: str | os.PathLike[str]) -> None:
    """Draws loss curves, gradient-norm curves and the conflict heatmap into a PNG.

    The file is `FIGSIZE * DPI` pixels (1500 x 450), written atomically.

    Raises:
        ImportError: matplotlib is not installed (`pip install multihead[plot]`).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    path = os.fspath(path)
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    axes = fig.subplots(1, 4 if report.utilisation else 3)
    loss_ax, norm_ax, conflict_ax = axes[:3]
    colors = matplotlib.colormaps["tab10"]
    for i, head in enumerate(report.heads):
        loss = report.train[tags.loss(head)]
        loss_ax.plot(loss.steps, loss.values, color=colors(i % 10), label=head)
        for tag, part, style in ((tags.trunk_grad_norm(head), "trunk", "-"),
                                 (tags.head_grad_norm(head), "head", "--")):
            series = report.train.get(tag)
            if series is not None:
                norm_ax.plot(series.steps, series.values, style, color=colors(i % 10),
                             label=f"{head} {part}")
    positive = all(np.all(report.train[tags.loss(h)].values > 0) for h in report.heads)
    loss_ax.set(title="training loss", xlabel="step", yscale="log" if positive else "linear")
    norm_ax.set(title="applied gradient norm (- trunk, -- head)", xlabel="step", yscale="log")
    for ax in (loss_ax, norm_ax):
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    matrix = np.array([[np.nan if report.conflict[a][b] is None else report.conflict[a][b]
                        for b in report.heads] for a in report.heads])
    image = conflict_ax.imshow(matrix, cmap="RdBu", vmin=-1.0, vmax=1.0)
    ticks = range(len(report.heads))
    conflict_ax.set_xticks(ticks, report.heads)
    conflict_ax.set_yticks(ticks, report.heads)
    for i in ticks:
        for j in ticks:
            if np.isfinite(matrix[i, j]):
                conflict_ax.text(j, i, f"{matrix[i, j]:+.2f}", ha="center", va="center",
                                 color="white" if abs(matrix[i, j]) > 0.5 else "black")
    conflict_ax.set_title("mean trunk-gradient cosine")
    fig.colorbar(image, ax=conflict_ax)
    if report.utilisation:
        _plot_utilisation(axes[3], report)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = temp_file(directory, suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
