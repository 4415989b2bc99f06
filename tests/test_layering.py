"""The package's dependencies point one way.

    _keras_internals, _checks, _autograph, _boundary, settings   (import nothing else of the package)
        <- _records     (TFRecord headers checked: only _boundary)
        <- aggregation, monitoring, datasets
        <- model        (the trunk and heads as Keras layers: never the objectives, step or loop)
        <- objectives   (what each objective reads and trains: never the step or loop)
        <- step         (one compiled update: never the loop, callbacks, io or experiments)
        <- training     (the Python loop and the public model with compile/fit: never io, rl, experiments)
        <- io, rl  <- experiments  <- cli

`multihead/__init__.py` (the public names) and `__main__` sit on top and may import anything.
"""

import ast
import pathlib

import pytest

import multihead

PACKAGE = pathlib.Path(multihead.__file__).parent
RANK = {"_keras_internals": 0, "_checks": 0, "_autograph": 0, "_boundary": 0, "settings": 0, "_records": 0.5,
        "aggregation": 1, "monitoring": 1, "datasets": 1,
        "model": 2, "objectives": 3, "step": 4, "training": 5,
        "io": 6, "rl": 6, "experiments": 7, "cli": 8}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "multihead" and len(parts) > 1 else None


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "multihead":
                found += [(node.lineno, f"multihead.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, m) for line, m in found if m.startswith("multihead.")]


def test_every_module_belongs_to_a_layer():
    for path in PACKAGE.iterdir():
        if path.name.startswith("__") or path.name == "py.typed":
            continue
        assert path.stem in RANK, f"{path.name} is in no layer of tests/test_layering.py"


def test_no_module_imports_upward_or_sideways():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("__init__.py", "__main__.py"):
            continue
        own = rel.parts[0].removesuffix(".py")
        for line, module in _imports(path):
            other = _layer(module)
            if other is None or other == own:
                continue
            if RANK[other] >= RANK[own]:
                bad.append(f"{rel}:{line} ({own}) imports {module} ({other})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_aggregation_package_imports_nothing_else_of_multihead():
    for path in (PACKAGE / "aggregation").rglob("*.py"):
        others = [m for _, m in _imports(path) if not m.startswith("multihead.aggregation")]
        assert not others, f"{path.name} imports {others}"


def _module_names() -> dict[str, pathlib.Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, counting every import statement in it:
    module level, inside functions, under `if TYPE_CHECKING:`, relative or absolute."""
    modules = _module_names()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else known(base)
                    if target:
                        edges.add(target)
            elif isinstance(node, ast.Import):
                edges.update(t for t in (known(a.name) for a in node.names) if t)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# Cycles closed by function-level imports. Listed exactly: the test fails on any new cycle
# and when one of these is gone (then delete its row).
KNOWN_CYCLES: list[list[str]] = []


def test_the_import_graph_has_no_cycle_counting_every_import_statement():
    cycles = sorted(_cycles(_import_graph()))
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    gone = [c for c in KNOWN_CYCLES if c not in cycles]
    assert not new, "import cycles (function-level imports count):\n" + "\n".join(
        " <-> ".join(c) for c in new)
    assert not gone, f"no longer a cycle, delete it from KNOWN_CYCLES: {gone}"


def test_the_cycle_finder_counts_function_level_imports():
    # On graphs written by hand: a -> b -> a is one cycle, a chain is none.
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    # On the package: the config schema reads YAML through an import inside a function.
    schema = (PACKAGE / "experiments" / "config" / "schema.py").read_text()
    assert "    from multihead.experiments.config.yaml12 import" in schema
    assert "multihead.experiments.config.yaml12" in _import_graph()["multihead.experiments.config.schema"]


def test_the_cli_is_on_top_nothing_in_the_package_imports_it():
    graph = _import_graph()
    importers = sorted(m for m, edges in graph.items()
                       if not m.startswith("multihead.cli") and m != "multihead.__main__"
                       and any(e == "multihead.cli" or e.startswith("multihead.cli.") for e in edges))
    assert not importers, f"modules importing multihead.cli: {importers}"
    assert "multihead.cli.main" in graph["multihead.__main__"]
    setup = (PACKAGE.parent / "setup.py").read_text()
    assert '"multihead = multihead.cli.main:run"' in setup


def _string_constants(node: ast.AST) -> list[str]:
    """The string constants a comparison operand is or contains (`x in ("a", "b")`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _string_constants(e)]
    return []


CENTRE = ("model", "objectives", "step", "training")


@pytest.mark.parametrize("layer,never", [
    ("model", ("objectives", "step", "training", "io", "rl", "experiments", "cli")),
    ("objectives", ("step", "training", "io", "rl", "experiments", "cli")),
    ("step", ("training", "io", "rl", "experiments", "cli")),
    ("training", ("io", "rl", "experiments", "cli")),
    ("datasets", CENTRE),
    ("monitoring", CENTRE),
])
def test_each_part_of_the_centre_never_imports_what_sits_above_it(layer, never):
    """Counting every import statement (function-level and TYPE_CHECKING ones too)."""
    graph = _import_graph()
    bad = sorted(f"{m} imports {e}" for m, edges in graph.items()
                 if m == f"multihead.{layer}" or m.startswith(f"multihead.{layer}.")
                 for e in edges if any(e == f"multihead.{n}" or e.startswith(f"multihead.{n}.") for n in never))
    assert not bad, bad


def test_centre_never_compares_a_method_name_to_a_string():
    """The centre asks what an aggregation method is (its base, its capabilities), never what it is
    called: no `==`, `!=`, `in` or `not in` against the name of a registered method."""
    from multihead.aggregation import AGGREGATORS, LOSS_WEIGHTINGS

    names = set(AGGREGATORS) | set(LOSS_WEIGHTINGS)
    found = []
    for path in sorted(p for layer in CENTRE for p in (PACKAGE / layer).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for text in (s for o in operands for s in _string_constants(o)):
                if text in names:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text!r}")
    assert not found, found
