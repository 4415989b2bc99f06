"""`multihead.io.predictions`: predictions written as .npz or .csv read back as the arrays."""

import csv

import numpy as np
import pytest

from multihead.io.predictions import predictions_csv, write_predictions


def _arrays():
    rng = np.random.default_rng(0)
    return {"y1": rng.standard_normal((5, 1)).astype("float32") * 1e-3,
            "p": rng.standard_normal((5, 3)).astype("float32") * 1e4,
            "img": rng.standard_normal((5, 2, 2)).astype("float32")}


def test_csv_columns_are_named_by_head_and_read_back_as_the_same_float32(tmp_path):
    arrays = _arrays()
    write_predictions(tmp_path / "p.csv", arrays)
    with open(tmp_path / "p.csv", newline="") as fh:
        table = list(csv.reader(fh))
    assert table[0] == ["y1", "p_0", "p_1", "p_2", "img_0", "img_1", "img_2", "img_3"]
    values = np.array(table[1:], dtype=np.float64).astype(np.float32)
    np.testing.assert_array_equal(values[:, :1], arrays["y1"])
    np.testing.assert_array_equal(values[:, 1:4], arrays["p"])
    np.testing.assert_array_equal(values[:, 4:], arrays["img"].reshape(5, 4))  # C order
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1,
                                             dtype=np.float32), values)


def test_npz_holds_one_array_per_head_and_other_suffixes_are_refused(tmp_path):
    arrays = _arrays()
    write_predictions(tmp_path / "p.npz", arrays)
    with np.load(tmp_path / "p.npz") as saved:
        assert saved.files == list(arrays)
        for head, value in arrays.items():
            np.testing.assert_array_equal(saved[head], value)
    with pytest.raises(ValueError, match=r"written as .npz or .csv"):
        write_predictions(tmp_path / "p.txt", arrays)
    assert not (tmp_path / "p.txt").exists()
    assert predictions_csv({"a": np.zeros((0, 2), "float32")}) == "a_0,a_1\n"  # no rows: header only
