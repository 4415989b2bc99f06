"""GradVac equals a numpy transcription of LibMTL's current loop (LibMTL/weighting/GradVac.py,
whole model, after commit d2d84fa "fix a bug in GradVac": the goal rho_T[i, j] moves for every
visited pair), 5 steps at K = 2 and 4, state carried, in the same random orders."""

from __future__ import annotations

import numpy as np
import pytest

import multihead as mh


def libmtl_gradvac(grads: np.ndarray, rho_t: np.ndarray, orders: list[list[int]], beta: float):
    """One `backward` of LibMTL's GradVac with `GradVac_group_type=0`; `orders[i]` is the shuffled
    `task_index` of task i (its own index removed)."""
    pc_grads = grads.copy()
    rho_t = rho_t.copy()
    for tn_i in range(len(grads)):
        for tn_j in orders[tn_i]:
            rho_ijk = pc_grads[tn_i] @ grads[tn_j] / (
                np.linalg.norm(pc_grads[tn_i]) * np.linalg.norm(grads[tn_j]) + 1e-8)
            if rho_ijk < rho_t[tn_i, tn_j]:
                w = np.linalg.norm(pc_grads[tn_i]) * (
                    rho_t[tn_i, tn_j] * np.sqrt(1 - rho_ijk**2)
                    - rho_ijk * np.sqrt(1 - rho_t[tn_i, tn_j] ** 2)) / (
                    np.linalg.norm(grads[tn_j]) * np.sqrt(1 - rho_t[tn_i, tn_j] ** 2) + 1e-8)
                pc_grads[tn_i] += grads[tn_j] * w
            rho_t[tn_i, tn_j] = (1 - beta) * rho_t[tn_i, tn_j] + beta * rho_ijk
    return pc_grads.sum(0), rho_t


@pytest.mark.parametrize("k", [2, 4])
def test_gradvac_equals_libmtl_current_loop_over_five_steps(k):
    rng = np.random.default_rng(k)
    base = rng.standard_normal((k, 7))
    rho_t, state = np.zeros((k, k)), None
    moved_without_alteration = False
    for step in range(5):
        grads = base + 0.5 * rng.standard_normal(base.shape)
        others = [list(rng.permutation([j for j in range(k) if j != i])) for i in range(k)]
        order = np.array([[i] + others[i] for i in range(k)], np.int32)   # own index: skipped
        want, new_rho = libmtl_gradvac(grads, rho_t, others, beta=0.5)
        got = mh.aggregate(grads, "gradvac", dtype="float64", state=state, order=order)
        np.testing.assert_allclose(got.direction.numpy(), want, rtol=1e-10, atol=1e-12,
                                   err_msg=f"step {step}")
        np.testing.assert_allclose(got.state["rho_T"].numpy(), new_rho, rtol=1e-10, atol=1e-12)
        # The fix matters here: some goal moved where the cosine was at or above it.
        moved_without_alteration |= bool(np.any((new_rho != rho_t) & (new_rho < rho_t)))
        rho_t, state = new_rho, got.state
    assert moved_without_alteration
