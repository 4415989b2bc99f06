"""benchmarks/esmm.py: the scores of docs/esmm.md's table against plain numpy."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("esmm_bench", os.path.join(ROOT, "benchmarks",
                                                                              "esmm.py"))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))


def _pairwise_soft_auc(p, q):
    """Every (positive copy i, negative copy j) pair, weighted p_i (1 - p_j), scores 1 when
    q_i > q_j and 1/2 on a tie."""
    wins = (q[:, None] > q[None, :]) + 0.5 * (q[:, None] == q[None, :])
    weights = p[:, None] * (1 - p[None, :])
    return float((wins * weights).sum() / weights.sum())


def test_scores_match_numpy(bench):
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.6, 400)
    q = np.clip(p + rng.normal(0, 0.1, 400), 0.001, 0.999)
    got = bench.scores(p[:, None], q[:, None])
    assert got["auc"] == pytest.approx(_pairwise_soft_auc(p, q), abs=2e-3)
    assert got["calibration"] == pytest.approx(q.mean() / p.mean(), rel=1e-12)
    kl = np.mean(p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q)))
    assert got["excess_log_loss"] == pytest.approx(kl, rel=1e-9)
    perfect = bench.scores(p, p)
    assert perfect["calibration"] == 1.0 and perfect["excess_log_loss"] == pytest.approx(0, abs=1e-12)
    # a score that ranks the impressions backwards is below chance
    assert bench.soft_auc(p, -p + 1) < 0.5 < bench.soft_auc(p, p)
