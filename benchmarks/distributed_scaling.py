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
steps_per_execution=10, timed after a warm-up (the first call traces).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

_WORKER = r'''
import json, os, sys, time
mode, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import tensorflow as tf
if mode.startswith("mirrored"):
    cpu = tf.config.list_physical_devices("CPU")[0]
    n = int(mode.split("-")[1])
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
from multihead.distribute import make_strategy, scope
strategy = (make_strategy("mirrored") if mode.startswith("mirrored")
            else make_strategy("multi_worker") if mode.startswith("workers") else None)
import keras, numpy as np
import multihead as mh
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((batch * 20, 64)).astype("float32")
y = {h: rng.standard_normal((batch * 20, 1)).astype("float32") for h in ("a", "b")}
with scope(strategy):
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(256, activation="relu"),
                                                keras.layers.Dense(256, activation="relu")]),
                              {h: keras.layers.Dense(1) for h in ("a", "b")})
    model.build((None, 64))
    trainer = mh.Trainer(model, {h: mh.Objective("mse", "adam") for h in ("a", "b")},
                         strategy=strategy)
trainer.fit((x, y), 20, batch_size=batch, verbose=False, steps_per_execution=10)   # warm-up
start = time.perf_counter()
trainer.fit((x, y), steps, batch_size=batch, verbose=False, steps_per_execution=10)
seconds = time.perf_counter() - start
if trainer.is_chief:
    print(json.dumps({"mode": mode, "seconds": seconds,
                      "replicas": strategy.num_replicas_in_sync if strategy else 1}))
'''


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _run(mode: str, steps: int, batch: int, timeout: float = 600) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, "-c", _WORKER, mode, str(steps), str(batch)]
    if not mode.startswith("workers"):
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
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
    parser.add_argument("--modes", default="single,mirrored-1,mirrored-2,workers-2")
    args = parser.parse_args()
    print(f"global batch {args.batch}, {args.steps} timed steps, {os.cpu_count()} CPU cores")
    print(f"{'mode':<12} {'replicas':>8} {'steps/s':>9} {'samples/s':>10} {'vs single':>9}")
    base = None
    for mode in args.modes.split(","):
        result = _run(mode, args.steps, args.batch)
        rate = args.steps / result["seconds"]
        base = base or rate
        print(f"{mode:<12} {result['replicas']:>8} {rate:>9.1f} {rate * args.batch:>10.0f} "
              f"{rate / base:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
