"""Steps/s of multihead's compiled step against PyTorch steps, side by side on one core: trunk
Dense 64 -> 256 -> 256 relu, K Dense(1) heads, MSE, Adam, batch 128.

Rows (multihead against a PyTorch step; both sides timed in turns in each repeat, each in its
own warm process with one thread; ratios are medians of the repeats' ratios, with min and max):

  sum (one pass)  multihead `TrunkPolicy(Adam, "sum")`, the one-pass default, against
                    - PyTorch's summed loop (one loss, one backward, one Adam: LibMTL's EW step
                      without its framework around it), and
                    - LibMTL's own EW step: its `Trainer` (weighting EW, architecture HPS), the
                      loop body of `Trainer.train` without the data loader (see _torch_worker.py);
                      checked first to give the summed loop's weights after 3 steps;
  sum (K passes)  the same with `one_pass_backward=False`, against the summed loop;
  per_head        multihead's default `Trainer` against PyTorch's per-head loop (K backward
                  passes, K Adams each on trunk + its head).

PyTorch runs in the Python of a separate venv (`--torch-python`, e.g. one made with
`python3 -m venv peers && peers/bin/pip install torch==2.13.0`, plus `peers/bin/pip install
--no-deps LibMTL==1.1.5 scipy` for the LibMTL row): never a dependency of multihead. Without
torch the script says so in one line and stops; without LibMTL its row is skipped with one line.

    taskset -c 1 .venv/bin/python benchmarks/torch_peers.py --torch-python peers/bin/python
    .venv/bin/python benchmarks/torch_peers.py --quick --torch-python peers/bin/python  # smoke
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


def torch_available(python: str) -> str | None:
    """None, or the one line saying why the PyTorch rows are skipped."""
    try:
        out = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True,
                             timeout=120)
    except OSError as error:
        return f"PyTorch rows skipped: --torch-python {python}: {error.strerror}"
    if out.returncode:
        return f"PyTorch rows skipped: --torch-python {python} cannot import torch"
    return None


def libmtl_check(python: str, k: int) -> tuple[bool, str]:
    """(whether LibMTL's EW row runs, the one line to print): its EW step is first checked
    against the summed loop (every parameter after 3 steps from the same weights)."""
    out = subprocess.run([python, os.path.join(HERE, "_torch_worker.py"), "check", str(k),
                          str(IN_DIM), str(WIDTH), str(BATCH)], capture_output=True, text=True,
                         timeout=600, env=_one_thread())
    words = out.stdout.split()
    if out.returncode or not words or words[0] != "ok":
        why = out.stdout.strip() or (out.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"LibMTL EW row skipped (K={k}): {why.removeprefix('error: ')}"
    return True, (f"LibMTL {words[1]} EW (K={k}): the summed loop's parameters after 3 steps "
                  f"to {words[2]} (max abs difference)")


def _one_thread() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


class TorchSide:
    """A warm PyTorch worker process (benchmarks/_torch_worker.py) for K heads."""

    def __init__(self, python: str, k: int) -> None:
        self.proc = subprocess.Popen(
            [python, os.path.join(HERE, "_torch_worker.py"), str(k), str(IN_DIM), str(WIDTH),
             str(BATCH)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=_one_thread())

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


PAIRS = [("sum (one pass)", "summed"), ("sum (one pass)", "libmtl_ew"),
         ("sum (K passes)", "summed"), ("per_head", "per_head")]
PEER_NAMES = {"summed": "summed loop", "libmtl_ew": "LibMTL EW", "per_head": "per-head loop"}


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


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def measure(python: str, k: int, pairs: list[tuple[str, str]], calls: int,
            repeats: int) -> list[list[str]]:
    """The table rows of K heads: per pair, medians of steps/s and the repeats' ratios."""
    ours, peer = multihead_steps(k), TorchSide(python, k)
    try:
        for name, peer_name in pairs:  # trace and warm up both sides
            ours[name](), ours[name]()
            peer.time(peer_name, 3)
        samples = {pair: ([], []) for pair in pairs}
        for _ in range(repeats):
            for name, peer_name in pairs:
                samples[name, peer_name][0].append(_time_ours(ours[name], calls))
                samples[name, peer_name][1].append(peer.time(peer_name, calls))
    finally:
        peer.close()
    rows = []
    for (name, peer_name), (mine, theirs) in samples.items():
        wall = [t[0] / m[0] for m, t in zip(mine, theirs)]
        cpu = [t[1] / m[1] for m, t in zip(mine, theirs)]
        rows.append([str(k), name, PEER_NAMES[peer_name],
                     f"{1 / statistics.median(w for w, _ in mine):.0f}",
                     f"{1 / statistics.median(w for w, _ in theirs):.0f}",
                     _spread(wall), _spread(cpu)])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-python", help="the Python of a venv with torch (and LibMTL)")
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="K=4, 2 repeats of 3 steps (smoke)")
    args = parser.parse_args(argv)
    if args.quick:
        args.ks, args.calls, args.repeats = [4], 3, 2
    if not args.torch_python:
        print("PyTorch rows need --torch-python (a venv with torch); nothing measured")
        return 0
    skipped = torch_available(args.torch_python)
    if skipped:
        print(skipped)
        return 0
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    rows = [["K", "multihead", "PyTorch step", "multihead steps/s", "PyTorch steps/s",
             "ratio, wall (min / median / max)", "ratio, CPU (min / median / max)"]]
    for k in args.ks:
        with_libmtl, line = libmtl_check(args.torch_python, k)
        print(line, flush=True)
        pairs = [p for p in PAIRS if with_libmtl or p[1] != "libmtl_ew"]
        rows += measure(args.torch_python, k, pairs, args.calls, args.repeats)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("ratio: multihead steps/s over PyTorch's (CPU: PyTorch CPU time over multihead's), "
          f"per repeat of {args.calls} steps, {args.repeats} repeats")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
