"""Where a new run goes when the command line names no directory."""

from __future__ import annotations

import datetime
import os


def default_run_dir(config_path: str, prefix: str = "") -> str:
    """A new directory name under `runs/`: `<prefix><config stem>-<date>-<time>[-n]`."""
    stem = os.path.splitext(os.path.basename(config_path))[0]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join("runs", f"{prefix}{stem}-{stamp}")
    candidate, n = base, 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate
