"""The embedded MMoE synthetic generator and array -> dataset conversion."""

import numpy as np
import pytest

import multihead as mh
from multihead.datasets.multitask import _task_weights


@pytest.mark.parametrize("k,p", [(2, 0.5), (2, -0.3), (4, 0.8), (3, 1.0)])
def test_task_weight_vectors_have_the_requested_cosine(k, p):
    w = _task_weights(k, 20, p, scale=2.0, rng=np.random.default_rng(0))
    norms = np.linalg.norm(w, axis=1)
    np.testing.assert_allclose(norms, 2.0, rtol=1e-9)  # |w_k| = c
    cos = (w @ w.T) / np.outer(norms, norms)
    np.testing.assert_allclose(cos[~np.eye(k, dtype=bool)], p, atol=1e-9)


def test_two_tasks_follow_the_paper_construction():
    # K = 2: Cholesky of [[1, p], [p, 1]] is [[1, 0], [p, sqrt(1 - p^2)]], so
    # w1 = c u1 and w2 = c (p u1 + sqrt(1 - p^2) u2) as in Ma et al. (2018).
    p, c = 0.3, 1.5
    w = _task_weights(2, 10, p, c, np.random.default_rng(1))
    u1 = w[0] / c
    u2 = (w[1] / c - p * u1) / np.sqrt(1 - p**2)
    assert abs(u1 @ u2) < 1e-9 and abs(np.linalg.norm(u2) - 1) < 1e-9


def test_labels_are_linear_plus_sinusoids_and_reproducible():
    a = mh.mmoe_synthetic(tasks=3, correlation=0.2, train_size=300, eval_size=50, input_dim=8, seed=4)
    b = mh.mmoe_synthetic(tasks=3, correlation=0.2, train_size=300, eval_size=50, input_dim=8, seed=4)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert list(a.y_train) == ["y1", "y2", "y3"]
    assert a.x_train.shape == (300, 8) and a.y_eval["y2"].shape == (50, 1)
    # Without sinusoids and noise, labels are exactly linear in x: least squares fits them.
    lin = mh.mmoe_synthetic(tasks=2, train_size=200, eval_size=1, input_dim=5,
                            num_sinusoids=0, noise_std=0.0)
    coef, residual, *_ = np.linalg.lstsq(lin.x_train, lin.y_train["y1"], rcond=None)
    assert residual[0] < 1e-6
    c = mh.mmoe_synthetic(tasks=3, correlation=0.2, train_size=300, eval_size=50, input_dim=8, seed=5)
    assert not np.array_equal(a.y_train["y1"], c.y_train["y1"])


def test_mixed_variant_binarises_at_the_training_median():
    data = mh.mmoe_synthetic(tasks=["c", "r"], classification=["c"], train_size=1000, eval_size=100)
    assert set(np.unique(data.y_train["c"])) == {0.0, 1.0}
    assert data.y_train["c"].mean() == pytest.approx(0.5, abs=0.01)
    assert data.kinds == {"c": "classification", "r": "regression"}


@pytest.mark.parametrize("kwargs,match", [
    ({"tasks": 3, "correlation": -0.6}, "correlation must be in"),
    ({"tasks": 2, "correlation": 1.5}, "correlation must be in"),
    ({"tasks": 2, "input_dim": 1}, "input_dim"),
    ({"tasks": ["a", "a"]}, "distinct"),
    ({"tasks": 2, "classification": ["zz"]}, "classification names task 'zz'"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mh.mmoe_synthetic(train_size=10, eval_size=2, **kwargs)


def test_as_dataset_batches_and_checks_lengths():
    x = np.zeros((10, 2), "float32")
    ds = mh.as_dataset((x, {"a": np.zeros((10, 1))}), batch_size=4, shuffle=False)
    assert [int(b[0].shape[0]) for b in ds] == [4, 4, 2]
    with pytest.raises(ValueError, match="different numbers of examples"):
        mh.as_dataset((x, {"a": np.zeros((9, 1))}), batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        mh.as_dataset((x, {"a": np.zeros((10, 1))}))


def test_as_dataset_epochs_are_reproducible_permutations():
    x = np.arange(10, dtype="float32")[:, None]
    data = (x, {"a": x * 2})

    def epochs(seed, count=3):
        ds = mh.as_dataset(data, batch_size=4, seed=seed)
        return [np.concatenate([b[0].numpy()[:, 0] for b in ds]) for _ in range(count)]

    first = epochs(seed=0)
    for order in first:  # each epoch: every example exactly once, in batches of 4, 4, 2
        np.testing.assert_array_equal(np.sort(order), np.arange(10))
    assert not np.array_equal(first[0], first[1])  # reshuffled every epoch
    for a, b in zip(first, epochs(seed=0)):
        np.testing.assert_array_equal(a, b)  # the same seed replays the same orders
    assert any(not np.array_equal(a, b) for a, b in zip(first, epochs(seed=1)))
    batch = next(iter(mh.as_dataset(data, batch_size=4, seed=0)))
    np.testing.assert_array_equal(batch[1]["a"].numpy(), batch[0].numpy() * 2)  # rows stay paired
