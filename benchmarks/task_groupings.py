"""Task groupings on data where the answer is known: two clusters of correlated tasks.

    python benchmarks/task_groupings.py                 # 3 seeds, ~15 min on 2 cores
    python benchmarks/task_groupings.py --quick         # 1 seed, fewer steps, ~3 min
    python benchmarks/task_groupings.py --seeds 0 1 2 3 --steps 4000

The MMoE generator (`data.kind: mmoe`, Ma et al. 2018) with `data.clusters: [[y1, y2],
[y3, y4]]`: the task weight vectors have cosine `--correlation` within a cluster and 0
across (the labels of the two clusters are independent). Per seed (the data seed too):

1. the all-in-one run: every head on one trunk (a small shared MLP, per-head Adam), with
   the inter-task affinities logged every `--affinity-every` steps (`log.affinity_every`);
2. `task_groupings` of its mean affinity matrix into at most 2 groups (what
   `multihead report RUN --groups 2` prints);
3. one run per proposed group (`train.only_heads`, what the `--groups-config` sweep runs),
   and a single-task baseline per head (`train --only-head`), all with the run's trunk,
   optimizers, steps and data.

It prints the mean affinity within the clusters and across them, whether the proposed
split is the clusters, and Δm% on the eval loss (`multihead.experiments.results.compare.delta_m`,
lower is better) of the all-in-one run and of the grouped runs taken together (each head
scored by the run of its group), both against the single-task baselines; then the mean ±
std over the seeds. The figures in docs/affinity.md come from this script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import yaml  # noqa: E402

import multihead as mh  # noqa: E402
from multihead.experiments.results.compare import delta_m  # noqa: E402
from _timing import table  # noqa: E402

tf.get_logger().setLevel("ERROR")  # each run traces its own evaluation: expected

HEADS = ("y1", "y2", "y3", "y4")
CLUSTERS = [["y1", "y2"], ["y3", "y4"]]


def config(seed: int, steps: int, correlation: float, affinity_every: int, width: int,
           trunk: str) -> dict:
    head = {"layers": {"mlp": {"units": [16, 1], "activation": "relu",
                               "output_activation": "linear"}},
            "loss": "mse", "optimizer": {"class_name": "Adam", "config": {"learning_rate": 1e-3}}}
    return {
        "seed": seed,
        "data": {"kind": "mmoe", "correlation": correlation, "clusters": CLUSTERS,
                 "train_size": 8000, "eval_size": 2000},
        "model": {"trunk": {"mlp": {"units": [width], "activation": "relu"}},
                  "heads": {h: head for h in HEADS}},
        "train": {"steps": steps, "batch_size": 128, "steps_per_execution": "auto",
                  "trunk": trunk if trunk == "per_head" else
                  {"aggregator": trunk, "optimizer": {"class_name": "Adam",
                                                      "config": {"learning_rate": 1e-3}}}},
        "log": {"every": 100, "histograms_every": 0, "affinity_every": affinity_every},
        "checkpoint": {"every": 0},
    }


def train(path: str, run_dir: str, overrides: list[str]) -> dict:
    result = mh.run_experiment(path, run_dir=run_dir, overrides=overrides, quiet=True)
    if result.exit_code != 0:
        raise SystemExit(f"run {run_dir} failed: {result.message}")
    return result.metrics


def eval_loss(metrics: dict, heads) -> dict[str, dict[str, float]]:
    return {h: {"loss": metrics["eval"][h]["loss"]} for h in heads}


def one_seed(seed: int, args: argparse.Namespace, tmp: str) -> dict:
    path = os.path.join(tmp, f"clusters-{seed}.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(config(seed, args.steps, args.correlation, args.affinity_every, args.width,
                              args.trunk), fh)
    everyone = train(path, os.path.join(tmp, f"all-{seed}"), [])
    z = everyone["affinity"]
    within = [z[i][j] for c in CLUSTERS for i in c for j in c if i != j]
    across = [z[i][j] for i in HEADS for j in HEADS
              if not any(i in c and j in c for c in CLUSTERS)]
    grouping = mh.task_groupings(z, 2)
    groups = [list(g.heads) for g in grouping.groups]
    grouped: dict[str, dict[str, float]] = {}
    for n, group in enumerate(groups):
        run = train(path, os.path.join(tmp, f"group{n}-{seed}"),
                    [f"train.only_heads=[{', '.join(group)}]", "log.affinity_every=0"])
        grouped.update(eval_loss(run, group))
    single: dict[str, dict[str, float]] = {}
    for head in HEADS:
        run = train(path, os.path.join(tmp, f"single-{head}-{seed}"),
                    [f"train.only_heads=[{head}]", "log.affinity_every=0"])
        single.update(eval_loss(run, [head]))
    return {"within": statistics.mean(within), "across": statistics.mean(across),
            "groups": groups, "recovered": sorted(groups) == sorted(CLUSTERS),
            "all": delta_m(eval_loss(everyone, HEADS), single)[0],
            "grouped": delta_m(grouped, single)[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 1000 steps")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--correlation", type=float, default=0.9,
                        help="cosine of the task weight vectors within a cluster")
    parser.add_argument("--affinity-every", type=int, default=10)
    parser.add_argument("--width", type=int, default=16, help="units of the one-layer trunk")
    parser.add_argument("--trunk", default="sum",
                        help="sum (default): one trunk Adam on the summed gradients, so every run "
                             "takes one trunk step per step whatever its heads; per_head: each "
                             "head's Adam updates the trunk (K trunk steps per step); or another "
                             "aggregator")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 1000
    print(f"mmoe data, clusters {CLUSTERS} (cosine {args.correlation} within, 0 across); trunk "
          f"Dense({args.width}) relu, heads Dense(16)-Dense(1), Adam 1e-3, batch 128, "
          f"{args.steps} steps; affinity every {args.affinity_every} steps", file=sys.stderr)
    rows = [["seed", "affinity within", "affinity across", "proposed groups", "= clusters",
             "Δm% all-in-one", "Δm% grouped"]]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            r = one_seed(seed, args, tmp)
            results.append(r)
            rows.append([str(seed), f"{r['within']:+.2e}", f"{r['across']:+.2e}",
                         " | ".join(", ".join(g) for g in r["groups"]), str(r["recovered"]),
                         f"{r['all']:+.2f}", f"{r['grouped']:+.2f}"])
    if len(results) > 1:
        def mean_std(key: str, fmt: str) -> str:
            values = [r[key] for r in results]
            return f"{statistics.mean(values):{fmt}} ± {statistics.pstdev(values):{fmt[1:]}}"

        rows.append(["mean ± std", mean_std("within", "+.2e"), mean_std("across", "+.2e"), "",
                     f"{sum(r['recovered'] for r in results)}/{len(results)}",
                     mean_std("all", "+.2f"), mean_std("grouped", "+.2f")])
    print(table(rows))


if __name__ == "__main__":
    main()
