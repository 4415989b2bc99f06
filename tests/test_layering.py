"""The package's dependencies point one way.

    aggregation, monitoring  (import nothing else of the package but _keras_internals)
        <- core  <- io, rl  <- experiments

`multihead/__init__.py` (the public names) and `__main__` sit on top and may import anything.
"""

import ast
import pathlib

import multihead

PACKAGE = pathlib.Path(multihead.__file__).parent
RANK = {"_keras_internals": 0, "_checks": 0, "aggregation": 1, "monitoring": 1, "core": 2, "io": 3, "rl": 3,
        "experiments": 4}


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


def _string_constants(node: ast.AST) -> list[str]:
    """The string constants a comparison operand is or contains (`x in ("a", "b")`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _string_constants(e)]
    return []


def test_core_never_compares_a_method_name_to_a_string():
    """Core asks what an aggregation method is (its base, its capabilities), never what it is
    called: no `==`, `!=`, `in` or `not in` against the name of a registered method."""
    from multihead.aggregation import AGGREGATORS, LOSS_WEIGHTINGS

    names = set(AGGREGATORS) | set(LOSS_WEIGHTINGS)
    found = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for text in (s for o in operands for s in _string_constants(o)):
                if text in names:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text!r}")
    assert not found, found
