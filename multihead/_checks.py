"""Argument checks shared by every layer: one rule, one wording.

Each check raises a one-line error that names the argument (or config key
path), shows the bad value and says what is expected; `error` picks the
exception class, so the config raises `ConfigError` and the library
`ValueError` with the same text. Checks run eagerly, at construction or config
load, never inside a traced function.

Example:
    >>> check_int(3, "every", minimum=1)
    3
    >>> check_int(True, "every", minimum=1)
    Traceback (most recent call last):
    ValueError: every: expected an integer, got True (bool)
    >>> check_choice("sequental", "schedule", ("simultaneous", "sequential"))
    Traceback (most recent call last):
    ValueError: schedule: must be one of ['simultaneous', 'sequential'], got 'sequental' (did you mean 'sequential'?)
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
from typing import Any, Iterable, Mapping, Sequence, TypeVar

T = TypeVar("T")


def suggest(name: str, candidates: Iterable[Any]) -> str:
    """` (did you mean 'x'?)` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def describe(value: Any) -> str:
    """The value and its type, for messages about a value of the wrong type: `'5' (str)`."""
    return f"{value!r} ({type(value).__name__})"


def variable_label(var: Any, default: str = "?") -> str:
    """How an error names a variable: its Keras path, else its name, else `default`."""
    return getattr(var, "path", None) or getattr(var, "name", None) or default


def _suffix(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _bounds(minimum: float | None, maximum: float | None, min_open: bool, max_open: bool) -> str:
    if minimum is not None and maximum is not None:
        return f"in {'(' if min_open else '['}{minimum}, {maximum}{')' if max_open else ']'}"
    if minimum is not None:
        return f"{'>' if min_open else '>='} {minimum}"
    return f"{'<' if max_open else '<='} {maximum}"


def check_bounds(value: float, name: str, *, minimum: float | None = None,
                 maximum: float | None = None, min_open: bool = False, max_open: bool = False,
                 hint: str = "", error: type[Exception] = ValueError) -> None:
    """Raises `error` unless `minimum <= value <= maximum` (`<` where the bound is open)."""
    low_ok = minimum is None or (value > minimum if min_open else value >= minimum)
    high_ok = maximum is None or (value < maximum if max_open else value <= maximum)
    if not (low_ok and high_ok):
        raise error(f"{name}: must be {_bounds(minimum, maximum, min_open, max_open)}, "
                    f"got {value!r}{_suffix(hint)}")


def check_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None,
              hint: str = "", error: type[Exception] = ValueError) -> int:
    """`value` as an `int`: an integer (numpy integers included, `bool` not) within the bounds.

    Args:
        value: the value to check.
        name: the argument or key path the message names.
        minimum, maximum: inclusive bounds, or None.
        hint: what to do, appended after `; ` (e.g. `0 disables them`).
        error: the exception class raised.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name}: expected an integer, got {describe(value)}{_suffix(hint)}")
    check_bounds(value, name, minimum=minimum, maximum=maximum, hint=hint, error=error)
    return int(value)


def check_float(value: Any, name: str, *, minimum: float | None = None,
                maximum: float | None = None, min_open: bool = False, max_open: bool = False,
                hint: str = "", error: type[Exception] = ValueError) -> float:
    """`value` as a `float`: a finite real number (integers allowed, `bool`, NaN and inf not)
    within the bounds (closed unless `min_open` / `max_open`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name}: expected a number, got {describe(value)}{_suffix(hint)}")
    if not math.isfinite(value):
        raise error(f"{name}: must be a finite number, got {value!r}{_suffix(hint)}")
    check_bounds(value, name, minimum=minimum, maximum=maximum, min_open=min_open,
                 max_open=max_open, hint=hint, error=error)
    return float(value)


#: A head or objective name: a letter, then letters, digits, `_` or `-`. It becomes a
#: TensorBoard tag, a folder of a run directory (`best/<head>`) and a config key, so no
#: `/`, `.`, whitespace or newline.
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*")


def check_name(name: Any, what: str, *, where: str = "",
               error: type[Exception] = ValueError) -> str:
    """`name` if it is a valid head or objective name (`NAME`, matched whole: a trailing
    newline is refused too); `what` is `head` or `objective`, `where` a key path prefix."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise error(f"{where + ': ' if where else ''}{what} name {name!r} is not allowed: use a "
                    "letter followed by letters, digits, '_' or '-'")
    return name


#: The largest magnitude a float32 label holds; a missing-label marker beyond it cannot be
#: compared with the labels.
FLOAT32_MAX = 3.4028234663852886e38


def check_missing_label(value: Any, name: str, *, error: type[Exception] = ValueError) -> float:
    """A missing-label marker as a float: NaN, or a finite number a float32 label can hold
    (|v| <= 3.4028235e38)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name}: expected nan or a number (the label value that marks a missing "
                    f"label), got {value!r}")
    value = float(value)
    if math.isnan(value):
        return value
    if not -FLOAT32_MAX <= value <= FLOAT32_MAX:
        raise error(f"{name}: must be nan or a number in [-3.4028235e+38, 3.4028235e+38] (labels "
                    f"are float32), got {value!r}; use nan or a value no label takes, e.g. -1")
    return value


def check_finite_numbers(tree: Any, name: str, *, error: type[Exception] = ValueError) -> None:
    """Raises `error` naming the key path of the first NaN or infinite number in a tree of
    mappings and lists (a schedule's config: `name.config.initial_learning_rate`)."""
    stack = [(name, tree)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in reversed(list(node.items())))
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(node))))
        elif isinstance(node, numbers.Real) and not isinstance(node, bool) and \
                not math.isfinite(node):
            raise error(f"{where}: must be a finite number, got {node!r}")


def check_choice(value: T, name: str, choices: Sequence[Any], *, hint: str = "",
                 error: type[Exception] = ValueError) -> T:
    """`value` if it is one of `choices`; else an error listing them, with a "did you mean"."""
    # `True == 1`: a bool is a choice only when the choices hold that very bool.
    found = any(c is value for c in choices) if isinstance(value, bool) else value in choices
    if not found:
        raise error(f"{name}: must be one of {list(choices)}, got {value!r}"
                    f"{suggest(str(value), choices)}{_suffix(hint)}")
    return value


def check_keys(keys: Iterable[Any], known: Sequence[str], path: str = "", *,
               error: type[Exception] = ValueError) -> None:
    """Raises `error` naming the first key not in `known` (`path.key: unknown key`), with a
    "did you mean"."""
    for key in keys:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise error(f"{where}: unknown key{suggest(str(key), known)}")
