"""One command for a new device: side-by-side speed ratios of multihead on it, in one table.

Each row times two variants round-robin in one process (median of repeats,
`_timing.interleaved_medians`) and prints their ratio, above 1 = the first is faster:

  Trainer.step vs the hand-written TF2 step and vs TF1, at K = 4, 16 and widths 256, 4096;
  Trainer.fit vs a naive Python loop over the same tf.data pipeline;
  fused per-head updates vs the default (Keras') updates;
  one batched trunk backward vs K backward passes;
  mixed precision (mixed_float16 on a GPU, with a loss scale per head; mixed_bfloat16 on a
  CPU) vs float32;
  XLA on vs off;
  MirroredStrategy over every visible GPU vs one device;
  the step's achieved matmul FLOP/s vs a large matmul's on the same device.

    python benchmarks/device_check.py            # on a GPU machine: about 5 minutes
    python benchmarks/device_check.py --dry-run  # the same code at tiny sizes, on CPU, < 1 min

The load average is printed with the table: on a shared machine, compare ratios, not rates.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleaved_medians, table  # noqa: E402
from step_throughput import (  # noqa: E402
    IN_DIM,
    LR,
    TF1,
    HandTF2,
    calls_for,
    constant_batch,
    initial_weights,
    keras_parts,
    pipeline,
)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402

#: (Ks, widths, batch, repeats, fit steps, matmul n) of a full check and of a dry run.
FULL = ((4, 16), (256, 4096), 256, 5, 200, 4096)
DRY = ((2,), (16,), 8, 2, 4, 64)


def trainer_for(init, width, strategy=None, dtype=None, **options):
    """The benchmark's K-head model (`step_throughput.keras_parts`, its trunk in `dtype`) and
    a Trainer on it."""
    def build():
        trunk, heads = keras_parts(init, width, dtype)
        model = mh.MultiHeadModel(trunk, heads)
        model.build((None, IN_DIM))
        return model, {h: mh.Objective("mse", keras.optimizers.Adam(LR)) for h in heads}

    if strategy is None:
        model, objectives = build()
    else:
        with strategy.scope():
            model, objectives = build()
    return mh.Trainer(model, objectives, strategy=strategy, **options)


def ratio_row(check, names, variants, repeats, calls=None):
    """`[check, first, second, first steps/s, second steps/s, ratio]` of two variants."""
    first, second = names
    for fn in variants.values():
        fn()  # warm-up: traces
    calls = calls or calls_for(variants[first])
    t = interleaved_medians(variants, calls, repeats)
    return [check, first, second, f"{1 / t[first]:.1f}", f"{1 / t[second]:.1f}",
            f"{t[second] / t[first]:.2f}"]


def step_rows(ks, widths, size, repeats):
    rows = []
    for width in widths:
        for k in ks:
            init = initial_weights(k, width)
            x, ys, xt, yt = constant_batch(k, size)
            trainer, hand, tf1 = trainer_for(init, width), HandTF2(init, width), TF1(init, width)
            step = lambda: trainer.step((xt, yt))  # noqa: E731
            where = f"K={k} width={width}"
            rows.append(ratio_row(f"step {where}", ("Trainer.step", "hand TF2"),
                                  {"Trainer.step": step, "hand TF2": lambda: hand.step(xt, yt)},
                                  repeats))
            rows.append(ratio_row(f"step {where}", ("Trainer.step", "TF1"),
                                  {"Trainer.step": step, "TF1": lambda: tf1.step(x, ys)}, repeats))
    return rows


def fit_row(k, width, size, steps, repeats):
    init = initial_weights(k, width)
    ds = pipeline(k, size)
    trainer, hand = trainer_for(init, width), HandTF2(init, width)

    def naive():
        for x, ys in ds.take(steps):
            out = hand.step(x, ys)
        return out

    fit = lambda: trainer.fit(ds, steps=steps, verbose=False)  # noqa: E731
    row = ratio_row(f"fit K={k} width={width}", ("Trainer.fit", "naive loop"),
                    {"Trainer.fit": fit, "naive loop": naive}, repeats, calls=1)
    return row[:3] + [f"{float(r) * steps:.1f}" for r in row[3:5]] + row[5:]


def option_row(check, options, k, width, size, repeats, names):
    """A Trainer with `options` against the default Trainer on the same model and batch."""
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, size)
    default, variant = trainer_for(init, width), trainer_for(init, width, **options)
    return ratio_row(check, names, {names[0]: lambda: variant.step((xt, yt)),
                                    names[1]: lambda: default.step((xt, yt))}, repeats)


def mirrored_row(k, width, size, repeats):
    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in gpus] or ["/cpu:0"]
    strategy = tf.distribute.MirroredStrategy(devices)
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, size * len(devices))
    one, mirrored = trainer_for(init, width), trainer_for(init, width, strategy=strategy)
    try:
        return ratio_row(f"K={k} width={width} global batch {size * len(devices)}",
                         (f"Mirrored x{len(devices)}", "one device"),
                         {f"Mirrored x{len(devices)}": lambda: mirrored.step((xt, yt)),
                          "one device": lambda: one.step((xt, yt))}, repeats)
    finally:
        mirrored.close()


def flops_row(k, width, size, n, repeats):
    """The step's matmul FLOP/s (forward + K backward passes, 2 per multiply-add) against an
    n x n matmul's on the same device."""
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, size)
    trainer = trainer_for(init, width)
    fwd = 2 * size * (IN_DIM * width + width * width) + 2 * size * k * width
    bwd = k * (2 * size * (IN_DIM * width + 2 * width * width) + 4 * size * width)
    a, b = tf.random.normal([n, n]), tf.random.normal([n, n])
    matmul = tf.function(lambda: tf.matmul(a, b))
    row = ratio_row(f"FLOP/s K={k} width={width}", ("Trainer.step", f"matmul {n}^3"),
                    {"Trainer.step": lambda: trainer.step((xt, yt)), f"matmul {n}^3": matmul},
                    repeats)
    step_rate, matmul_rate = float(row[3]) * (fwd + bwd), float(row[4]) * 2 * n ** 3
    return row[:3] + [f"{step_rate / 1e9:.2f}G", f"{matmul_rate / 1e9:.2f}G",
                      f"{step_rate / matmul_rate:.2f}"]


def rows(dry_run: bool) -> list[list[str]]:
    ks, widths, size, repeats, steps, n = DRY if dry_run else FULL
    k, width = ks[-1], widths[0]
    out = [["check", "variant", "against", "variant /s", "against /s", "ratio"]]
    out += step_rows(ks, widths, size, repeats)
    out.append(fit_row(k, width, size, steps, repeats))
    out.append(option_row(f"XLA K={k} width={width}", {"jit_compile": True}, k, width, size,
                          repeats, ("XLA on", "XLA off")))
    out.append(option_row(f"updates K={k} width={widths[-1]}", {"fused_updates": True}, k,
                          widths[-1], size, repeats, ("fused", "Keras")))
    mixed = "mixed_float16" if tf.config.list_logical_devices("GPU") else "mixed_bfloat16"
    out.append(option_row(f"precision K={k} width={widths[-1]}", {"dtype": mixed}, k, widths[-1],
                          size, repeats, (mixed, "float32")))
    for width_ in widths:
        out.append(option_row(f"trunk backward K={k} width={width_}", {"batched_backward": True},
                              k, width_, size, repeats, ("batched", "K passes")))
    out.append(mirrored_row(k, width, size, repeats))
    out.append(flops_row(k, widths[-1], size, n, repeats))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny sizes on CPU, to check the script itself (< 1 min)")
    args = parser.parse_args()
    if args.dry_run:
        tf.config.set_visible_devices([], "GPU")
    devices = [d.name for d in tf.config.list_logical_devices()]
    print(f"devices: {', '.join(devices)}; TF {tf.__version__}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    start = time.perf_counter()
    print(table(rows(args.dry_run)))
    print(f"ratio = variant / against speed (> 1: variant faster); {time.perf_counter() - start:.0f} s; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
