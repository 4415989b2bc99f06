"""`benchmarks/device_check.py --dry-run` works, so the script is known to run before a GPU is
there: every check prints a row with two positive speeds and their ratio."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_device_check_dry_run_prints_every_check_with_consistent_ratios():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "device_check.py"),
                          "--dry-run"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["check"])
    rows = [line for line in lines[header + 1:] if line.split()[-1:] and
            line.split()[-1].replace(".", "").isdigit() and "ratio =" not in line]
    checks = " ".join(rows)
    for check in ("Trainer.step", "hand TF2", "TF1", "Trainer.fit", "naive loop", "XLA on",
                  "batched", "fused", "mixed_bfloat16", "Mirrored x1", "matmul"):
        assert check in checks, check
    for row in rows:
        cells = row.split()
        first, second, ratio = cells[-3].rstrip("G"), cells[-2].rstrip("G"), float(cells[-1])
        assert float(first) > 0 and float(second) > 0
        if not cells[-3].endswith("G"):  # a ratio of speeds (the FLOP/s row: of rates)
            assert abs(ratio - float(first) / float(second)) <= 0.1 * ratio + 0.01
