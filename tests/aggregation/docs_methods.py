"""The two user-defined methods of docs/own-methods.md, loaded from the page itself (its first two
Python blocks), so the tests check exactly what the docs show. Written against the public API only."""

from __future__ import annotations

import functools
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.lru_cache(maxsize=None)
def docs_methods() -> tuple[type, type]:
    """`(NormBalance, FirstLossNormalisation)` as defined in the docs page."""
    with open(os.path.join(ROOT, "docs", "own-methods.md"), encoding="utf-8") as fh:
        blocks = re.findall(r"^```python\n(.*?)^```", fh.read(), re.S | re.M)
    namespace: dict = {"__name__": "docs_own_methods"}
    for code in blocks[:2]:
        exec(compile(code, "docs/own-methods.md", "exec"), namespace)  # noqa: S102
    return namespace["NormBalance"], namespace["FirstLossNormalisation"]
