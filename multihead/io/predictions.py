"""Writing predictions `{head: array}` to a file: `.npz` (one array per head) or `.csv`.

A CSV has one row per example and columns named by head: `y1` for a head with one output
per example, `y1_0`, `y1_1`, ... for a head with several (the output flattened in C order,
so a `(n, 2, 3)` output gives `y1_0` ... `y1_5`). Floats are written with 9 significant
digits, which read back as the same float32 values.

Example:
    >>> import numpy as np
    >>> print(predictions_csv({"y1": np.array([[0.5], [1.0]], "float32"),
    ...                        "p": np.array([[0.25, 0.75], [1.0, 0.0]], "float32")}), end="")
    y1,p_0,p_1
    0.5,0.25,0.75
    1,1,0
"""

from __future__ import annotations

import io
import os
from typing import Mapping

import numpy as np

from multihead._boundary import write_atomic

#: The file kinds `write_predictions` writes, by suffix.
SUFFIXES = (".npz", ".csv")


def csv_columns(head: str, array: np.ndarray) -> list[str]:
    """The CSV column names of one head's output: `head`, or `head_0`, `head_1`, ..."""
    width = int(np.prod(array.shape[1:], dtype=np.int64))
    return [head] if width == 1 else [f"{head}_{i}" for i in range(width)]


def predictions_csv(predictions: Mapping[str, np.ndarray]) -> str:
    """The CSV text of `predictions` (header, then one row per example)."""
    arrays = {head: np.asarray(a) for head, a in predictions.items()}
    rows = len(next(iter(arrays.values())))
    header = [name for head, a in arrays.items() for name in csv_columns(head, a)]
    table = np.concatenate([a.reshape(rows, len(csv_columns(h, a))) for h, a in arrays.items()], axis=1)
    text = "\n".join(",".join(_number(v) for v in row) for row in table.tolist())
    return ",".join(header) + "\n" + (text + "\n" if rows else "")


def _number(value: float | int | bool) -> str:
    if isinstance(value, float):
        return format(value, ".9g")
    return str(int(value))


def write_predictions(path: str | os.PathLike[str], predictions: Mapping[str, np.ndarray]) -> None:
    """Writes `predictions` to `path` atomically, as `.npz` or `.csv` by its suffix.

    Raises:
        ValueError: the suffix is neither `.npz` nor `.csv`.
    """
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".csv":
        write_atomic(path, predictions_csv(predictions))
    elif suffix == ".npz":
        buffer = io.BytesIO()
        np.savez(buffer, **predictions)
        write_atomic(path, buffer.getvalue())
    else:
        raise ValueError(f"{path!r}: predictions are written as {' or '.join(SUFFIXES)}; "
                         "end the name with one of them")
