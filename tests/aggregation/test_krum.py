"""Krum scores with squared distances, as the paper's s(i) (Blanchard et al. 2017); torchjd sums
plain distances. A case where the two select different gradients shows which one this is."""

from __future__ import annotations

import numpy as np

import multihead as mh


def _krum(g: np.ndarray, f: int, squared: bool) -> int:
    dist = np.linalg.norm(g[:, None] - g[None], axis=2)
    dist = dist**2 if squared else dist
    n = len(g) - f - 2
    scores = [np.sort(np.delete(dist[i], i))[:n].sum() for i in range(len(g))]
    return int(np.argmin(scores))


def test_krum_uses_squared_distances_as_the_paper_not_torchjds_plain_ones():
    # Five points, f = 1 (two nearest neighbours each): by squared distances point 3 scores
    # 6.51 and the next 6.96; by plain distances point 2 scores 3.01 and the next 3.35.
    g = np.array([[2.0, 1.3], [0.9, -1.7], [1.6, 1.3], [-0.6, -0.1], [-1.7, -0.8]])
    paper, torchjd = _krum(g, 1, squared=True), _krum(g, 1, squared=False)
    assert paper != torchjd
    d = mh.aggregate(g, "krum", dtype="float64", n_byzantine=1).direction.numpy()
    np.testing.assert_array_equal(d, g[paper])
