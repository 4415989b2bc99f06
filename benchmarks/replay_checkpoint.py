"""What checkpointing a ~300 MB replay buffer costs: save and restore time, peak extra memory.

The buffer is `ReplayBuffer(600_000, obs_shape=(64,))` filled to capacity: obs and next_obs
float32 (2 x 154 MB), actions int64, rewards and flags float32: 317 MB. It is written the way
an RL run writes it (`HostState` of `buffer.state`, inside a `tf.train.Checkpoint`), to a
temporary directory on the same disk as the run directories would be.

    /work/main/.venv/bin/python benchmarks/replay_checkpoint.py              # 3 saves, 1 restore
    /work/main/.venv/bin/python benchmarks/replay_checkpoint.py --rows 100000

Peak extra memory is the process's peak resident set (VmHWM, reset before each measurement
through /proc/self/clear_refs) above its resident set before the save: a copy of the buffer
would show as ~its size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's multihead


def _status(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # MB
    raise KeyError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=600_000)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    from multihead.rl.host_state import HostState
    from multihead.rl.replay import ReplayBuffer

    buffer = ReplayBuffer(args.rows, (64,), seed=0)
    rng = np.random.default_rng(0)
    for name in ("_obs", "_next_obs"):
        getattr(buffer, name)[:] = rng.standard_normal(getattr(buffer, name).shape, np.float32)
    buffer._action[:] = rng.integers(0, 4, args.rows)
    buffer._reward[:] = rng.standard_normal(args.rows, np.float32)
    buffer._size, buffer._next = args.rows, 0
    size_mb = sum(a.nbytes for a in (buffer._obs, buffer._next_obs, buffer._action, buffer._reward,
                                     buffer._terminated)) / 2**20
    ckpt = tf.train.Checkpoint(replay=HostState(buffer.state, buffer.load_state))
    directory = tempfile.mkdtemp(prefix="replay-ckpt-", dir=args.dir)
    try:
        times, extra = [], []
        for i in range(args.saves):
            before = _status("VmRSS")
            _reset_peak()
            start = time.perf_counter()
            path = ckpt.write(os.path.join(directory, f"ckpt-{i}"))
            times.append(time.perf_counter() - start)
            extra.append(_status("VmHWM") - before)
        on_disk = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                      if f.startswith("ckpt-0.")) / 2**20
        expected = buffer.state()
        buffer._obs[:] = 0.0
        before = _status("VmRSS")
        _reset_peak()
        start = time.perf_counter()
        ckpt.read(path).assert_consumed()
        restore_s = time.perf_counter() - start
        restore_extra = _status("VmHWM") - before
        assert np.array_equal(buffer.state()["obs"], expected["obs"])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"buffer: {args.rows} rows, {size_mb:.0f} MB in memory, {on_disk:.0f} MB on disk")
    print(f"save: median {statistics.median(times):.2f} s over {args.saves} "
          f"({', '.join(f'{t:.2f}' for t in times)}), peak extra memory "
          f"{max(extra):.0f} MB ({size_mb / statistics.median(times):.0f} MB/s)")
    print(f"restore: {restore_s:.2f} s, peak extra memory {restore_extra:.0f} MB")


if __name__ == "__main__":
    main()
