"""Steps/s of multihead's compiled step against hand-written PyTorch steps, side by side on one
core: trunk Dense 64 -> 256 -> 256 relu, K Dense(1) heads, MSE, Adam, batch 128.

Rows (each a ratio of medians over repeats, both sides timed in turns in each repeat, each in
its own warm process with one thread):

  sum (one pass)  multihead `TrunkPolicy(Adam, "sum")`, the one-pass default, against PyTorch's
                  summed loop (one loss, one backward, one Adam: LibMTL's EW step without its
                  framework around it, so a lower bound for LibMTL);
  sum (K passes)  the same with `one_pass_backward=False`, against the same loop;
  per_head        multihead's default `Trainer` against PyTorch's per-head loop (K backward
                  passes, K Adams each on trunk + its head).

PyTorch runs in the Python of a separate venv (`--torch-python`, e.g. one made with
`python3 -m venv peers && peers/bin/pip install torch==2.13.0`): never a dependency of
multihead. Without it the script says so in one line and stops.

    taskset -c 1 .venv/bin/python benchmarks/torch_peers.py --torch-python peers/bin/python
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # this checkout's multihead, not an installed one

from _timing import mlp_model, table  # noqa: E402 - also sets the TF log level

IN_DIM, WIDTH, BATCH = 64, 256, 128


class TorchSide:
    """A warm PyTorch worker process (benchmarks/_torch_worker.py) for K heads."""

    def __init__(self, python: str, k: int) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [python, os.path.join(HERE, "_torch_worker.py"), str(k), str(IN_DIM), str(WIDTH),
             str(BATCH)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def time(self, variant: str, calls: int) -> tuple[float, float]:
        """(wall, CPU) seconds per step over `calls` steps."""
        self.proc.stdin.write(f"{variant} {calls}\n")
        self.proc.stdin.flush()
        wall, cpu = (float(v) for v in self.proc.stdout.readline().split())
        return wall / calls, cpu / calls

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def multihead_steps(k: int) -> dict[str, object]:
    import keras
    import numpy as np
    import tensorflow as tf

    import multihead as mh

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    heads = [f"h{i}" for i in range(k)]
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((BATCH, IN_DIM)), tf.float32)
    y = {h: tf.constant(rng.standard_normal((BATCH, 1)), tf.float32) for h in heads}

    def trainer(trunk, one_pass=True):
        t = mh.Trainer(mlp_model(heads, IN_DIM, WIDTH), {
            h: mh.Objective("mse", keras.optimizers.Adam(1e-3)) for h in heads},
            trunk=trunk, one_pass_backward=one_pass)
        step = t._runner.ensure_built(None)  # noqa: SLF001 - what Trainer.step calls
        return lambda: step(x, y)

    def policy():
        return mh.TrunkPolicy(keras.optimizers.Adam(1e-3), "sum")

    return {"sum (one pass)": trainer(policy()), "sum (K passes)": trainer(policy(), False),
            "per_head": trainer("per_head")}


PEER = {"sum (one pass)": "summed", "sum (K passes)": "summed", "per_head": "per_head"}


def _time_ours(fn, calls: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = None
    for _ in range(calls):
        result = fn()
    for leaf in _leaves(result)[:1]:  # wait for the last step to finish
        leaf.numpy()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def _leaves(result: object) -> list:
    import tensorflow as tf

    return [v for v in tf.nest.flatten(result) if hasattr(v, "numpy")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-python", help="the Python of a venv with torch")
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    if not args.torch_python:
        print("PyTorch rows need --torch-python (a venv with torch); nothing measured")
        return 0
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    rows = [["K", "variant", "multihead steps/s", "PyTorch steps/s", "ratio (wall)", "ratio (CPU)"]]
    for k in args.ks:
        ours, peer = multihead_steps(k), TorchSide(args.torch_python, k)
        try:
            for name, fn in ours.items():  # trace and warm up both sides
                fn(), fn()
                peer.time(PEER[name], 3)
            samples = {name: ([], []) for name in ours}
            for _ in range(args.repeats):
                for name, fn in ours.items():
                    samples[name][0].append(_time_ours(fn, args.calls))
                    samples[name][1].append(peer.time(PEER[name], args.calls))
        finally:
            peer.close()
        for name, (mine, theirs) in samples.items():
            wall = statistics.median(w for w, _ in mine), statistics.median(w for w, _ in theirs)
            cpu = statistics.median(c for _, c in mine), statistics.median(c for _, c in theirs)
            rows.append([str(k), name, f"{1 / wall[0]:.0f}", f"{1 / wall[1]:.0f}",
                         f"{wall[1] / wall[0]:.2f}x", f"{cpu[1] / cpu[0]:.2f}x"])
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
