"""ESMM's finding on generated impressions: pCVR learnt on the entire space (ESMM) against
pCVR learnt in the click space (a naive CVR head, shared-bottom CTR + CVR), over seeds.

Each run is `multihead train experiments/esmm/<model>.yaml --set seed=<s>` (in this process,
TensorBoard off); the seed draws the impressions (data kind `esmm`) and the initial weights.
Every model's pCVR head is then scored on ALL eval impressions against the conversion
probability the generator knows there (`Impressions.p_cvr`; a conversion is only observed
after a click, the probability exists on every impression):

- AUC: the AUC against conversions drawn from the known pCVR on every impression, in
  expectation: each impression counts as a positive with weight pCVR and as a negative with
  weight 1 - pCVR (`keras.metrics.AUC` with sample weights). The known pCVR itself scores the
  ceiling, printed as `oracle`.
- calibration: mean predicted pCVR / mean known pCVR over all impressions (1 is calibrated).
- excess log-loss: the mean log-loss of the prediction against the known probability minus
  that of the known probability itself (the KL divergence; 0 is perfect).

Cells are mean +- standard deviation over seeds; the finding (Ma et al., SIGIR 2018, Table 2:
ESMM's pCVR beats the click-space models' on AUC) is checked paired by seed: ESMM's AUC minus
the naive model's on the same data.

    python benchmarks/esmm.py              # 3 seeds, the configs' 2000 steps, 100k impressions
    python benchmarks/esmm.py --seeds 5
    python benchmarks/esmm.py --quick      # 3 seeds, 200 steps: a smoke run
    python benchmarks/esmm.py --set data.options.click_rate=0.02    # any config override
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

import numpy as np  # noqa: E402

from _timing import table, train_quietly  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("naive_cvr", "shared_bottom", "esmm")
#: Thresholds of `keras.metrics.AUC`: its AUC is a Riemann sum over them.
AUC_THRESHOLDS = 2000


def soft_auc(p: np.ndarray, q: np.ndarray) -> float:
    """Expected AUC of the scores `q` against labels drawn as Bernoulli(`p`): every example is
    a positive of weight `p` and a negative of weight `1 - p`."""
    import keras

    p, q = np.ravel(p).astype(np.float32), np.ravel(q).astype(np.float32)
    auc = keras.metrics.AUC(num_thresholds=AUC_THRESHOLDS)
    auc.update_state(np.concatenate([np.ones_like(p), np.zeros_like(p)]), np.concatenate([q, q]),
                     sample_weight=np.concatenate([p, 1.0 - p]))
    return float(auc.result())


def calibration(p: np.ndarray, q: np.ndarray) -> float:
    """Mean predicted probability / mean known probability."""
    return float(np.mean(q, dtype=np.float64) / np.mean(p, dtype=np.float64))


def excess_log_loss(p: np.ndarray, q: np.ndarray, eps: float = 1e-7) -> float:
    """Mean over examples of KL(Bernoulli(p) || Bernoulli(q)), q clipped to [eps, 1 - eps]."""
    p = np.asarray(p, np.float64)
    q = np.clip(np.asarray(q, np.float64), eps, 1 - eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = (np.where(p > 0, p * np.log(p / q), 0.0)
              + np.where(p < 1, (1 - p) * np.log((1 - p) / (1 - q)), 0.0))
    return float(kl.mean())


def scores(p: np.ndarray, q: np.ndarray) -> dict[str, float]:
    """The three scores of predictions `q` against the known probabilities `p`."""
    return {"auc": soft_auc(p, q), "calibration": calibration(p, q),
            "excess_log_loss": excess_log_loss(p, q)}


def run(model: str, seed: int, steps: int | None, workdir: str, overrides=()) -> dict:
    """Trains one config and scores its pCVR on all eval impressions; also the oracle's."""
    import multihead as mh
    run_dir = os.path.join(workdir, f"{model}-{seed}")
    sets = [f"seed={seed}", "log.tensorboard=false"]
    if steps is not None:
        sets.append(f"train.steps={steps}")
    train_quietly(os.path.join(ROOT, "experiments", "esmm", f"{model}.yaml"), run_dir,
                  sets + list(overrides))
    loaded = mh.load_run(run_dir)
    data = loaded.config.data
    impressions = mh.impressions(**{"seed": loaded.config.seed if data.seed is None else data.seed,
                                    **data.options}).eval
    predicted = np.asarray(loaded.model.predict(impressions.x, verbose=0)["cvr"])
    with open(os.path.join(run_dir, "metrics.json")) as f:
        wall = json.load(f)["wall_time_s"]
    return {"model": scores(impressions.p_cvr, predicted),
            "oracle": scores(impressions.p_cvr, impressions.p_cvr), "wall_time_s": wall}


def _cell(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} +- {spread:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 steps")
    parser.add_argument("--seeds", type=int, default=3, help="seeds (default 3)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default: the configs' 2000; --quick: 200)")
    parser.add_argument("--json", default=None, help="also write every run's scores here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run (e.g. data.options.click_rate=0.02)")
    args = parser.parse_args()
    steps = args.steps or (200 if args.quick else None)
    runs: dict[str, list[dict]] = {m: [] for m in MODELS}
    print(f"load average at start: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as workdir:
        for seed in range(args.seeds):  # seeds outermost: an interrupted run covers every model
            for model in MODELS:
                result = run(model, seed, steps, workdir, args.set)
                runs[model].append(result)
                print(f"  {model:13s} seed {seed}: "
                      + "  ".join(f"{k} {v:.4f}" for k, v in result["model"].items())
                      + f"  ({result['wall_time_s']:.0f} s)", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({m: rs for m, rs in runs.items()}, f, indent=1)
    metrics = ("auc", "calibration", "excess_log_loss")
    rows = [["model"] + list(metrics) + ["wall s"]]
    rows.append(["oracle"] + [_cell([r["oracle"][k] for r in runs["esmm"]]) for k in metrics]
                + ["-"])
    for model in MODELS:
        rows.append([model] + [_cell([r["model"][k] for r in runs[model]]) for k in metrics]
                    + [f"{statistics.fmean(r['wall_time_s'] for r in runs[model]):.0f}"])
    length = steps or "the configs'"
    print(f"\npCVR on all eval impressions against the known pCVR, {args.seeds} seeds, "
          f"{length} steps" + "".join(f", {o}" for o in args.set)
          + f"; load average {os.getloadavg()[0]:.2f}")
    print(table(rows))
    gains = [e["model"]["auc"] - n["model"]["auc"] for e, n in zip(runs["esmm"], runs["naive_cvr"])]
    wins = sum(g > 0 for g in gains)
    holds = wins == len(gains)
    print(f"\nESMM's AUC - naive CVR's, paired by seed: {_cell(gains)} "
          f"(ESMM higher on {wins} of {len(gains)} seeds)")
    print("paper's finding (ESMM's entire-space pCVR beats the click-space model on AUC): "
          + ("holds" if holds else "does NOT hold on every seed"))


if __name__ == "__main__":
    main()
