"""The MMoE paper's synthetic experiment (Ma et al., KDD 2018): shared-bottom, OMoE and MMoE
at task correlations 0.5, 0.9 and 1.0, over seeds.

Each run is `multihead train experiments/mmoe_paper/<model>.yaml --set data.correlation=<c>
--set seed=<s>` (in this process, TensorBoard off); the seed draws both the data (new task
weight vectors and examples) and the initial weights. The table shows the final eval MSE,
mean of the two tasks, as mean +- standard deviation over seeds (the spread is mostly the
data's: each seed draws new tasks), and MMoE's margin over each of the others, paired by
seed (same data): the mean over seeds of `loss_mmoe / loss_other - 1`.

    python benchmarks/mmoe_paper.py              # 3 seeds, the configs' 3000 steps
    python benchmarks/mmoe_paper.py --seeds 5 --steps 20000
    python benchmarks/mmoe_paper.py --quick      # 2 seeds, 300 steps: a smoke run

The paper's findings (its Figure 4, training loss over 200 runs per setting): shared-bottom
degrades as the correlation falls; MMoE is better than both the others, and its margin over
them is largest at low correlation. docs/architectures.md compares them with a run of this.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("shared_bottom", "omoe", "mmoe")
CORRELATIONS = (0.5, 0.9, 1.0)


def run(model: str, correlation: float, seed: int, steps: int | None, workdir: str) -> float:
    """Final eval MSE, mean over the two tasks, of one run."""
    from multihead.experiments.cli import main

    run_dir = os.path.join(workdir, f"{model}-{correlation}-{seed}")
    args = ["train", os.path.join(ROOT, "experiments", "mmoe_paper", f"{model}.yaml"),
            "--run-dir", run_dir, "--quiet", "--set", f"data.correlation={correlation}",
            "--set", f"seed={seed}", "--set", "log.tensorboard=false"]
    if steps is not None:
        args += ["--set", f"train.steps={steps}", "--set", f"train.eval_every={steps}"]
    with contextlib.redirect_stdout(io.StringIO()):  # each run's own summary table
        code = main(args)
    if code != 0:
        raise SystemExit(f"run failed: {' '.join(args)}")
    with open(os.path.join(run_dir, "metrics.json")) as f:
        evals = json.load(f)["eval"]
    return statistics.fmean(evals[h]["loss"] for h in ("y1", "y2"))


def paired_margin(losses: dict, model: str, other: str, correlation: float) -> str:
    """Mean over seeds of MMoE's loss relative to `other`'s on the same seed (same data)."""
    ratios = [a / b - 1 for a, b in zip(losses[(model, correlation)], losses[(other, correlation)])]
    return f"{statistics.fmean(ratios):+.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 300 steps")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per setting (default 3)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default: the configs' 3000; --quick: 300)")
    args = parser.parse_args()
    seeds = args.seeds or (2 if args.quick else 3)
    steps = args.steps or (300 if args.quick else None)
    losses: dict[tuple[str, float], list[float]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for correlation in CORRELATIONS:
            for model in MODELS:
                for seed in range(seeds):
                    loss = run(model, correlation, seed, steps, workdir)
                    losses.setdefault((model, correlation), []).append(loss)
                    print(f"  {model:13s} correlation {correlation}  seed {seed}: {loss:.4f}",
                          file=sys.stderr, flush=True)

    def cell(values: list[float]) -> str:
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):.4f} +- {spread:.4f}"

    rows = [["correlation"] + list(MODELS) + ["MMoE vs shared-bottom", "MMoE vs OMoE"]]
    for c in CORRELATIONS:
        rows.append([str(c)] + [cell(losses[(m, c)]) for m in MODELS]
                    + [paired_margin(losses, "mmoe", "shared_bottom", c),
                       paired_margin(losses, "mmoe", "omoe", c)])
    print(f"final eval MSE (mean of the two tasks), {seeds} seeds, "
          f"{steps or 'the configs'} steps")
    print(table(rows))


if __name__ == "__main__":
    main()
