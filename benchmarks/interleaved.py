"""Two revisions' own `step_throughput.py --quick` and `aggregation_cost.py --quick`, interleaved.

Each revision's benchmark scripts run against its own source tree (exported with `git
archive`, the same venv), in the order B A, A B, ... so that load on the machine reaches both
alike; `--cpu N` pins every run to one core (e.g. while other work uses the other). It
prints, per row of the two tables, the values of each run and the ratio after / before of
their means, oriented so that above 1 means the after revision is faster: steps/s of
`Trainer.step` and `fit`, `mh.step / hand-written loop (a)`, and each aggregator's steps/s
and time relative to the per-head step. The outputs of every run are kept in `--out`.

    python benchmarks/interleaved.py --before 58e7c31                     # against HEAD
    python benchmarks/interleaved.py --before 58e7c31 --rounds 2 --cpu 0 --out /tmp/bench

One round runs each script once per revision: about 25 min on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPTS = {"step_throughput": "step_throughput.py", "aggregation_cost": "aggregation_cost.py"}


def export(rev: str, scratch: str) -> str:
    """A source tree of `rev` (its `multihead` and `benchmarks` folders)."""
    out = os.path.join(scratch, rev.replace("/", "_"))
    os.makedirs(out)
    archive = subprocess.run(["git", "archive", rev, "multihead", "benchmarks"], check=True,
                             capture_output=True)
    subprocess.run(["tar", "-x", "-C", out], input=archive.stdout, check=True)
    return out


def run(tree: str, script: str, cpu: int | None, out: Path) -> str:
    """Runs `tree`'s `benchmarks/<script> --quick` with `tree` first on the path; its output."""
    command = [sys.executable, os.path.join("benchmarks", script), "--quick"]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu)] + command
    env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True)
    out.write_text(done.stdout)
    return done.stdout


def step_rows(text: str) -> dict[str, float]:
    """`step_throughput.py --quick`: mh.step steps/s and mh/(a) per K; fit steps/s."""
    rows = {}
    grid = text.split("## Step throughput")[1].split("##")[0]
    for line in grid.splitlines():
        f = line.split()
        if len(f) == 10 and f[0].isdigit():
            rows[f"step K={f[0]} steps/s"] = float(f[6])
            rows[f"step K={f[0]} mh/(a)"] = float(f[7])
    fit = text.split("## End to end")[1].split("##")[0]
    for line in fit.splitlines():
        m = re.match(r"\s*(mh\.fit spe=auto \(default\)|mh\.fit spe=20)\s+(\d+)", line)
        if m:
            rows[f"fit {m.group(1)} steps/s"] = float(m.group(2))
    return rows


def aggregation_rows(text: str) -> dict[str, float]:
    """`aggregation_cost.py --quick`: per variant, steps/s and time / per-head step, K=2, 8."""
    rows = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 7 and f[0] != "variant" and re.fullmatch(r"[0-9.]+", f[1]):
            for k, ms, relative in (("2", f[1], f[5]), ("8", f[2], f[6])):
                rows[f"{f[0]} K={k} steps/s"] = 1e3 / float(ms)
                rows[f"{f[0]} K={k} x/per_head"] = float(relative.rstrip("x"))
    return rows


PARSERS = {"step_throughput": step_rows, "aggregation_cost": aggregation_rows}


def ratios(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[tuple[str, float]]:
    """Per row, mean after / mean before, oriented so that above 1 is faster after."""
    out = []
    for key in before[0]:
        b = statistics.mean(r[key] for r in before)
        a = statistics.mean(r[key] for r in after)
        out.append((key, b / a if key.endswith("x/per_head") else a / b))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision")
    parser.add_argument("--after", default="HEAD", help="a git revision (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each script per revision")
    parser.add_argument("--cpu", type=int, help="pin every run to this core")
    parser.add_argument("--out", help="keep each run's output here (default: a temp folder)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="multihead-interleaved-"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"before": export(args.before, scratch), "after": export(args.after, scratch)}
        results: dict[str, dict[str, list[dict[str, float]]]] = {}
        for name, script in SCRIPTS.items():
            results[name] = {"before": [], "after": []}
            for r in range(args.rounds):
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                for side in order:
                    text = run(trees[side], script, args.cpu, out / f"{name}_{side}{r + 1}.txt")
                    results[name][side].append(PARSERS[name](text))
                    print(f"done {name} {side} (round {r + 1})", file=sys.stderr, flush=True)
    print(f"{args.before} (before) vs {args.after} (after); outputs in {out}")
    for name, sides in results.items():
        rows = ratios(sides["before"], sides["after"])
        print(f"\n## {name}: after / before (> 1: after faster), means of {args.rounds} runs each")
        for key, ratio in rows:
            print(f"{key:40s} {ratio:6.3f}")
        values = [r for _, r in rows]
        print(f"median {statistics.median(values):.3f}, geometric mean "
              f"{statistics.geometric_mean(values):.3f}, min {min(values):.3f}, "
              f"max {max(values):.3f} over {len(values)} rows")


if __name__ == "__main__":
    main()
