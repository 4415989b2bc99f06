"""Two revisions of multihead side by side: `Trainer.fit` step time and final weights.

Each revision runs in its own warm process (its source tree first on `PYTHONPATH`, the same
venv); the processes time the same workload in turns, alternating which goes first, so load
on the machine reaches both alike. Per workload it prints the median ms/step of each
revision, their throughput ratio (after / before: above 1 is faster), and whether the two
revisions' weights after the same steps are bitwise equal.

    python benchmarks/revisions.py --before 58e7c31                # against this checkout
    python benchmarks/revisions.py --before 58e7c31 --after HEAD --rounds 9 --only per_head
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

WORKLOADS = ("per_head", "per_head_k16", "pcgrad", "mgda", "upgrad", "mean_sequential")

_WORKER = r'''
import hashlib, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import keras, numpy as np, tensorflow as tf
import multihead as mh

name = sys.argv[1]
k = 16 if name.endswith("_k16") else 4
width, batch = 256, 256
keras.utils.set_random_seed(0)
model = mh.MultiHeadModel(
    keras.Sequential([keras.layers.Dense(width, activation="relu"),
                      keras.layers.Dense(width, activation="relu")]),
    {f"h{i}": keras.layers.Dense(1) for i in range(k)})
model.build((None, 64))
aggregator = name.removesuffix("_sequential")
trunk = "per_head" if name.startswith("per_head") or name.endswith("_sequential") else \
    mh.TrunkPolicy(aggregator=aggregator)
schedule = "sequential" if name.endswith("_sequential") else "simultaneous"
trainer = mh.Trainer(model, {f"h{i}": mh.Objective("mse", optimizer=keras.optimizers.Adam(1e-4))
                             for i in range(k)}, trunk=trunk, schedule=schedule)
rng = np.random.default_rng(0)
x = rng.random((batch * 8, 64), dtype=np.float32)
y = {f"h{i}": rng.random((batch * 8, 1), dtype=np.float32) for i in range(k)}
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat().prefetch(4)
trainer.fit(data, steps=60, verbose=False, steps_per_execution=20)
digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in model.weights)).hexdigest()
print("ready", digest, flush=True)
for line in sys.stdin:
    steps = int(line)
    start = time.perf_counter()
    trainer.fit(data, steps=steps, verbose=False, steps_per_execution=50)
    print((time.perf_counter() - start) / steps * 1e3, flush=True)
'''


def _tree(rev: str, scratch: str) -> str:
    """A source tree of `rev` (a directory as is, or a git revision exported)."""
    if os.path.isdir(rev):
        return os.path.abspath(rev)
    out = os.path.join(scratch, rev.replace("/", "_"))
    os.makedirs(out)
    archive = subprocess.run(["git", "archive", rev, "multihead"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", out], input=archive.stdout, check=True)
    return out


def compare(worker: str, workload: str, trees: dict[str, str], rounds: int,
            steps: int) -> tuple[dict[str, float], bool]:
    """Median ms/step per revision, and whether their weights after warm-up are equal."""
    procs, digests = {}, {}
    for name, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=tree)
        procs[name] = subprocess.Popen([sys.executable, worker, workload], env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, cwd=tree)
    for name, proc in procs.items():
        word, digest = proc.stdout.readline().split()
        assert word == "ready", f"{name} did not start"
        digests[name] = digest
    times: dict[str, list[float]] = {n: [] for n in procs}
    for r in range(rounds):
        order = list(procs.items()) if r % 2 == 0 else list(reversed(procs.items()))
        for name, proc in order:
            proc.stdin.write(f"{steps}\n")
            proc.stdin.flush()
            times[name].append(float(proc.stdout.readline()))
    for proc in procs.values():
        proc.stdin.close()
        proc.wait(timeout=60)
    return {n: statistics.median(t) for n, t in times.items()}, len(set(digests.values())) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision or a source tree")
    parser.add_argument("--after", default=".", help="a git revision or a source tree (default: .)")
    parser.add_argument("--rounds", type=int, default=7, help="timed turns per revision (median)")
    parser.add_argument("--steps", type=int, default=200, help="steps per turn")
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="workloads to run")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"before": _tree(args.before, scratch), "after": _tree(args.after, scratch)}
        worker = os.path.join(scratch, "worker.py")
        with open(worker, "w", encoding="utf-8") as fh:
            fh.write(_WORKER)
        print(f"{'workload':18s} {'before ms':>10s} {'after ms':>10s} {'after/before thr.':>18s}  weights")
        for workload in args.only or WORKLOADS:
            medians, same = compare(worker, workload, trees, args.rounds, args.steps)
            ratio = medians["before"] / medians["after"]
            print(f"{workload:18s} {medians['before']:10.3f} {medians['after']:10.3f} {ratio:18.3f}  "
                  f"{'bitwise equal' if same else 'DIFFER'}", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
