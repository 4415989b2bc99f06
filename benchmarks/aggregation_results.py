"""Every trunk-aggregation method against single-task training: per-head eval metrics and Δm%.

For each dataset, trains over seeds 0..S-1:
- the single-task baselines: `multihead train CONFIG --only-head HEAD`, one per head;
- `per_head` (no aggregation: each head's optimizer updates trunk + its own head);
- every method of `multihead.step.trunk_policy.TRUNK_AGGREGATORS` (the gradient aggregators of
  `multihead.AGGREGATORS` and the loss weightings of
  `multihead.LOSS_WEIGHTINGS`, read at run time, so methods added
  to the registries are included), as `--set train.trunk={optimizer: Adam(1e-3), aggregator:
  NAME, options: ...}`.

Every run is `multihead train CONFIG --set seed=S --set train.steps=N ...`, run in this
process (one TensorFlow import). The seed draws the data, the initial weights and the batch
order; for a given seed the data are the same for every method and baseline, so Δm% is
paired. The table is built by `multihead.experiments.results.compare`: per head the mean ± std (ddof
0) over seeds of the final eval metric, and

    Δm% = 100 / N · Σ_i s_i · (M_i − B_i) / B_i

(`compare.delta_m`, Maninis et al. 2019) over the heads' primary metric (synthetic: MSE, the
loss; MultiDigits: accuracy), M_i the method's mean over seeds and B_i the single-task mean
(the same as `multihead compare` restricted to that metric). "per-seed Δm%" is each seed's
Δm% against that seed's own baselines, mean ± std over seeds (the seeds' data differ in how
hard they are, and the Δm% of the means weighs the hard seed most). The last column is the method's
Δm% minus `per_head`'s on the same seed, mean ± std over seeds (paired: the seed-to-seed
spread of the data cancels).

    python benchmarks/aggregation_results.py --out /tmp/agg-results              # both, 3 seeds
    python benchmarks/aggregation_results.py --dataset synthetic --methods sum,pcgrad --out DIR
    python benchmarks/aggregation_results.py --quick --out DIR                    # smoke run
    python benchmarks/aggregation_results.py --report-only --out DIR   # the table of what finished

Runs already finished in `--out` (a `metrics.json` there) are not trained again, so a stopped
run resumes; several invocations can work through one `--out` at once (each run is claimed by
a `<run dir>.lock` file; `--report-only` at the end tabulates everything). Results
go to `OUT/results.json` (or `OUT/results-<dataset>.json`), the markdown table to stdout,
progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One benchmark problem: a two-head config and the metric its table shows."""

    config: str    # relative to the repository root
    metric: str    # the primary eval metric per head (Δm% is over these)
    label: str     # its name in the table
    steps: int     # default training steps


DATASETS = {
    # The MMoE synthetic tasks at task correlation 0.1 (low: conflicting tasks). The config
    # is per_head; the methods replace train.trunk.
    "synthetic": Dataset("experiments/aggregation_per_head.yaml", "loss", "MSE", 1000),
    "multidigits": Dataset("experiments/multidigits.yaml", "accuracy", "accuracy", 300),
}
#: Options a method cannot run without, for K heads. `weights` with equal weights is `sum`;
#: `krum` with f = 0 and `trimmed_mean` with t = 0 are what K = 2 allows.
REQUIRED_OPTIONS = {
    "weights": lambda k: {"weights": [1.0] * k},
    "krum": lambda k: {"n_byzantine": 0},
    "trimmed_mean": lambda k: {"trim_number": 0},
    "epo": lambda k: {"preference": [1.0] * k},  # the equal-preference point of the front
}
ERROR_FILE = "error.txt"
TRUNK_OPTIMIZER = "{class_name: Adam, config: {learning_rate: 1.0e-3}}"


def all_methods() -> list[str]:
    """`per_head`, then every trunk aggregator and loss weighting the registries hold now."""
    from multihead.step.trunk_policy import TRUNK_AGGREGATORS

    return ["per_head"] + list(TRUNK_AGGREGATORS)


def method_overrides(method: str, num_heads: int) -> list[str]:
    """The `--set` overrides that select `method` on a config."""
    if method == "per_head":
        return ["train.trunk=per_head"]
    options = REQUIRED_OPTIONS.get(method, lambda k: {})(num_heads)
    trunk = {"optimizer": "@OPT@", "aggregator": method}
    if options:
        trunk["options"] = options
    value = json.dumps(trunk).replace('"@OPT@"', TRUNK_OPTIMIZER)
    return [f"train.trunk={value}", "train.schedule=simultaneous"]


def _train(args: list[str]) -> str | None:
    """Runs `multihead train ARGS` in this process; None, or the error it reported."""
    from multihead.cli.main import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(args)
    except Exception as exc:  # noqa: BLE001 -- a crash is a result: recorded, the rest run on
        return f"{type(exc).__name__}: {exc}"
    if code != 0:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {code}"
    return None


def _finished(run_dir: str) -> str | None:
    """None when `run_dir` holds a finished run with finite final metrics, else why not."""
    path = os.path.join(run_dir, "metrics.json")
    if not os.path.isfile(path):
        return "no metrics.json"
    with open(path, encoding="utf-8") as fh:
        final = json.load(fh).get("eval") or {}
    values = [v for head in final.values() if isinstance(head, dict) for v in head.values()]
    if not values:
        return "no final evaluation"
    if not all(math.isfinite(float(v)) for v in values):
        return f"non-finite final eval metrics {final}"
    return None


#: What `run_one` returns for a run another process is training now.
BUSY = "busy"


def _lock(run_dir: str) -> bool:
    """Claims `run_dir` for this process (a `<run_dir>.lock` file holding the pid); False when
    a live process holds it. A lock left by a dead process is taken over."""
    path = run_dir + ".lock"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(path, encoding="utf-8") as fh:
                    pid = int(fh.read().strip() or 0)
                os.kill(pid, 0)
                return False  # alive: its run
            except (ProcessLookupError, ValueError, FileNotFoundError):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
                continue
            except PermissionError:  # alive, another user's
                return False
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True
    return False


def run_one(config: str, run_dir: str, overrides: list[str], only_head: str | None = None) -> str | None:
    """Trains one run unless `run_dir` already holds it; None, `BUSY` (another process is
    training it), or the error (also written to `run_dir/error.txt`, where `--report-only`
    finds it). Several processes can work through one `--out` at once."""
    if _finished(run_dir) is None:
        return None
    if not _lock(run_dir):
        return BUSY
    try:
        if _finished(run_dir) is None:  # finished by another process since the first look
            return None
        if os.path.exists(run_dir):  # a run stopped half-way or failed before: start it again
            import shutil

            shutil.rmtree(run_dir)
        args = ["train", config, "--run-dir", run_dir, "--quiet"]
        for item in overrides:
            args += ["--set", item]
        if only_head:
            args += ["--only-head", only_head]
        error = _train(args) or _finished(run_dir)
        if error:
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, ERROR_FILE), "w", encoding="utf-8") as fh:
                fh.write(error + "\n")
        return error
    finally:
        os.remove(run_dir + ".lock")


def _error(run_dir: str) -> str:
    """Why `run_dir` holds no finished run: its recorded error, or `not run`."""
    path = os.path.join(run_dir, ERROR_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    return "not run"


def _primary(tree: dict[str, dict[str, float]], metric: str) -> dict[str, dict[str, float]]:
    return {head: {metric: values[metric]} for head, values in tree.items() if metric in values}


def summarise(out: str, name: str, dataset: Dataset, heads: list[str], methods: list[str],
              seeds: list[int]) -> dict[str, Any]:
    """Per method: mean ± std per head and Δm% (multihead's compare), from the run dirs
    (a seed without a finished run is listed in `errors` with why)."""
    from multihead.experiments.results.compare import compare, delta_m

    root = os.path.join(out, name)
    base_dirs = {s: [os.path.join(root, f"single-{h}", f"seed{s}") for h in heads] for s in seeds}
    base_ok = {s: [d for d in dirs if _finished(d) is None] for s, dirs in base_dirs.items()}
    summary: dict[str, Any] = {"config": dataset.config, "metric": dataset.metric, "heads": heads,
                               "seeds": seeds, "methods": {}}
    every_base = [d for s in seeds for d in base_ok[s]]
    if not every_base:
        summary["baseline"] = None
        return summary
    # Baselines: each head's own single-task runs, grouped by compare like any other runs.
    base = {}
    for head in heads:
        dirs = [d for s in seeds for d in base_ok[s]
                if os.path.basename(os.path.dirname(d)) == f"single-{head}"]
        if dirs:
            (group,) = compare(dirs).groups
            base[head] = {"mean": group.mean[head][dataset.metric], "std": group.std[head][dataset.metric],
                          "n": len(group.runs)}
    summary["baseline"] = base
    for method in methods:
        dirs = {s: os.path.join(root, method, f"seed{s}") for s in seeds}
        ok = {s: d for s, d in dirs.items() if _finished(d) is None}
        entry: dict[str, Any] = {"errors": {str(s): _error(d) for s, d in dirs.items() if s not in ok},
                                 "runs": list(ok.values())}
        if ok:
            # The baselines of the seeds this method finished: the same data as its runs.
            result = compare(list(ok.values()), baseline=[d for t in ok for d in base_ok[t]])
            (group,) = result.groups
            mean, std = _primary(group.mean, dataset.metric), _primary(group.std, dataset.metric)
            entry["mean"] = {h: mean[h][dataset.metric] for h in heads}
            entry["std"] = {h: std[h][dataset.metric] for h in heads}
            entry["delta_m"] = delta_m(mean, _primary(result.baseline, dataset.metric))[0]
            per_seed = {}
            for s, d in ok.items():
                if len(base_ok[s]) == len(heads):  # paired: this seed's baselines of every head
                    seeded = compare([d], baseline=base_ok[s])
                    per_seed[str(s)] = delta_m(_primary(seeded.groups[0].mean, dataset.metric),
                                               _primary(seeded.baseline, dataset.metric))[0]
            entry["delta_m_per_seed"] = per_seed
            values = list(per_seed.values())
            entry["delta_m_seed_mean"] = float(np.mean(values)) if values else None
            entry["delta_m_seed_std"] = float(np.std(values)) if values else None
        summary["methods"][method] = entry
    # Against per_head, paired by seed: a method's Δm% minus per_head's on the same seed
    # (same data, same initial weights), so the spread between seeds' data cancels.
    reference = summary["methods"].get("per_head", {}).get("delta_m_per_seed", {})
    for method, entry in summary["methods"].items():
        diffs = [value - reference[s] for s, value in entry.get("delta_m_per_seed", {}).items()
                 if s in reference]
        if method != "per_head" and diffs:
            entry["vs_per_head"] = {"mean": float(np.mean(diffs)), "std": float(np.std(diffs)),
                                    "n": len(diffs)}
    return summary


def _fmt(value: float, spread: float | None) -> str:
    return f"{value:.4f}" + (f" ± {spread:.4f}" if spread is not None else "")


def markdown(summary: dict[str, Any], name: str, steps: int) -> str:
    """The results table of one dataset, as markdown."""
    heads, metric = summary["heads"], summary["metric"]
    label = DATASETS[name].label if name in DATASETS else metric
    lines = [(f"{name} ({summary['config']}, {steps} steps, seeds {summary['seeds']}): "
              f"final eval {label} per head, mean ± std over seeds; Δm% over the heads' {label}: "
              f"of the means over seeds (multihead compare), and each seed's against that seed's "
              f"baselines (mean ± std)"), "",
             "| method | " + " | ".join(f"{h} {label}" for h in heads)
             + " | Δm% | per-seed Δm% | Δm% − per_head's |",
             "|---|" + "---|" * (len(heads) + 3)]
    base = summary.get("baseline") or {}
    lines.append("| single-task | " + " | ".join(
        _fmt(base[h]["mean"], base[h]["std"]) if h in base else "failed" for h in heads) + " | 0 | | |")
    for method, entry in summary["methods"].items():
        if "mean" not in entry:
            error = next(iter(entry["errors"].values()), "not run").replace("|", "\\|")
            error = error if error == "not run" else f"failed: {error}"
            lines.append(f"| {method} | " + " | ".join("-" for _ in heads) + f" | {error} | | |")
            continue
        dm, seed_mean = entry["delta_m"], entry["delta_m_seed_mean"]
        dm_cell = "-" if dm is None else f"{dm:+.2f}"
        seed_cell = "-" if seed_mean is None else f"{seed_mean:+.2f} ± {entry['delta_m_seed_std']:.2f}"
        failed = (f" (seeds {', '.join(entry['errors'])}: {next(iter(entry['errors'].values()))})"
                  if entry["errors"] else "")
        paired = entry.get("vs_per_head")
        paired_cell = f"{paired['mean']:+.2f} ± {paired['std']:.2f}" if paired else ""
        cells = [_fmt(entry["mean"][h], entry["std"][h]) for h in heads]
        cells += [dm_cell + failed, seed_cell, paired_cell]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("synthetic", "multidigits", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--steps", type=int, help="training steps per run (default: synthetic "
                        f"{DATASETS['synthetic'].steps}, multidigits {DATASETS['multidigits'].steps})")
    parser.add_argument("--methods", help="comma-separated methods (default: per_head and every "
                        "registered aggregator and loss weighting)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every run (e.g. data.train_size=512)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 100 steps, 4 methods: a smoke run")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: the table of the runs already finished in --out")
    parser.add_argument("--out", required=True, help="directory for the runs and results JSON")
    args = parser.parse_args(argv)

    from multihead.experiments.config.schema import load_config

    names = ["synthetic", "multidigits"] if args.dataset == "both" else [args.dataset]
    known = all_methods()
    methods = args.methods.split(",") if args.methods else (
        ["per_head", "sum", "pcgrad", "famo"] if args.quick else known)
    unknown = [m for m in methods if m not in known]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {known}")
    seeds = list(range(1 if args.quick and args.seeds == 3 else args.seeds))
    os.makedirs(args.out, exist_ok=True)
    results, tables = {}, []
    for name in names:
        dataset = DATASETS[name]
        steps = args.steps or (100 if args.quick else dataset.steps)
        config = os.path.join(ROOT, dataset.config)
        heads = list(load_config(config, args.set).model.heads)
        common = [f"train.steps={steps}", f"train.eval_every={steps}", "log.tensorboard=false",
                  "checkpoint.every=0"] + args.set
        settings_path = os.path.join(args.out, name, "settings.json")
        settings = {"config": dataset.config, "steps": steps, "set": args.set}
        if os.path.isfile(settings_path):
            with open(settings_path, encoding="utf-8") as fh:
                previous = json.load(fh)
            if previous != settings:
                parser.error(f"--out {args.out}: {name} holds runs made with {previous}, not "
                             f"{settings}; use another --out")
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        with open(settings_path, "w", encoding="utf-8") as fh:
            json.dump(settings, fh)
        jobs = [(f"single-{h}", h, s) for s in seeds for h in heads] + \
               [(m, None, s) for s in seeds for m in methods]
        for i, (label, head, seed) in enumerate(jobs):
            run_dir = os.path.join(args.out, name, label, f"seed{seed}")
            overrides = common + [f"seed={seed}"] + (
                [] if head else method_overrides(label, len(heads)))
            if args.report_only:
                continue
            start = time.perf_counter()
            error = run_one(config, run_dir, overrides, only_head=head)
            status = "ok" if not error else "skipped: another process is training it" \
                if error == BUSY else f"FAILED {error}"
            print(f"[{time.strftime('%H:%M:%S')}] {name} {i + 1}/{len(jobs)} {label} seed {seed}: "
                  f"{status} ({time.perf_counter() - start:.1f} s)",
                  file=sys.stderr, flush=True)
        summary = summarise(args.out, name, dataset, heads, methods, seeds)
        summary["steps"] = steps
        summary["command_overrides"] = common
        results[name] = summary
        tables.append(markdown(summary, name, steps))
    suffix = "" if args.dataset == "both" else f"-{args.dataset}"
    with open(os.path.join(args.out, f"results{suffix}.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
