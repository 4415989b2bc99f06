"""Fuzzing `multihead validate` / `train`: a fixed corpus of mutations of every shipped config
(delete, rename, wrong type, edge numbers, YAML structure) and Hypothesis strategies over the
config schema.

Each case calls the CLI's `main()` in-process and asserts: exit 0 or 2; on 2, exactly one
stderr line `multihead: error: ...` naming a key path (or the YAML line); never a traceback
(an exception escaping `main`); no case longer than `CASE_LIMIT_S` (a SIGALRM, a hang
detector, not a timing assertion: the bound is far above what a case needs); no file
written outside the case's temp directory; no `validate` case using more than `CPU_LIMIT_S`
of CPU time (a SIGVTALRM: CPU time, so six test processes sharing two cores do not trip it,
while a loop that never ends does). Mutations that are invalid by construction
(an unknown key, a scalar where a mapping is required, broken YAML) must give exit 2. A
sample of the configs that validate trains 2 steps. The fast suite runs a few hundred
cases; `pytest -m slow` runs thousands.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import glob
import io
import os
import random
import re
import signal
import typing
from typing import Any, Iterator

import pytest
from multihead.experiments.config import schema as config_module
from multihead.experiments.run import runner  # noqa: F401 - TensorFlow imported before any case's clock
from multihead.cli.main import main
from multihead.experiments.config.yaml12 import dump_yaml, load_yaml

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

SHIPPED = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "*.yaml")))
CASE_LIMIT_S = 10
CPU_LIMIT_S = 5
#: Keys whose value sizes the run: kept small so a valid case builds fast.
SMALL = {"train_size": 64, "eval_size": 16, "input_dim": 6, "steps": 2, "batch_size": 8,
         "buffer_size": 64, "learning_starts": 1, "eval_episodes": 1, "num_envs": 2, "n_steps": 4,
         "n_epochs": 1}
#: A key path the error names: `train.steps`, `model.heads.y1.metrics[0]`, `--set '...'`, or a
#: YAML position.
_NAMES_A_KEY = re.compile(r"^([A-Za-z_][\w\-]*(\[\d+\])*([./][\w\-]+(\[\d+\])*)*: |--set '|invalid YAML: .*line \d+|"
                          r"invalid YAML: |not UTF-8|the config must be a mapping)")


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: int, cpu_seconds: float | None = None) -> Iterator[None]:
    def alarm(signum: int, frame: Any) -> None:
        raise _Hang(f"a case ran past {seconds} s")

    def cpu_alarm(signum: int, frame: Any) -> None:
        raise _Hang(f"a case used more than {cpu_seconds} s of CPU time")

    previous = signal.signal(signal.SIGALRM, alarm)
    previous_cpu = signal.signal(signal.SIGVTALRM, cpu_alarm)
    signal.alarm(seconds)
    if cpu_seconds is not None:
        signal.setitimer(signal.ITIMER_VIRTUAL, cpu_seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        signal.signal(signal.SIGVTALRM, previous_cpu)


def _small(tree: Any) -> Any:
    """The config with its size keys shrunk (so a valid case builds and trains quickly)."""
    if isinstance(tree, dict):
        return {k: (SMALL[k] if k in SMALL and isinstance(v, int) and not isinstance(v, bool)
                    and v > SMALL[k] else _small(v)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_small(v) for v in tree]
    return tree


def _load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return _small(load_yaml(fh.read()))


def _run(tmp_path, text: str | bytes, command: str = "validate", sets=()) -> tuple[int, str]:
    """(exit code, stderr) of `multihead COMMAND` on `text`; asserts the universal facts."""
    path = tmp_path / "case.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    before = set(os.listdir(tmp_path))
    args = [command, str(path), *[f"--set={s}" for s in sets]]
    if command == "train":
        args += ["--run-dir", str(tmp_path / "run"), "--quiet"]
    else:  # everything train runs before its first step
        args.append("--build")
    err, out = io.StringIO(), io.StringIO()
    # train: the CPU bound is the hang detector; the wall bound only catches a blocked wait
    with _time_limit(CASE_LIMIT_S if command == "validate" else 30 * CASE_LIMIT_S,
                     CPU_LIMIT_S if command == "validate" else 6 * CASE_LIMIT_S), \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(args)  # an exception escaping here is the traceback a user would see
    stderr = err.getvalue()
    assert code in (0, 2), (code, stderr)
    if code == 2:
        lines = stderr.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("multihead: error: "), stderr
        rest = lines[0][len("multihead: error: "):]
        rest = rest[len(str(path)) + 2:] if rest.startswith(f"{path}: ") else rest
        assert _NAMES_A_KEY.match(rest), rest
    after = set(os.listdir(tmp_path)) - {"run"}
    assert after == before, after ^ before  # nothing written beside the config
    return code, stderr


# -- the corpus -----------------------------------------------------------------------------


def _paths(tree: Any, prefix: tuple = ()) -> Iterator[tuple]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _parent(tree: Any, path: tuple) -> Any:
    for key in path[:-1]:
        tree = tree[key]
    return tree


def _delete(tree, path):
    parent = _parent(tree, path)
    del parent[path[-1]]


def _rename(tree, path):
    parent = _parent(tree, path)
    if isinstance(parent, dict):
        parent[f"{path[-1]}_typo"] = parent.pop(path[-1])


def _replace(value):
    def mutate(tree, path):
        _parent(tree, path)[path[-1]] = copy.deepcopy(value)
    return mutate


EDGE_NUMBERS = [0, -1, 1, 2**31, 2**63, -(2**40), 1e-300, 1e300, float("nan"), float("inf"),
                float("-inf"), 0.5, True]
WRONG_TYPES = ["abc", [], [1, "x"], {"bogus": 1}, None, ""]

def _multiplied_layers(levels: int) -> str:
    text = "&l0 {class_name: Dense, config: {units: 2}}"
    for i in range(1, levels + 1):
        text = f"&l{i} [" + text + ", " + ", ".join([f"*l{i - 1}"] * 9) + "]"
    return text


def _with_trunk(text: str, flow: str) -> str:
    """The config with `model.trunk` replaced by the YAML flow text `flow`."""
    tree = load_yaml(text)
    tree["model"]["trunk"] = "TRUNK_PLACEHOLDER"
    return dump_yaml(tree).replace("TRUNK_PLACEHOLDER", flow, 1)


#: YAML text mutations: each makes the document invalid, so each must give exit 2.
STRUCTURE = [
    ("unclosed flow", lambda t: t + "\nbroken: [1, 2\n"),
    ("tab indentation", lambda t: t + "\ntrain:\n\tsteps: 3\n"),
    ("duplicate top key", lambda t: t + "\nseed: 7\n"),
    ("a list at the top", lambda t: "- " + t.replace("\n", "\n  ")),
    ("a scalar at the top", lambda t: "just text\n"),
    ("deep nesting", lambda t: t + "\nx: " + "[" * 200 + "]" * 200 + "\n"),
    ("alias bomb", lambda t: t + "\n" + "\n".join(
        ["b0: &b0 [x, x, x, x, x, x, x, x, x]"]
        + [f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 9) + "]" for i in range(1, 10)]) + "\n"),
    ("python tag", lambda t: t + "\nx: !!python/object/apply:os.system ['true']\n"),
    ("bad int tag", lambda t: t + "\nseed: !!int abc\n"),
    ("not UTF-8", lambda t: t.encode() + b"\n# \xff\xfe\n"),
    ("unknown anchor", lambda t: t + "\nx: *nowhere\n"),
    ("unknown top key", lambda t: t + "\nmodle: {}\n"),
    ("recursive alias", lambda t: t + "\nx: &loop [1, *loop]\n"),
    ("recursive mapping alias", lambda t: t + "\nx: &loop {a: {b: *loop}}\n"),
    # 10**4 Dense layers from a few hundred bytes: under the YAML node bound, far beyond a model's
    ("layer lists multiplied through aliases", lambda t: _with_trunk(t, _multiplied_layers(4))),
]


def _set(path: str, value: Any, needs: str | None = None):
    """A mutation setting the dotted `path` (created as needed) to `value`; applies only when
    the config has `needs` (a dotted path), else returns None."""
    def mutate(tree: dict) -> dict | None:
        node = tree
        for key in (needs or "").split(".") if needs else ():
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        tree = copy.deepcopy(tree)
        node = tree
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = copy.deepcopy(value)
        return tree
    return mutate


def _first_head(tree: dict) -> str:
    return next(iter(tree["model"]["heads"]))


def _mmoe(tree: dict) -> bool:
    return (tree.get("data") or {}).get("kind", "mmoe") in ("mmoe", "mixed") and \
        tree.get("task", "supervised") == "supervised"


def _head_mutation(key: str, value: Any, when=lambda tree: True):
    def mutate(tree: dict) -> dict | None:
        if not when(tree):
            return None
        tree = copy.deepcopy(tree)
        tree["model"]["heads"][_first_head(tree)][key] = copy.deepcopy(value)
        return tree
    return mutate


#: Values every config must refuse (issue 26's "accepted although invalid"), applied where the
#: config has the section: each must give exit 2.
RANGES = [
    ("dqn.gamma 1e30", _set("dqn.gamma", 1e30, needs="dqn")),
    ("actor_critic.gamma 1.5", _set("actor_critic.gamma", 1.5, needs="actor_critic")),
    ("actor_critic.entropy_coef 1e30", _set("actor_critic.entropy_coef", 1e30, needs="actor_critic")),
    ("actor_critic.num_envs 2**30", _set("actor_critic.num_envs", 2**30, needs="actor_critic")),
    ("data.scale 1e30", lambda t: _set("data.scale", 1e30)(t) if _mmoe(t) else None),
    ("an extra data.tasks entry", lambda t: _set("data.tasks", list(t["model"]["heads"]) + ["extra"])(t)
     if _mmoe(t) and len(t["model"]["heads"]) > 1 else None),
    ("clipnorm < 0", _head_mutation("optimizer", {"class_name": "SGD", "config": {"clipnorm": -1.0}})),
    ("clipvalue 0", _head_mutation("optimizer", {"class_name": "Adam", "config": {"clipvalue": 0}})),
    ("sparse cross-entropy on regression labels",
     _head_mutation("loss", "sparse_categorical_crossentropy", when=_mmoe)),
    ("a layer of 10**7 units after one of 10**4",
     _head_mutation("layers", [{"class_name": "Dense", "config": {"units": 10**4}},
                               {"class_name": "Dense", "config": {"units": 10**7}}])),
    ("aggregator option 1e30", lambda t: _set("train.trunk.options", {"gamma": 1e30})(t)
     if isinstance((t.get("train") or {}).get("trunk"), dict) else None),
]


def _cases(n_per_config: int, seed: int) -> list[tuple[str, str, str, Any, bool]]:
    """(config name, mutation kind, description, text, must_fail)."""
    rng = random.Random(seed)
    out = []
    for path in SHIPPED:
        name = os.path.basename(path)
        base = _load(path)
        text = dump_yaml(base)
        keys = list(_paths(base))
        for label, mutate in STRUCTURE:
            if rng.random() < n_per_config / 40:
                out.append((name, "structure", label, mutate(text), True))
        for label, mutate in RANGES:
            mutated = mutate(base)
            if mutated is not None:
                out.append((name, "range", label, dump_yaml(mutated), True))
        picks = [("delete", _delete, False), ("rename", _rename, True)]
        picks += [(f"edge {v!r}", _replace(v), False) for v in EDGE_NUMBERS]
        picks += [(f"type {v!r}", _replace(v), isinstance(v, dict)) for v in WRONG_TYPES]
        numeric = [k for k in keys if _is_number(_parent(base, k)[k[-1]])]
        for i in range(n_per_config):
            # Every other case an edge number on a numeric leaf: the likeliest to pass validation.
            if i % 2 and numeric:
                where = rng.choice(numeric)
                kind, mutate, must_fail = rng.choice(picks[2:2 + len(EDGE_NUMBERS)])
            else:
                where = rng.choice(keys)
                kind, mutate, must_fail = rng.choice(picks)
            tree = copy.deepcopy(base)
            parent = _parent(tree, where)
            if kind == "rename" and not isinstance(parent, dict):
                continue
            mutate(tree, where)
            original = _parent(base, where)[where[-1]]
            if kind == "rename":  # a field name renamed is an unknown key; a head name is a name
                must_fail = dataclasses.is_dataclass(_schema_type(where[:-1]))
            elif must_fail:  # a mapping in place of a scalar the schema types
                must_fail = not isinstance(original, (dict, list)) and \
                    _schema_type(where) not in (typing.Any, None)
            out.append((name, kind, ".".join(map(str, where)), dump_yaml(tree), must_fail))
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _schema_type(path: tuple) -> Any:
    """The schema's type at `path` (a dataclass, a concrete type, `typing.Any` for free-form
    or multi-type values), or None when `path` leaves the schema."""
    import types

    cls: Any = config_module.ExperimentConfig
    for key in path:
        if typing.get_origin(cls) is dict:
            cls = typing.get_args(cls)[1]
            continue
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return None
        hints = typing.get_type_hints(cls)
        if key not in hints:
            return None
        cls = hints[key]
        if typing.get_origin(cls) in (typing.Union, types.UnionType):
            options = [o for o in typing.get_args(cls) if o is not type(None)]
            cls = options[0] if len(options) == 1 else typing.Any
    return cls


def _check_corpus(tmp_path, cases, train_every: int, max_trains: int = 1000) -> dict[str, int]:
    counts = {"cases": 0, "valid": 0, "trained": 0}
    for i, (name, kind, where, text, must_fail) in enumerate(cases):
        case_dir = tmp_path / f"case{i}"
        case_dir.mkdir()
        code, err = _run(case_dir, text)
        counts["cases"] += 1
        if must_fail:
            assert code == 2, f"{name}: {kind} at {where} was accepted"
        if code == 0:
            counts["valid"] += 1
            # A sample of the valid supervised ones trains 2 steps (an RL run's final greedy
            # evaluation plays whole episodes: the slow suite trains those).
            supervised = load_yaml(text).get("task", "supervised") == "supervised"
            if counts["valid"] % train_every == 1 and (supervised or train_every > 10) and \
                    counts["trained"] < max_trains:
                code, err = _run(case_dir, text, "train", sets=["train.steps=2"])
                assert code == 0, f"{name}: {kind} at {where} validated but did not train: {err}"
                counts["trained"] += 1
    return counts


def test_the_shipped_configs_validate():
    assert len(SHIPPED) >= 10
    for path in SHIPPED:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["validate", path, "--build"]) == 0, path


def test_structure_mutations_are_all_refused(tmp_path):
    text = dump_yaml(_load(SHIPPED[0]))
    for label, mutate in STRUCTURE:
        case_dir = tmp_path / label.replace(" ", "_")
        case_dir.mkdir()
        code, err = _run(case_dir, mutate(text))
        assert code == 2, (label, err)


def test_out_of_range_values_are_refused_in_every_config_that_has_them(tmp_path):
    """Each of `RANGES` at least once, in every shipped config where it applies."""
    applied = set()
    for path in SHIPPED:
        base = _load(path)
        for label, mutate in RANGES:
            mutated = mutate(base)
            if mutated is None:
                continue
            case_dir = tmp_path / f"{os.path.basename(path)}-{len(applied)}-{label.replace(' ', '_')}"
            case_dir.mkdir()
            code, err = _run(case_dir, dump_yaml(mutated))
            assert code == 2, (path, label)
            applied.add(label)
    assert applied == {label for label, _ in RANGES}


def test_a_corpus_of_mutations_of_every_shipped_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path the CLI might write to would land here
    counts = _check_corpus(tmp_path, _cases(n_per_config=9, seed=0), train_every=3,
                           max_trains=2)
    assert counts["cases"] >= 110 and counts["trained"] >= 2, counts
    assert not os.path.exists(os.path.join(os.path.dirname(__file__), "..", "..", "runs", "case"))


@pytest.mark.slow
def test_thousands_of_mutations_of_every_shipped_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    counts = _check_corpus(tmp_path, _cases(n_per_config=200, seed=1), train_every=50)
    assert counts["cases"] >= 2000, counts


# -- Hypothesis over the schema -------------------------------------------------------------


def _leaf_fields(cls: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for field in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[field.name]
        path = f"{prefix}{field.name}"
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out += _leaf_fields(hint, path + ".")
        else:
            out.append((path, hint))
    return out


FIELDS = [(p, h) for p, h in _leaf_fields(config_module.ExperimentConfig)
          if not p.startswith(("model.", "distribute."))]  # model: the corpus; distribute: devices
VALUES = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, 1, 2, -1, 2**31 - 1, 2**31, 2**32]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(),
    st.text(alphabet="abcxyz_:-01 ", max_size=8),
    st.sampled_from(["yes", "no", "010", "1:30", "auto", "per_head", "mmoe", "none", "0x1f",
                     "2020-01-01", "~", "[]", "{}"]),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
)
BASE = dump_yaml(_small({
    "seed": 0, "data": {"kind": "mmoe", "train_size": 64, "eval_size": 16, "input_dim": 6},
    "model": {"trunk": {"mlp": {"units": [4]}},
              "heads": {"y1": {"loss": "mse"}, "y2": {"loss": "mae", "metrics": ["mae"]}}},
    "train": {"steps": 2, "batch_size": 8}}))


def _overrides():
    return st.lists(st.tuples(st.sampled_from([p for p, _ in FIELDS]), VALUES), min_size=1,
                    max_size=3)


def _check_overrides(tmp_path_factory, overrides) -> None:
    case_dir = tmp_path_factory.mktemp("h")
    sets = [f"{path}={dump_yaml(value).strip().removesuffix('...').strip()}"
            for path, value in overrides]
    path = case_dir / "case.yaml"
    path.write_text(BASE)
    err, out = io.StringIO(), io.StringIO()
    with _time_limit(CASE_LIMIT_S, CPU_LIMIT_S), contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(out):
        code = main(["validate", str(path), "--build", *[f"--set={s}" for s in sets]])
    assert code in (0, 2), err.getvalue()
    if code == 2:
        lines = err.getvalue().strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("multihead: error: "), err.getvalue()
    assert sorted(os.listdir(case_dir)) == ["case.yaml"]


@hypothesis.settings(max_examples=60, deadline=None, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(overrides=_overrides())
def test_schema_overrides_validate_or_fail_in_one_line(tmp_path_factory, overrides):
    _check_overrides(tmp_path_factory, overrides)


@pytest.mark.slow
@hypothesis.settings(max_examples=2000, deadline=None, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(overrides=_overrides())
def test_thousands_of_schema_overrides(tmp_path_factory, overrides):
    _check_overrides(tmp_path_factory, overrides)
