"""Griffe extension for the API reference: two Google-docstring forms griffe's parser does not read.

- `Example:` (the Google style guide's singular heading) is read as `Examples:`, so its `>>>`
  lines render as code; griffe would otherwise render them as a plain-text admonition.
- `a, b: description` in an `Args:` section documents `a` and `b` alike; it is split into one
  entry per name, each with that description, so every parameter is matched to the signature.

Only the text griffe parses is changed; the docstrings in `multihead/` are read as written.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SECTION = re.compile(r"^\S.*:\s*$")
_SHARED_ARG = re.compile(r"^(\s+)(\w+(?:,\s*\w+)+):(.*)$")


def _rewrite(text: str) -> str:
    out, in_args = [], False
    for line in text.splitlines():
        if _SECTION.match(line):
            in_args = line.strip() in ("Args:", "Arguments:", "Parameters:")
            if line.rstrip() == "Example:":
                line = "Examples:"
        elif line and not line[0].isspace():
            in_args = False
        shared = _SHARED_ARG.match(line) if in_args else None
        if shared and len(shared.group(1)) == 4:
            indent, names, rest = shared.groups()
            out.extend(f"{indent}{name.strip()}:{rest}" for name in names.split(","))
            continue
        out.append(line)
    return "\n".join(out)


class GoogleForms(griffe.Extension):
    """Rewrites the two forms above in every docstring before it is parsed."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj.docstring.value)
