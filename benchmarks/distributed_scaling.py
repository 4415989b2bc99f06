"""Steps/s and samples/s of multihead training on 1 vs 2 replicas through tf.distribute.

    python benchmarks/distributed_scaling.py [--steps 200] [--batch 256]

Runs, each in a fresh process (TensorFlow's devices are fixed at start-up):

* `single`: one device, no strategy;
* `mirrored-1` / `mirrored-2`: MirroredStrategy over 1 or 2 logical CPU devices
  (the CPU split in two: the same cores, so this measures overhead, not speed-up);
* `workers-2`: MultiWorkerMirroredStrategy, two local worker processes on
  127.0.0.1 (free ports, TF_CONFIG per process), each with one device.

The global batch is the same in every run (each of R replicas takes batch/R
examples), so steps/s compare directly and samples/s = steps/s x batch.
Model: trunk Dense 64->256->256 relu, two Dense(1) heads with Adam, fit with
steps_per_execution=10, timed after a warm-up (the first call traces): the
median of 5 `fit` calls (each builds its distributed dataset and iterator) and
the median compiled call of 10 steps on a live iterator (steady state). The
machine may be shared: medians, and compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_WORKER = r'''
import json, os, sys, time
mode, steps, batch, per_epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
import tensorflow as tf
if mode.startswith("mirrored"):
    cpu = tf.config.list_physical_devices("CPU")[0]
    n = int(mode.split("-")[1])
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
from multihead.step.distribute import make_strategy, scope
strategy = (make_strategy("mirrored") if mode.startswith("mirrored")
            else make_strategy("multi_worker") if mode.startswith("workers") else None)
import keras, numpy as np
import multihead as mh
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((batch * per_epoch, 64)).astype("float32")
y = {h: rng.standard_normal((batch * per_epoch, 1)).astype("float32") for h in ("a", "b")}
with scope(strategy):
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(256, activation="relu"),
                                                keras.layers.Dense(256, activation="relu")]),
                              {h: keras.layers.Dense(1) for h in ("a", "b")})
    model.build((None, 64))
    trainer = mh.Trainer(model, {h: mh.Objective("mse", "adam") for h in ("a", "b")},
                         strategy=strategy)
trainer.fit((x, y), 20, batch_size=batch, verbose=False, steps_per_execution=10)   # warm-up
fits = []
for _ in range(5):  # whole fit calls: each makes its (distributed) dataset and iterator
    start = time.perf_counter()
    trainer.fit((x, y), steps, batch_size=batch, verbose=False, steps_per_execution=10)
    fits.append(time.perf_counter() - start)
data = mh.as_dataset((x, y), batch)
iterator = iter(strategy.experimental_distribute_dataset(data) if strategy else data)
calls = []
for _ in range(steps // 10):  # steady state: one compiled call of 10 steps on a live iterator
    start = time.perf_counter()
    trainer._runner.train_step.run(iterator, 10)  # noqa: SLF001 - what fit calls per chunk
    calls.append(time.perf_counter() - start)
if trainer.is_chief:
    print(json.dumps({"mode": mode, "fit_seconds": sorted(fits)[2],
                      "call_seconds": sorted(calls)[len(calls) // 2],
                      "replicas": strategy.num_replicas_in_sync if strategy else 1}))
'''


def _run(mode: str, steps: int, batch: int, per_epoch: int, timeout: float = 600) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, "-c", _WORKER, mode, str(steps), str(batch), str(per_epoch)]
    if not mode.startswith("workers"):
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    from multihead.step.distribute import local_workers  # imports TensorFlow: only when needed

    workers = local_workers(2)
    procs = []
    try:
        for index in range(2):
            env_i = dict(env, TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                                    "task": {"type": "worker", "index": index}}))
            procs.append(subprocess.Popen(args, env=env_i, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError("a worker failed:\n" + "\n".join(err[-2000:] for _, err in outputs))
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256, help="global batch size")
    parser.add_argument("--epoch-batches", type=int, default=400,
                        help="batches per epoch (fit starts one iterator per epoch, which costs "
                             "more for a distributed dataset)")
    parser.add_argument("--modes", default="single,mirrored-1,mirrored-2,workers-2")
    args = parser.parse_args()
    print(f"global batch {args.batch}, {args.steps} timed steps, {args.epoch_batches} batches per "
          f"epoch, {os.cpu_count()} CPU cores")
    print("fit: median of 5 fit(steps) calls; steady: median compiled call of 10 steps")
    print(f"{'mode':<12} {'replicas':>8} {'fit steps/s':>12} {'samples/s':>10} {'vs single':>9} "
          f"{'steady steps/s':>15} {'vs single':>9}")
    base = None
    for mode in args.modes.split(","):
        result = _run(mode, args.steps, args.batch, args.epoch_batches)
        rate, steady = args.steps / result["fit_seconds"], 10 / result["call_seconds"]
        base = base or (rate, steady)
        print(f"{mode:<12} {result['replicas']:>8} {rate:>12.1f} {rate * args.batch:>10.0f} "
              f"{rate / base[0]:>8.2f}x {steady:>15.1f} {steady / base[1]:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
