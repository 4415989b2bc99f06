"""Compare finished runs: per-head final and best evaluations, mean ± std over seeds, Δm%.

`compare(paths, baseline=...)` reads run directories (their `config.yaml` and
`metrics.json`) and sweep directories (their done trials), groups the runs by the
hyperparameters that differ between them other than seeds (`seed`, `data.seed`,
`train.trunk.seed`), and reports for each group the mean and standard deviation (numpy's
`std`, ddof 0) of every head's final evaluation metrics over the group's runs.

Δm% (Maninis et al., CVPR 2019; the number LibMTL, Nash-MTL and FAMO report) is the mean
relative change of each metric against single-task baselines, signed so that a worse
metric counts positive:

    Δm% = 100 / N · Σ_i s_i · (M_i − B_i) / |B_i|,   s_i = +1 if lower is better, −1 if higher

over the N (head, metric) pairs that both the group and the baselines report, M_i the
group's mean final metric and B_i the baselines' mean. The denominator is |B_i| (LibMTL's
`count_improvement` divides by B_i, the same for the positive metrics it meets): for a
metric that can be negative (R² of a poor baseline, a log-likelihood) the sign of a term
then still says better (−) or worse (+). A baseline of 0, NaN or ±inf (or a non-finite
M_i) has no relative change: `delta_m_terms` raises `DeltaMError` and `compare` refuses with
one line naming the head, the metric and the runs. By default every such pair counts,
each head's loss as well as its metrics; `metrics=["loss"]` (`--metrics loss`) or
`metrics=["accuracy", "mae"]` restricts the pairs to those metric names. Lower Δm% is better; 0 is parity
with single-task training. Directions come from the metric's name
(`multihead.monitoring.metric_key.metric_direction`: `loss`, errors and crossentropies are
lower-better; accuracy, AUC, precision, recall, F1, R² and IoU are higher-better); metrics of unknown direction are left out and listed in `skipped`, or
given with `directions={"metric": "min" | "max"}`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Collection, Iterable, Mapping, Sequence

import numpy as np

from multihead._boundary import BoundaryError, inside, read_json, read_text
from multihead._checks import suggest
from multihead.experiments.config.schema import ConfigError, parse_yaml
from multihead.experiments.config.yaml12 import MAX_BYTES
from multihead.experiments.results.figures import legend_below
from multihead.experiments.results.labels import group_labels
from multihead.experiments.results.pareto import ParetoFront, front_of, pareto_figure
from multihead.monitoring.head_bests import HeadBest, format_head_bests, head_bests
from multihead.monitoring.metric_key import metric_direction

#: Hyperparameters that only reseed a run: runs differing only in these are one group.
SEED_KEYS = ("seed", "data.seed", "train.trunk.seed")


class CompareError(ConfigError):
    """A path is not a finished run or sweep, or the runs cannot be compared."""


class DeltaMError(ValueError):
    """A (head, metric) pair whose relative change is undefined: a baseline of 0, NaN or
    ±inf, or a non-finite metric.

    Attributes:
        head, metric: the pair.
        side: `baseline` or `metric` (the group's value).
        value: the offending value.
    """

    def __init__(self, head: str, metric: str, side: str, value: float) -> None:
        self.head, self.metric, self.side, self.value = head, metric, side, value
        need = "a finite, non-zero number" if side == "baseline" else "a finite number"
        super().__init__(f"Δm%: the {side} of head {head!r} metric {metric!r} is {value!r}; "
                         f"a relative change needs {need}")


def direction(metric: str, directions: Mapping[str, str] | None = None) -> str | None:
    """`min` (lower is better), `max`, or None (unknown) for a metric name."""
    if directions and metric in directions:
        return directions[metric]
    return metric_direction(metric)


def delta_m_terms(metrics: Mapping[str, Mapping[str, float]], baseline: Mapping[str, Mapping[str, float]],
                  directions: Mapping[str, str] | None = None,
                  chosen: Collection[str] | None = None) -> tuple[dict[str, float], list[str]]:
    """The terms `s_i · (M_i − B_i) / |B_i|` of Δm%, by `head/metric` (the one place this
    arithmetic lives: `delta_m`, `compare` and the docs' numbers use it).

    Args:
        metrics, baseline: {head: {metric: value}}; a pair counts when both report it.
        directions: metric name -> `min` or `max`, for metrics whose name does not say.
        chosen: the metric names that enter Δm% (e.g. `["loss"]`); None: every metric.

    Returns:
        (the terms, the `head/metric` pairs left out because their direction is unknown).

    Raises:
        DeltaMError: a counted pair's baseline is 0, NaN or ±inf, or its metric is not finite.

    Example:
        >>> delta_m_terms({"a": {"r2": 0.2}}, {"a": {"r2": -0.5}}, {"r2": "max"})[0]
        {'a/r2': -1.4}
    """
    terms: dict[str, float] = {}
    skipped = []
    for head, values in metrics.items():
        for metric, value in values.items():
            base = baseline.get(head, {}).get(metric)
            if base is None or (chosen is not None and metric not in chosen):
                continue
            sign = {"min": 1.0, "max": -1.0}.get(direction(metric, directions) or "")
            if not sign:
                skipped.append(f"{head}/{metric}")
                continue
            if base == 0 or not math.isfinite(base):
                raise DeltaMError(head, metric, "baseline", base)
            if not math.isfinite(value):
                raise DeltaMError(head, metric, "metric", value)
            # |B|: the term's sign says better or worse whatever the baseline's sign
            terms[f"{head}/{metric}"] = sign * (value - base) / abs(base)
    return terms, skipped


def delta_m(metrics: Mapping[str, Mapping[str, float]], baseline: Mapping[str, Mapping[str, float]],
            directions: Mapping[str, str] | None = None,
            chosen: Collection[str] | None = None) -> tuple[float | None, list[str]]:
    """Δm% of `metrics` ({head: {metric: value}}) against `baseline` (same shape), over the
    metrics named in `chosen` (default: every metric both report).

    Returns:
        (Δm%, or None when no pair is comparable; the `head/metric` pairs left out because
        their direction is unknown).

    Example:
        >>> delta_m({"a": {"loss": 0.9}, "b": {"accuracy": 0.8}},
        ...         {"a": {"loss": 1.0}, "b": {"accuracy": 0.5}})[0]   # (-10 - 60) / 2
        -35.0
        >>> delta_m({"a": {"loss": 0.5}, "b": {"accuracy": 0.8}},
        ...         {"a": {"loss": 1.0}, "b": {"accuracy": 0.5}}, chosen=["loss"])[0]
        -50.0
    """
    terms, skipped = delta_m_terms(metrics, baseline, directions, chosen)
    if not terms:
        return None, skipped
    return 100.0 * math.fsum(terms.values()) / len(terms), skipped


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One finished run.

    Attributes:
        run_dir: its directory.
        config: its resolved config, flattened to key path -> value.
        final: {head: {metric: value}} of the final evaluation (`metrics.json` `eval`).
        best: {head: {metric: value}}, the best of the run's evaluations per metric direction.
        curves: {head: {metric: [(step, value), ...]}} of the run's evaluations.
        head_bests: with per-head early stopping or best checkpoints, head -> its best
            evaluation, freeze and best checkpoint (`multihead.monitoring.head_bests`).
    """

    run_dir: str
    config: dict[str, Any]
    final: dict[str, dict[str, float]]
    best: dict[str, dict[str, float]]
    curves: dict[str, dict[str, list[tuple[int, float]]]]
    head_bests: dict[str, HeadBest] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Group:
    """Runs that differ only in seeds.

    Attributes:
        label: the hyperparameters that set the group apart, shortened (`trunk=upgrad`;
            `multihead.experiments.results.labels`; `all` when the runs differ only in seeds).
        hparams: those hyperparameters, key path -> value.
        runs: the group's run directories.
        mean, std: {head: {metric: value}} over the runs' final evaluations.
        best_mean: {head: {metric: value}}, the mean over the runs of each run's best.
        delta_m: Δm% of `mean` against the baselines (None without baselines).
    """

    label: str
    hparams: dict[str, Any]
    runs: list[str]
    mean: dict[str, dict[str, float]]
    std: dict[str, dict[str, float]]
    best_mean: dict[str, dict[str, float]]
    delta_m: float | None = None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What `compare` returns (plain data; `to_dict`, `to_dataframe`, `format`).

    Attributes:
        runs: every run compared.
        groups: the runs grouped by their non-seed hyperparameters.
        baseline: {head: {metric: value}}, the baselines' mean final metrics (empty without).
        skipped: `head/metric` pairs left out of Δm% (direction unknown).
        delta_m_pairs: the `head/metric` pairs Δm% is computed over (of any group).
        delta_m_metrics: the metric names chosen for Δm% (`compare(metrics=...)`), or None
            for every metric.
        pareto: the groups' Pareto front (`compare(pareto=True)`), or None.
        directions: the metric directions given to `compare` (others from their names).
    """

    runs: list[RunResult]
    groups: list[Group]
    baseline: dict[str, dict[str, float]]
    skipped: list[str]
    delta_m_pairs: list[str] = dataclasses.field(default_factory=list)
    delta_m_metrics: list[str] | None = None
    pareto: ParetoFront | None = None
    directions: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what `multihead compare --json` prints)."""
        return {
            "runs": [{"run_dir": r.run_dir, "final": r.final, "best": r.best,
                      "head_bests": {h: b.to_dict() for h, b in r.head_bests.items()}}
                     for r in self.runs],
            "groups": [{k: v for k, v in dataclasses.asdict(g).items()} for g in self.groups],
            "baseline": self.baseline,
            "skipped": self.skipped,
            "delta_m_pairs": self.delta_m_pairs,
            "delta_m_metrics": self.delta_m_metrics,
            "best_groups": self.best_groups(),
            **({"pareto": dataclasses.asdict(self.pareto)} if self.pareto is not None else {}),
        }

    def best_groups(self) -> dict[str, list[str]]:
        """`head/metric` -> the labels of the groups with the best mean (ties: all of them),
        for each metric of known direction."""
        out: dict[str, list[str]] = {}
        for head, metric in _pairs(g.mean for g in self.groups):
            mode = direction(metric, self.directions)
            values = {g.label: g.mean[head][metric] for g in self.groups
                      if metric in g.mean.get(head, {}) and math.isfinite(g.mean[head][metric])}
            if mode is None or not values:
                continue
            target = (min if mode == "min" else max)(values.values())
            out[f"{head}/{metric}"] = [label for label, v in values.items() if v == target]
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One row per group and head/metric: group, head, metric, n, mean, std, best_mean, delta_m."""
        return [{"group": g.label, "head": head, "metric": metric, "n": len(g.runs),
                 "mean": value, "std": g.std[head][metric], "best_mean": g.best_mean[head][metric],
                 "baseline": self.baseline.get(head, {}).get(metric), "delta_m": g.delta_m}
                for g in self.groups for head, values in g.mean.items()
                for metric, value in values.items()]

    def to_dataframe(self) -> Any:
        """`rows()` as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def format(self) -> str:
        """The tables `multihead compare` prints: runs, then groups with mean ± std and Δm%."""
        lines = ["runs (final eval; best in brackets):"]
        header = ["run"] + [f"{h}/{m}" for h, m in _pairs(r.final for r in self.runs)]
        table = [header]
        for run in self.runs:
            table.append([run.run_dir] + [
                f"{run.final[h][m]:.4g} [{run.best.get(h, {}).get(m, math.nan):.4g}]"
                if m in run.final.get(h, {}) else "-" for h, m in _pairs(r.final for r in self.runs)])
        lines += _table(table)
        for run in self.runs:
            if run.head_bests:
                lines += [line if line else f"run {run.run_dir}:"
                          for line in format_head_bests(run.head_bests)]
        lines.append("")
        lines.append("groups (mean ± std over seeds):")
        pairs = _pairs(g.mean for g in self.groups)
        table = [["group", "n"] + [f"{h}/{m}" for h, m in pairs] + (["Δm%"] if self.baseline else [])]
        if self.baseline:
            table.append(["baseline (single-task)", "-"] +
                         [f"{self.baseline[h][m]:.4g}" if m in self.baseline.get(h, {}) else "-"
                          for h, m in pairs] + ["0"])
        best = self.best_groups() if len(self.groups) > 1 else {}
        for g in self.groups:
            table.append([g.label, str(len(g.runs))] +
                         [f"{g.mean[h][m]:.4g} ± {g.std[h][m]:.2g}" + (" *" if g.label in best.get(f"{h}/{m}", ()) else "")
                          if m in g.mean.get(h, {}) else "-" for h, m in pairs] +
                         ([f"{g.delta_m:+.2f}" if g.delta_m is not None else "-"] if self.baseline else []))
        lines += _table(table)
        if best:
            lines.append("* the best group of each metric (by its direction)")
        if self.delta_m_pairs:
            lines.append(f"Δm% over {len(self.delta_m_pairs)} pairs: {', '.join(self.delta_m_pairs)}")
        if self.skipped:
            lines.append(f"left out of Δm% (direction unknown): {', '.join(self.skipped)}")
        if self.pareto is not None:
            lines.append(self.pareto.format())
        return "\n".join(lines)


def _pairs(trees: Iterable[Mapping[str, Mapping[str, float]]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((h, m) for tree in trees for h, values in tree.items() for m in values))


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def run_dirs(path: str | os.PathLike[str]) -> list[str]:
    """The finished run directories of a run or sweep directory (a sweep's done trials)."""
    path = os.fspath(path)
    if os.path.lexists(os.path.join(path, "sweep.json")):
        from multihead.experiments.sweep.index import check_trial_dirs

        try:  # the trials' run_dir must stay in the sweep: it is read below
            index = read_json(path, "sweep.json")
            check_trial_dirs(path, index.get("trials"))
            return [inside(path, t["run_dir"]) for t in index["trials"] if t["status"] == "done"]
        except BoundaryError as err:
            raise CompareError(str(err)) from None
    if os.path.lexists(os.path.join(path, "metrics.json")):
        return [path]
    raise CompareError(f"{path!r}: neither a finished run (metrics.json) nor a sweep (sweep.json)")


def load_result(run_dir: str, directions: Mapping[str, str] | None = None) -> RunResult:
    """A finished run's config and evaluations."""
    try:  # regular files of the run only, read within bounds (a FIFO, a symlink, a bomb: one line)
        metrics = read_json(run_dir, "metrics.json")
        text = read_text(run_dir, "config.yaml", limit=MAX_BYTES)
    except BoundaryError as err:
        raise CompareError(str(err)) from None
    config = parse_yaml(text, os.path.join(run_dir, "config.yaml")) or {}
    if not isinstance(config, dict):
        raise CompareError(f"{os.path.join(run_dir, 'config.yaml')}: the config must be a mapping")
    where = os.path.join(run_dir, "metrics.json")
    try:
        final = {str(h): {str(m): _number(v) for m, v in values.items()}
                 for h, values in _mapping(metrics.get("eval") or {}).items() if isinstance(values, dict)}
        curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for entry in metrics.get("evals") or []:
            for head, values in _mapping(_mapping(entry)["eval"]).items():
                for metric, value in _mapping(values).items():
                    step = entry["step"]
                    if isinstance(step, bool) or not isinstance(step, int):
                        raise TypeError(f"step {step!r}")
                    curves.setdefault(head, {}).setdefault(metric, []).append((step, _number(value)))
    except (TypeError, KeyError, AttributeError) as err:
        raise CompareError(f"{where}: not a metrics record of a finished run ({err})") from None
    best: dict[str, dict[str, float]] = {}
    for head, values in final.items():
        for metric, value in values.items():
            seen = [v for _, v in curves.get(head, {}).get(metric, [])] or [value]
            pick = max if direction(metric, directions) == "max" else min
            best.setdefault(head, {})[metric] = pick(seen)
    return RunResult(run_dir, _flat(config), final, best, curves, head_bests(metrics))


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a mapping, got {type(value).__name__}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _mean_std(trees: Sequence[Mapping[str, Mapping[str, float]]]) -> tuple[dict, dict]:
    mean: dict[str, dict[str, float]] = {}
    std: dict[str, dict[str, float]] = {}
    for head, metric in _pairs(trees):
        values = np.array([t[head][metric] for t in trees if metric in t.get(head, {})], dtype=np.float64)
        with np.errstate(invalid="ignore"):  # an inf value: its std is nan, Δm% refuses it
            mean.setdefault(head, {})[metric] = float(values.mean())
            std.setdefault(head, {})[metric] = float(values.std())
    return mean, std


def group_runs(runs: Sequence[RunResult]) -> list[tuple[dict[str, Any], list[RunResult]]]:
    """Runs grouped by the config values that differ between them, seeds aside; in first-seen
    order. A head's keys (`model.heads.<head>.*`) differ only between runs that train that
    head: runs of some heads each (`train.only_heads`, a task grouping) differ in
    `train.only_heads`, not in the keys of the heads they drop."""
    keys = sorted({k for r in runs for k in r.config})

    def values(key: str) -> set[str]:
        told = [r.config.get(key) for r in runs]
        if key.startswith("model.heads."):
            told = [v for v in told if v is not None]
        return {json.dumps(v, sort_keys=True) for v in told}

    varying = [k for k in keys if k not in SEED_KEYS and len(values(k)) > 1]
    groups: dict[str, tuple[dict[str, Any], list[RunResult]]] = {}
    for run in runs:
        hparams = {k: run.config.get(k) for k in varying}
        groups.setdefault(json.dumps(hparams, sort_keys=True), (hparams, []))[1].append(run)
    return list(groups.values())


def compare(paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
            baseline: Sequence[str | os.PathLike[str]] | str | os.PathLike[str] = (),
            directions: Mapping[str, str] | None = None,
            metrics: Sequence[str] | None = None, pareto: bool = False) -> Comparison:
    """Compares finished runs and sweeps, and their Δm% against single-task baselines.

    Args:
        paths: run directories and/or sweep directories.
        baseline: single-task runs (e.g. `multihead train CONFIG --only-head y1`, one per
            head, any number of seeds) or sweeps of them; each head's baseline is the mean
            over the baseline runs that have that head.
        directions: metric name -> `min` or `max`, for metrics whose name does not say.
        metrics: the metric names Δm% is computed over, e.g. `["loss"]` or
            `["accuracy", "mae"]`; None (default): every metric the group and the baselines
            both report, losses included.
        pareto: also mark the groups on the Pareto front of the heads' mean final metrics
            (`metrics`, default each head's loss; direction-aware) and give its hypervolume
            against the baselines, else the worst group values (`Comparison.pareto`,
            `multihead.experiments.results.pareto`).

    Returns:
        A `Comparison` (plain dataclasses; `.to_dataframe()` with pandas installed).

    Raises:
        CompareError: a path is neither a finished run nor a sweep, or `metrics` names a
            metric no baseline reports (or is given without baselines).

    Example:
        >>> result = mh.compare(["runs/sweep-quickstart"], baseline=["runs/y1", "runs/y2"])  # doctest: +SKIP
        >>> print(result.format())                                                            # doctest: +SKIP
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if isinstance(baseline, (str, os.PathLike)):
        baseline = [baseline]
    for name, mode in (directions or {}).items():
        if mode not in ("min", "max"):
            raise CompareError(f"directions[{name!r}]: {mode!r}; use min or max")
    runs = [load_result(d, directions) for p in paths for d in run_dirs(p)]
    if not runs:
        raise CompareError(f"{[os.fspath(p) for p in paths]}: no finished run to compare")
    base_runs = [load_result(d, directions) for p in baseline for d in run_dirs(p)]
    base_mean = _mean_std([r.final for r in base_runs])[0] if base_runs else {}
    # Without baselines, `metrics` chooses only the front's objectives (Δm% needs baselines).
    chosen = (list(dict.fromkeys(str(m) for m in metrics)) if pareto and metrics and not base_mean
              else _chosen_metrics(metrics, base_mean))
    groups, skipped, pairs = [], [], []
    for hparams, members in group_runs(runs):
        mean, std = _mean_std([r.final for r in members])
        best_mean = _mean_std([r.best for r in members])[0]
        try:
            dm, left_out = delta_m(mean, base_mean, directions, chosen) if base_mean else (None, [])
        except DeltaMError as err:
            named = base_runs if err.side == "baseline" else members
            reporting = [r.run_dir for r in named if err.metric in r.final.get(err.head, {})]
            raise CompareError(f"{err} ({'baseline runs' if err.side == 'baseline' else 'runs'} "
                               f"{', '.join(reporting)}); leave the metric out with --metrics "
                               "(compare(metrics=...)) or rerun them") from None
        skipped += [s for s in left_out if s not in skipped]
        pairs += [p for p in delta_m_terms(mean, base_mean, directions, chosen)[0] if p not in pairs]
        groups.append(Group("", hparams, [r.run_dir for r in members], mean, std, best_mean, dm))
    groups = [dataclasses.replace(g, label=label)
              for g, label in zip(groups, group_labels([g.hparams for g in groups]))]
    front = None
    if pareto:
        try:
            front = front_of({g.label: g.mean for g in groups}, base_mean,
                             lambda metric: direction(metric, directions), chosen or ["loss"])
        except ValueError as err:
            raise CompareError(f"pareto: {err}") from None
    return Comparison(runs, groups, base_mean, skipped, pairs, chosen, front,
                      dict(directions) if directions else None)


def _chosen_metrics(metrics: Sequence[str] | None,
                    baseline: Mapping[str, Mapping[str, float]]) -> list[str] | None:
    """`compare(metrics=...)` checked against what the baselines report."""
    if metrics is None:
        return None
    chosen = list(dict.fromkeys(str(m) for m in metrics))
    if not chosen:
        raise CompareError("metrics: name at least one metric, e.g. loss")
    if not baseline:
        raise CompareError(f"metrics {chosen}: Δm% needs baselines (baseline=[...], --baseline)")
    reported = list(dict.fromkeys(m for values in baseline.values() for m in values))
    for metric in chosen:
        if metric not in reported:
            raise CompareError(f"metrics: {metric!r} is reported by no baseline{suggest(metric, reported)}; "
                               f"they report {reported}")
    return chosen


def comparison_figure(result: Comparison, metric: str = "loss") -> Any:
    """The matplotlib `Figure` of `plot_comparison` (needs matplotlib): one legend for every
    panel, below them, so it covers no curve."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    heads = list(dict.fromkeys(h for r in result.runs for h in r.curves))
    fig = Figure(figsize=(5 * max(1, len(heads)), 4), layout="constrained")
    for i, head in enumerate(heads):
        ax = fig.add_subplot(1, len(heads), i + 1)
        for group in result.groups:
            members = [r for r in result.runs if r.run_dir in group.runs and metric in r.curves.get(head, {})]
            if not members:
                continue
            steps = sorted(set.intersection(*[{s for s, _ in r.curves[head][metric]} for r in members]))
            values = np.array([[dict(r.curves[head][metric])[s] for s in steps] for r in members])
            ax.plot(steps, values.mean(axis=0), label=group.label)
            if len(members) > 1:
                ax.fill_between(steps, values.mean(axis=0) - values.std(axis=0),
                                values.mean(axis=0) + values.std(axis=0), alpha=0.2)
        if metric in result.baseline.get(head, {}):
            ax.axhline(result.baseline[head][metric], linestyle="--", color="gray", label="single-task")
        ax.set_title(f"{head}: eval {metric}")
        ax.set_xlabel("step")
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    if lines:  # the same groups in every panel: one legend, below the axes, inside the figure
        legend_below(fig, list(lines.values()), list(lines))
    return fig



def plot_comparison(result: Comparison, path: str | os.PathLike[str], metric: str = "loss",
                    pareto: bool = False) -> None:
    """A PNG with one panel per head: each group's mean eval `metric` curve over its runs
    (shaded ± std), the baseline as a dashed line; with `pareto`, the front instead
    (`pareto_figure`: one panel for two objectives, one per pair of them for more)."""
    if pareto and result.pareto is not None:
        figure = pareto_figure(result.pareto)
    else:
        figure = comparison_figure(result, metric)
    figure.savefig(os.fspath(path), dpi=100)
