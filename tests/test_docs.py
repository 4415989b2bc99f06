"""README.md and docs/ stay true: their Python blocks run, their configs load, their links resolve,
the API reference lists every public name, and README's two commands are CI's.

Snippet convention (README.md and every docs/*.md page):
- Every fenced ```python block runs, in page order, in one namespace per page (a page reads like
  a notebook: a block may use names an earlier block of the same page defined), in a fresh
  temporary working directory, so files a block writes (`runs/...`, `ckpt/...`) go nowhere else.
- A block whose fence is preceded, on the line just before it, by an HTML comment starting with
  `<!-- no-run` (say why: `<!-- no-run: needs a TF1 checkpoint -->`) is shown but not run.
- A block preceded by `<!-- requires: MODULE -->` (an optional extra such as gymnasium) runs only
  when MODULE imports; otherwise the rest of that page is skipped.
  Both comments are invisible on GitHub and in the built site.
- Pages whose runnable blocks are the same (README's API example is also docs/api.md's) run once.
- A block that trains uses few steps: the whole file stays well under a minute.
- ```yaml blocks with a top-level `model:` key are whole experiment configs and must load; other
  ```yaml blocks are fragments, loaded merged into `experiments/quickstart.yaml`.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import linecache
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGES = ["README.md"] + sorted(f"docs/{name}" for name in os.listdir(DOCS) if name.endswith(".md"))

_BLOCK = re.compile(r"(?:^(<!--[^\n]*-->)\n)?^```(\w+)\n(.*?)^```[ \t]*$", re.S | re.M)


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        return fh.read()


def _blocks(page: str, lang: str) -> list[tuple[str, str]]:
    """`(marker comment or "", code)` of each block of `lang` in `page`, in order."""
    return [(marker or "", code) for marker, kind, code in _BLOCK.findall(_read(page)) if kind == lang]


def _runnable(page: str) -> tuple[tuple[str, str], ...]:
    return tuple((m, c) for m, c in _blocks(page, "python") if not m.startswith("<!-- no-run"))


def _snippet_cases() -> list:
    cases, seen = [], {}
    for page in PAGES:
        blocks = _runnable(page)
        if not blocks:
            continue
        if blocks in seen:  # the same example on two pages runs once
            seen[blocks].append(page)
            continue
        seen[blocks] = [page]
        cases.append(blocks)
    return [pytest.param(page_list[0], blocks, id="+".join(page_list))
            for blocks, page_list in seen.items()]


def _source_name(page: str, code: str) -> str:
    """A file name under which `code` is in linecache, so tracebacks show the block's lines and
    autograph converts its functions (it reads their source) as it would in a script."""
    name = f"{os.path.join(ROOT, page)}:block-{abs(hash(code)):x}"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    return name


@pytest.mark.parametrize("page, blocks", _snippet_cases())
def test_python_blocks_run(page, blocks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_snippet"}
    for marker, code in blocks:
        required = re.match(r"<!--\s*requires:\s*([\w.]+)", marker)
        if required and importlib.util.find_spec(required.group(1)) is None:
            pytest.skip(f"{page}: needs {required.group(1)}")
        exec(compile(code, _source_name(page, code), "exec"), namespace)  # noqa: S102 - our own docs
    _CHECKS.get(page, lambda ns: None)(namespace)


def _check_readme(ns: dict) -> None:
    assert set(ns["history"].train) == {"y1", "y2"}


def _check_aggregation(ns: dict) -> None:
    assert int(ns["trainer"].trunk_optimizer.iterations) == 200  # one trunk Adam, 200 fit steps
    assert ns["trainer"].trunk_update.policy.aggregator == "pcgrad"


def _check_rl(ns: dict) -> None:
    assert ns["updated"] == [("q1", "q2", "actor"), ("q1", "q2")]  # TD3's actor: every: 2


# Facts a page's blocks state in comments, checked on the namespace they leave.
_CHECKS = {"README.md": _check_readme, "docs/aggregation.md": _check_aggregation,
           "docs/rl.md": _check_rl}


def test_every_page_has_a_runnable_block_or_says_why_not():
    # Pages of prose and shell commands only are fine; a page with Python but nothing runnable
    # would silently go stale, so every skipped block carries its reason.
    for page in PAGES:
        for marker, _ in _blocks(page, "python"):
            if marker.startswith("<!-- no-run"):
                assert re.match(r"<!-- no-run: \S", marker), f"{page}: say why in {marker!r}"


def _merge(base: dict, fragment: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in fragment.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def test_yaml_blocks_are_valid_configs():
    from multihead.experiments.config.schema import from_dict, parse_yaml

    with open(os.path.join(ROOT, "experiments", "quickstart.yaml"), encoding="utf-8") as fh:
        base = parse_yaml(fh.read(), "experiments/quickstart.yaml")
    assert any("model" in parse_yaml(code) for _, code in _blocks("README.md", "yaml")), \
        "README has no config example"
    for page in PAGES:
        for _, code in _blocks(page, "yaml"):
            raw = parse_yaml(code, page)
            from_dict(raw if "model" in raw else _merge(base, raw), f"{page}: {code[:40]!r}...")


def test_links_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", _read(page)):
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
            assert os.path.exists(path), f"{page} links to missing {target}"


def test_every_page_is_in_the_site_nav():
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as fh:
        nav = yaml.safe_load(fh)["nav"]
    in_nav = {list(entry.values())[0] for entry in nav}
    assert in_nav == {page.removeprefix("docs/") for page in PAGES if page.startswith("docs/")}


def test_reference_lists_every_public_name():
    with open(os.path.join(ROOT, "multihead", "__init__.py"), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    public = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", None) == "__all__" for t in node.targets))
    reference = _read("docs/reference.md")
    rendered = set(re.findall(r"^::: multihead\.(\w+)$", reference, re.M))
    described = {name for name in public if f"`mh.{name}`" in reference}
    assert set(public) - rendered - described == set(), "names of mh.__all__ missing from the reference"
    assert rendered - set(public) == set(), "the reference renders names that are not public"


def test_top_commands_match_ci():
    commands = [code.strip() for _, code in _blocks("README.md", "bash")]
    # the first installs only what the main job needs: no extra, so none of the test extras
    assert commands[0] == ("python3 -m venv .venv && .venv/bin/pip install -e . "
                           "&& .venv/bin/multihead train experiments/quickstart.yaml")
    assert commands[1].startswith('.venv/bin/pip install -e ".[test]" && ')
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        ci_lines = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    assert ci_lines[-1] == commands[1]  # CI runs exactly README's test command, last
