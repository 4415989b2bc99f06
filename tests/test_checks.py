"""The shared argument checks: what passes, and the one-line message of what does not."""

import math

import numpy as np
import pytest

from multihead._checks import (check_bounds, check_choice, check_float, check_int, check_keys,
                               describe, suggest, variable_label)


class _Custom(ValueError):
    pass


def test_check_int_accepts_integers_within_bounds():
    assert check_int(3, "n", minimum=1) == 3
    assert check_int(np.int64(4), "n", minimum=0, maximum=4) == 4
    assert type(check_int(np.int64(4), "n")) is int
    assert check_int(-7, "n") == -7  # no bounds


@pytest.mark.parametrize("value, kwargs, message", [
    (True, {}, "n: expected an integer, got True (bool)"),
    (2.0, {}, "n: expected an integer, got 2.0 (float)"),
    ("3", {}, "n: expected an integer, got '3' (str)"),
    (0, {"minimum": 1}, "n: must be >= 1, got 0"),
    (5, {"minimum": 0, "maximum": 4}, "n: must be in [0, 4], got 5"),
    (5, {"maximum": 4}, "n: must be <= 4, got 5"),
    (-1, {"minimum": 0, "hint": "0 disables it"}, "n: must be >= 0, got -1; 0 disables it"),
])
def test_check_int_rejects_with_one_line_naming_the_argument(value, kwargs, message):
    with pytest.raises(ValueError) as err:
        check_int(value, "n", **kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -math.inf, np.float32("nan")])
def test_check_float_rejects_nan_and_inf(value):
    with pytest.raises(ValueError, match=r"^x: must be a finite number, got"):
        check_float(value, "x")


def test_check_float_bounds_and_types():
    assert check_float(1, "x") == 1.0 and type(check_float(1, "x")) is float
    assert check_float(np.float32(0.5), "x", minimum=0.0, maximum=1.0, max_open=True) == 0.5
    with pytest.raises(ValueError, match=r"^x: expected a number, got False \(bool\)$"):
        check_float(False, "x")
    with pytest.raises(ValueError, match=r"^x: must be in \(0, 1\], got 0$"):
        check_float(0, "x", minimum=0, maximum=1, min_open=True)
    with pytest.raises(ValueError, match=r"^x: must be > 0, got 0.0$"):
        check_float(0.0, "x", minimum=0, min_open=True)
    check_bounds(1.0, "x", minimum=0.0, maximum=1.0)  # closed bounds include the ends


def test_error_class_is_the_callers():
    with pytest.raises(_Custom, match="^a.b: must be >= 1, got 0$"):
        check_int(0, "a.b", minimum=1, error=_Custom)
    with pytest.raises(_Custom):
        check_choice("z", "k", ("a",), error=_Custom)
    with pytest.raises(_Custom, match=r"^a.unit: unknown key \(did you mean 'units'\?\)$"):
        check_keys({"units": 1, "unit": 2}, ("units",), "a", error=_Custom)


def test_check_choice_suggests_the_closest_choice():
    assert check_choice("sequential", "schedule", ("simultaneous", "sequential")) == "sequential"
    with pytest.raises(ValueError) as err:
        check_choice("sequental", "schedule", ("simultaneous", "sequential"))
    assert str(err.value) == ("schedule: must be one of ['simultaneous', 'sequential'], got "
                              "'sequental' (did you mean 'sequential'?)")
    with pytest.raises(ValueError, match=r"got 'zzz'$"):  # nothing close: no suggestion
        check_choice("zzz", "schedule", ("simultaneous", "sequential"))
    with pytest.raises(ValueError):  # True == 1, but True is not the choice 1
        check_choice(True, "rescale", (0, 1, 2))
    assert check_choice(1, "rescale", (0, 1, 2)) == 1


def test_check_keys_without_a_path_names_the_key():
    check_keys({"a": 1}, ("a", "b"))
    with pytest.raises(ValueError, match=r"^c: unknown key$"):
        check_keys({"c": 1}, ("a", "b"))


def test_helpers():
    assert suggest("optimzer", ["optimizer", "loss"]) == " (did you mean 'optimizer'?)"
    assert suggest("x", []) == ""
    assert describe([1]) == "[1] (list)"

    class Var:
        path = "model/dense/kernel"
        name = "kernel"

    class Named:
        name = "bias"

    assert variable_label(Var()) == "model/dense/kernel"
    assert variable_label(Named()) == "bias"
    assert variable_label(object(), "the variable") == "the variable"
