"""`benchmarks/first_step.py --quick` runs: its table has a row per method and K, with positive
times and node counts and ratios to the per-head trainer that match them (no timing asserted)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_first_step_benchmark_quick_run_prints_a_consistent_table():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "first_step.py"),
                          "--quick"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["method", "K"])
    assert lines[header].split() == ["method", "K", "first_s", "steady_ms", "nodes",
                                     "first/per_head", "steady/per_head"]
    rows = [line.split() for line in lines[header + 1:] if line.strip()]
    assert {(r[0], int(r[1])) for r in rows} == {(m, k) for m in ("per_head", "mgda") for k in (2, 4)}
    base = {int(r[1]): r for r in rows if r[0] == "per_head"}
    for method, k, first, steady, nodes, first_ratio, steady_ratio in rows:
        assert float(first) > 0 and float(steady) > 0 and int(nodes) > 0
        per_head = base[int(k)]
        # the ratios are of the printed (rounded) times: within rounding
        assert abs(float(first_ratio) - float(first) / float(per_head[2])) <= 0.02 * float(first_ratio) + 0.011
        assert abs(float(steady_ratio) - float(steady) / float(per_head[3])) <= 0.02 * float(steady_ratio) + 0.011
        if method == "per_head":
            assert first_ratio == steady_ratio == "1.00"
