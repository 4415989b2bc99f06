"""The MMoE paper's synthetic experiment (Ma et al., KDD 2018): shared-bottom, OMoE and MMoE
at task correlations 0.5, 0.9 and 1.0, over seeds.

Each run is `multihead train experiments/mmoe_paper/<model>.yaml --set data.correlation=<c>
--set seed=<s>` (in this process, TensorBoard off); the seed draws both the data (new task
weight vectors, sinusoids and examples) and the initial weights. Two tables: the final MSE on
the training set (the paper's Figure 4 plots training loss) and on the eval set, mean of the
two tasks. Each cell is mean +- standard deviation over seeds of the MSE relative to the
constant predictor's on the same data (`metrics.json`'s `baseline`: 1 is no better than
predicting the training mean, 0 is perfect), which takes out most of the spread that comes
from each seed drawing tasks of different difficulty; the margins are MMoE's against each of
the others, paired by seed (same data): the mean over seeds of `loss_mmoe / loss_other - 1`.
`--json PATH` also writes every run's raw losses.

    python benchmarks/mmoe_paper.py              # 3 seeds, the configs' 20000 steps, 200k examples
    python benchmarks/mmoe_paper.py --seeds 5
    python benchmarks/mmoe_paper.py --quick      # 2 seeds, 300 steps: a smoke run
    python benchmarks/mmoe_paper.py --set data.train_size=10000    # any config override

The paper's findings (its Figure 4, training loss over 200 runs per setting): shared-bottom
degrades as the correlation falls; MMoE is better than both the others, and its margin over
them is largest at low correlation. docs/architectures.md compares them with a run of this.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import table, train_quietly  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("shared_bottom", "omoe", "mmoe")
CORRELATIONS = (0.5, 0.9, 1.0)
HEADS = ("y1", "y2")


def run(model: str, correlation: float, seed: int, steps: int | None, workdir: str,
        overrides: list[str] = ()) -> dict:
    """One run's final MSE on the training and eval sets and the constant predictor's, each
    the mean over the two tasks."""
    run_dir = os.path.join(workdir, f"{model}-{correlation}-{seed}")
    sets = [f"data.correlation={correlation}", f"seed={seed}", "log.tensorboard=false"]
    if steps is not None:
        sets += [f"train.steps={steps}", f"train.eval_every={steps}"]
    train_quietly(os.path.join(ROOT, "experiments", "mmoe_paper", f"{model}.yaml"), run_dir,
                  sets + list(overrides))
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    return {split: statistics.fmean(metrics[split][h]["loss"] for h in HEADS)
            for split in ("train", "eval", "baseline")}


def relative(result: dict, split: str) -> float:
    """MSE on `split` relative to the constant predictor's (the training mean) on the eval set."""
    return result[split] / result["baseline"]


def paired_margin(runs: dict, split: str, model: str, other: str, correlation: float) -> str:
    """Mean over seeds of `model`'s loss relative to `other`'s on the same seed (same data)."""
    ratios = [a[split] / b[split] - 1
              for a, b in zip(runs[(model, correlation)], runs[(other, correlation)])]
    return f"{statistics.fmean(ratios):+.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 300 steps")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per setting (default 3)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default: the configs' 20000; --quick: 300)")
    parser.add_argument("--json", default=None, help="also write every run's losses here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run (e.g. data.train_size=200000)")
    args = parser.parse_args()
    seeds = args.seeds or (2 if args.quick else 3)
    steps = args.steps or (300 if args.quick else None)
    runs: dict[tuple[str, float], list[dict]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for seed in range(seeds):  # seeds outermost: an interrupted run still covers every cell
            for correlation in CORRELATIONS:
                for model in MODELS:
                    result = run(model, correlation, seed, steps, workdir, args.set)
                    runs.setdefault((model, correlation), []).append(result)
                    print(f"  {model:13s} correlation {correlation}  seed {seed}: "
                          + "  ".join(f"{k} {v:.4f}" for k, v in result.items()),
                          file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"model": m, "correlation": c, "seed": s, **r}
                       for (m, c), rs in runs.items() for s, r in enumerate(rs)], f, indent=1)

    def cell(results: list[dict], split: str) -> str:
        values = [relative(r, split) for r in results]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):.4f} +- {spread:.4f}"

    for split, what in (("train", "training set"), ("eval", "eval set")):
        rows = [["correlation"] + list(MODELS) + ["MMoE vs shared-bottom", "MMoE vs OMoE"]]
        for c in CORRELATIONS:
            rows.append([str(c)] + [cell(runs[(m, c)], split) for m in MODELS]
                        + [paired_margin(runs, split, "mmoe", "shared_bottom", c),
                           paired_margin(runs, split, "mmoe", "omoe", c)])
        print(f"\nfinal MSE on the {what} / the constant predictor's (mean of the two tasks), "
              f"{seeds} seeds, {steps or 'the configs'} steps"
              + "".join(f", {override}" for override in args.set))
        print(table(rows))


if __name__ == "__main__":
    main()
