"""The config key reference in docs/configs.md lists every key of the schema, as the generator
`multihead.experiments.config.reference` writes it from the schema's dataclasses."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import pytest

from multihead.experiments.config import reference, schema
from multihead.experiments.config.fields import field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS_MD = os.path.join(ROOT, "docs", "configs.md")


def _documented_paths() -> list[str]:
    """The key paths of the table in docs/configs.md, read from the Markdown."""
    with open(CONFIGS_MD, encoding="utf-8") as fh:
        text = fh.read()
    block = text[text.index(reference.BEGIN):text.index(reference.END)]
    return re.findall(r"^\| `([^`]+)` \|", block, flags=re.MULTILINE)


def test_the_reference_in_docs_is_what_the_schema_generates():
    with open(CONFIGS_MD, encoding="utf-8") as fh:
        text = fh.read()
    assert reference.replace_block(text, reference.render()) == text, (
        "docs/configs.md is stale: run python -m multihead.experiments.config.reference "
        "--write docs/configs.md")


def test_every_field_of_every_config_section_is_a_documented_key():
    paths = set(_documented_paths())
    sections = [c for c in vars(schema).values() if isinstance(c, type)
                and dataclasses.is_dataclass(c) and c.__module__.startswith("multihead.experiments.config.")]
    assert schema.TrunkConfig in sections and schema.ReduceLROnPlateauConfig in sections
    for section in sections:
        names = [f.name for f in dataclasses.fields(section)]
        if section is schema.ExperimentConfig:
            assert set(names) <= paths
            continue
        # some key path P holds the section: every field is documented as P.<field>
        # (P[i].<field> for a list entry)
        holders = {p.rsplit(".", 1)[0] for p in paths if "." in p and p.rsplit(".", 1)[1] == names[0]}
        assert any(all(f"{p}.{n}" in paths for n in names) for p in holders), \
            f"{section.__name__}: its keys {names} are not all in docs/configs.md"
    for path in ("model.heads.<head>.optimizer", "train.trunk.aggregator",
                 "callbacks.reduce_lr_on_plateau[i].factor", "data.per_head", "log.every"):
        assert path in paths  # what users set most, with the placeholders the text explains


@dataclasses.dataclass
class _Inner:
    """`inner:` a toy section."""

    rate: float = field(0.1, minimum=0, doc="the rate")
    kind: str = field("a", choices=("a", "b"))


@dataclasses.dataclass
class _Outer:
    name: str = field(doc="required")
    items: dict[str, _Inner] = field({}, each="<head>")
    listed: Any = field([], section=_Inner, each="[i]")
    maybe: _Inner | None = field(None)
    again: dict[str, Any] = field({}, section="_Outer", each="<k>")


def test_a_new_field_appears_wherever_its_section_is_used():
    rows = {row.path: row for row in reference.key_rows(_Outer)}
    assert list(rows) == ["name", "items", "items.<head>.rate", "items.<head>.kind", "listed",
                          "listed[i].rate", "listed[i].kind", "maybe", "maybe.rate",
                          "maybe.kind", "again"]
    assert rows["name"].default == "required"
    assert rows["items.<head>.rate"] == ("items.<head>.rate", "float", "`0.1`", "the rate; >= 0")
    assert rows["maybe.kind"].doc == "one of `a`, `b`"
    assert rows["maybe"].type == "section or null" and rows["maybe"].doc == "a toy section"
    assert rows["again"].doc == "a `_Outer` section"  # a section inside itself is not repeated


def test_write_replaces_only_the_block_and_refuses_a_file_without_one(tmp_path, capsys):
    page = tmp_path / "configs.md"
    page.write_text(f"# Configs\n\n{reference.BEGIN}\nstale\n{reference.END}\n\nafter\n")
    assert reference.main(["--write", str(page)]) == 0
    assert page.read_text() == f"# Configs\n\n{reference.render()}\n\nafter\n"
    (tmp_path / "none.md").write_text("# nothing to replace\n")
    assert reference.main(["--write", str(tmp_path / "none.md")]) == 2
    assert "no block from" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["README.md", "docs/configs.md"])
def test_the_readme_points_at_the_reference(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        text = fh.read()
    assert "configs.md#every-key" in text if path == "README.md" else "## Every key" in text
