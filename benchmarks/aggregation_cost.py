"""Step time of each trunk aggregator relative to the summed-loss step and the per-head step.

The model is TF-NOTES.md's: trunk Dense 64->256->256 relu, K Dense(1) heads,
batch 256, Adam everywhere, no XLA. Side by side in one run, for K = 2, 4, 8:

  summed     hand-written `tf.function`: one tape, sum of the K losses, one Adam
             on every variable (one backward pass; the lower bound);
  per_head   `mh.Trainer` default: K `tape.gradient` calls, K Adams on trunk + head;
  <name>     `mh.Trainer(trunk=TrunkPolicy(aggregator=<name>))`, every gradient
             aggregator and loss weighting: K parameter-space trunk gradients, the
             aggregator, one trunk Adam, K head Adams (upgrad/dualproj: K <= 12);
  <name>+rep `rep_grad=True`: K gradients at the trunk output, one trunk backward.

The Trainer variants are timed through their compiled step (the same
`tf.function` `Trainer.step` calls, without its per-step Python checks and
float conversions), so every variant is one `tf.function` call per step.
Timings are medians over repeats, the variants timed round-robin within each
repeat so that load from other processes hits them alike. The machine is
shared: read the ratios, not the milliseconds.

    python benchmarks/aggregation_cost.py            # K = 2, 4, 8, 16; 25 repeats of 20 steps
    python benchmarks/aggregation_cost.py --ks 2,4,8,16 --repeats 5 --calls 5   # reduced
    python benchmarks/aggregation_cost.py --quick    # K = 2, 8; 9 repeats of 10 steps
    python benchmarks/aggregation_cost.py --ks 2,4 --methods cagrad,famo --repeats 41   # a rerun
    python benchmarks/aggregation_cost.py --methods moco,db_mtl,excess_mtl   # these (+ the baselines) only

The load average (`os.getloadavg`) is printed before and after: figures from a
loaded machine are worth less, whatever the ratios say.

`--results` instead trains every `experiments/aggregation_*.yaml` (MMoE synthetic
data at task correlation 0.1; only the trunk update differs) for seeds 0, 1, 2
with the config builders and `Trainer(trunk=build_trunk(config))`, and prints
the final eval MSE of each head and their mean (`--quick`: 500 steps, seed 0):

    python benchmarks/aggregation_cost.py --results
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402
import _timing  # noqa: E402
from multihead.step.trunk_policy import TRUNK_AGGREGATORS  # noqa: E402

IN_DIM, WIDTH, BATCH = 64, 256, 256
#: Every method `TrunkPolicy` accepts, in parameter space.
PARAM_SPACE = list(TRUNK_AGGREGATORS)
REP_GRAD = ["mean", "mgda", "imtl"]
LOSS_WEIGHTINGS = ("uncertainty", "gradnorm", "dwa", "gls", "stch", "imtl_l", "famo", "rlw")


def options_for(name: str, k: int) -> dict | None:
    """The options a method needs at K heads; None where it does not run at K."""
    if name in ("upgrad", "dualproj") and k > 12:
        return None                          # exact active-set solvers: K <= 12
    if name == "weights":
        return {"weights": [1.0 + i for i in range(k)]}
    if name == "epo":
        return {"preference": [1.0 + i for i in range(k)]}
    if name == "krum":
        return {"n_byzantine": 0}
    if name == "trimmed_mean":
        return {"trim_number": (k - 1) // 2 and 1}
    return {}


def make_model(k: int, seed: int = 0) -> mh.MultiHeadModel:
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(WIDTH, activation="relu"),
                                keras.layers.Dense(WIDTH, activation="relu")]),
        heads={f"h{i}": keras.layers.Dense(1) for i in range(k)},
    )
    model.build((None, IN_DIM))
    return model


def make_batch(k: int) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((BATCH, IN_DIM)), tf.float32)
    return x, {f"h{i}": tf.constant(rng.standard_normal((BATCH, 1)), tf.float32) for i in range(k)}


def summed_step(k: int):
    return _timing.summed_step(make_model(k))


def trainer_step(k: int, trunk):
    model = make_model(k)
    trainer = mh.Trainer(model, {f"h{i}": mh.Objective("mse", keras.optimizers.Adam(1e-3))
                                 for i in range(k)}, trunk=trunk)
    return trainer._runner.ensure_built(None)  # noqa: SLF001 - the compiled step Trainer.step calls


def time_per_call(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        result = fn(*args)
    tf.nest.flatten(result)[0].numpy()  # wait for the last step
    return (time.perf_counter() - start) / calls


def run(k: int, calls: int, repeats: int, methods: list[str] | None = None) -> dict[str, float]:
    variants = {"summed": summed_step(k), "per_head": trainer_step(k, "per_head")}
    for name in PARAM_SPACE:
        options = options_for(name, k)
        if options is not None and (methods is None or name in methods):
            variants[name] = trainer_step(
                k, mh.TrunkPolicy(keras.optimizers.Adam(1e-3), name, options))
    for name in REP_GRAD:
        if methods is None or f"{name}+rep" in methods:
            variants[f"{name}+rep"] = trainer_step(
                k, mh.TrunkPolicy(keras.optimizers.Adam(1e-3), name, rep_grad=True))
    x, y = make_batch(k)
    for fn in variants.values():  # trace and warm up
        time_per_call(fn, (x, y), 3)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            samples[name].append(time_per_call(fn, (x, y), calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def train_results(quick: bool) -> None:
    """Final eval MSE of every experiments/aggregation_*.yaml config, per seed."""
    import glob

    from multihead.experiments.build.builders import build_data, build_model, build_objectives, build_trunk
    from multihead.experiments.config.schema import load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sorted(glob.glob(os.path.join(root, "experiments", "aggregation_*.yaml")))
    seeds = [0] if quick else [0, 1, 2]
    print("final eval MSE (y1, y2; mean of the heads)")
    for path in paths:
        cells, means = [], []
        for seed in seeds:
            overrides = [f"seed={seed}"] + (["train.steps=500"] if quick else [])
            config = load_config(path, overrides)
            keras.utils.set_random_seed(config.seed)
            data = build_data(config)
            model = build_model(config, (None,) + data.x_train.shape[1:])
            trainer = mh.Trainer(model, build_objectives(config), schedule=config.train.schedule,
                                 trunk=build_trunk(config))
            history = trainer.fit(data.train, config.train.steps,
                                  batch_size=config.train.batch_size, eval_data=data.eval,
                                  verbose=False, seed=config.seed)
            losses = [history.eval[-1][1][h]["loss"] for h in model.head_names]
            cells.append("/".join(f"{v:.4f}" for v in losses))
            means.append(sum(losses) / len(losses))
        name = os.path.basename(path)
        print(f"{name:32s} " + "  ".join(f"seed {s}: {c} ({m:.3f})" for s, c, m in
                                          zip(seeds, cells, means))
              + f"  mean {statistics.mean(means):.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 2, 8; fewer repeats")
    parser.add_argument("--results", action="store_true",
                        help="train the experiments/aggregation_*.yaml configs and print eval MSE")
    parser.add_argument("--ks", help="comma-separated numbers of heads (default 2,4,8,16)")
    parser.add_argument("--calls", type=int, help="steps per timing")
    parser.add_argument("--repeats", type=int, help="repeats (median)")
    parser.add_argument("--methods", help="comma-separated variants to time besides summed and "
                        "per_head (`mgda`, `mgda+rep`, ...; default: all)")
    args = parser.parse_args(argv)
    if args.results:
        train_results(args.quick)
        return 0
    ks, calls, repeats = ((2, 8), 10, 9) if args.quick else ((2, 4, 8, 16), 20, 25)
    if args.ks:
        ks = tuple(int(k) for k in args.ks.split(","))
    calls, repeats = args.calls or calls, args.repeats or repeats
    methods = args.methods.split(",") if args.methods else None
    known = PARAM_SPACE + [f"{n}+rep" for n in REP_GRAD]
    unknown = sorted(set(methods or ()) - set(known))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {known}")
    load_before = os.getloadavg()
    results = {}
    for k in ks:
        results[k] = run(k, calls, repeats, methods)
        print(f"K={k} done", file=sys.stderr, flush=True)
    names = list(dict.fromkeys(n for k in ks for n in results[k]))
    header = ["variant"] + [f"K={k} ms" for k in ks] + [f"K={k} /summed" for k in ks] + \
        [f"K={k} /per_head" for k in ks]
    rows = [header]
    for name in names:
        rows.append([name]
                    + [f"{results[k][name] * 1e3:.2f}" if name in results[k] else "-" for k in ks]
                    + [f"{results[k][name] / results[k]['summed']:.2f}x" if name in results[k]
                       else "-" for k in ks]
                    + [f"{results[k][name] / results[k]['per_head']:.2f}x" if name in results[k]
                       else "-" for k in ks])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    load = " / ".join(f"{a:.1f}" for a in load_before), " / ".join(f"{a:.1f}" for a in os.getloadavg())
    print(f"step time, median of {repeats} repeats x {calls} steps; trunk {IN_DIM}->{WIDTH}->"
          f"{WIDTH} relu, Dense(1) heads, batch {BATCH}, Adam, {os.cpu_count()} CPUs; "
          f"load average (1/5/15 min) {load[0]} before, {load[1]} after")
    for row in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    k = ks[-1]
    reps = [(results[k][f"{n}+rep"] / results[k]["summed"], n) for n in REP_GRAD
            if f"{n}+rep" in results[k]]
    if reps:
        rep, rep_name = max(reps)
        print(f"\nK={k}: slowest rep_grad aggregator ({rep_name}) {rep:.2f}x the summed-loss step")
    goals = {"nash_mtl": 1.5, **{n: 1.05 for n in LOSS_WEIGHTINGS}}
    for kk in ks:
        missed = [f"{n} {results[kk][n] / results[kk]['per_head']:.2f}x"
                  for n in PARAM_SPACE if n in results[kk]
                  and results[kk][n] / results[kk]["per_head"] > goals.get(n, 1.15)]
        print(f"K={kk}: over the goal (gradient aggregators 1.15x, Nash-MTL 1.5x, loss "
              f"weightings 1.05x the per-head step): {', '.join(missed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
