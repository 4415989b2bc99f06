"""Reading config YAML as YAML 1.2 does, safely and within bounds.

PyYAML implements YAML 1.1, where `yes`/`no`/`on`/`off` are booleans, `010` is octal 8,
`1:30` is sexagesimal 90 and `2020-01-01` a date; a duplicate key silently keeps the last
value. Configs are read with the YAML 1.2 core schema instead (`_Loader`):

* booleans are only `true`/`false` (any case variant YAML 1.2 lists), null is `null`/`~`/empty;
* integers are decimal (`010` is 10), `0o17` octal or `0x1f` hex; `1:30` and dates are strings;
* floats are `1.5`, `3e-4`, `.inf`, `.nan` (the 1.2 form, exponent without a dot included);
* a duplicate key in a mapping is an error naming the key and its line;
* merge keys share settings: `<<: *defaults` or `<<: [*a, *b]` inserts the keys of the
  aliased mappings that the mapping does not write itself (with a list, the first mapping
  that has a key gives it); they count towards the alias expansion bound like any alias;
* the text is at most `MAX_BYTES`, nesting at most `MAX_DEPTH`, and the document expanded
  through its aliases at most `MAX_NODES` nodes (an alias bomb fails at once, before any
  Python object is built);
* only plain data is constructed (a `yaml.SafeLoader` subclass: no `!!python` tags).

PyYAML with 1.2 resolvers was chosen over ruamel.yaml: the project already depends on
PyYAML, the 1.2 core schema is four regular expressions, and neither library bounds
alias expansion, which is checked here on the composed node graph.

`dump_yaml` writes a string quoted whenever either YAML version would read it as
something else, so the resolved configs a run writes read back the same.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000

_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


#: The tag of the merge key `<<` (YAML 1.1's merge type, which configs use in 1.2 documents too).
_MERGE = "tag:yaml.org,2002:merge"


class YAMLLimitError(yaml.YAMLError):
    """The document is too large, too deep or expands to too many nodes."""


class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` with the YAML 1.2 core schema, duplicate keys refused, merge keys
    (`<<`) read as the YAML merge type specifies and depth bounded."""

    yaml_implicit_resolvers: dict[str, list[tuple[str, re.Pattern[str]]]] = {}

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        # The composer recurses per nesting level: bound it before Python's recursion limit.
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels "
                                     f"(line {self.peek_event().start_mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node: Any) -> None:
        """Refuses a key written twice in `node`, then replaces its `<<` key by the pairs of
        the mappings it names that `node` does not write itself, the first mapping of a list
        winning (the YAML merge type). PyYAML's own version lets the last mapping win."""
        written: dict[Any, int] = {}
        merged: list[tuple[Any, Any]] = []
        for key_node, value_node in node.value:
            key = "<<" if key_node.tag == _MERGE else self.construct_object(key_node, deep=True)
            try:
                if key in written:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {written[key] + 1})",
                        key_node.start_mark)
                written[key] = key_node.start_mark.line
            except TypeError:  # an unhashable key: the base class reports it
                pass
            if key_node.tag == _MERGE:
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    if not isinstance(source, yaml.MappingNode):
                        raise yaml.constructor.ConstructorError(
                            None, None, "expected a mapping or list of mappings for merging, "
                            f"but found {source.id}", source.start_mark)
                    self.flatten_mapping(source)
                    merged.extend(source.value)
        if not merged:
            return
        taken = {k for k in written if k != "<<"}
        pairs = []
        for key_node, value_node in merged:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in taken:
                    continue
                taken.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                pass
            pairs.append((key_node, value_node))
        node.value = pairs + [pair for pair in node.value if pair[0].tag != _MERGE]


for _tag, _regex, _first in [
    ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
    ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
    ("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789.")),
    (_MERGE, re.compile(r"^(?:<<)$"), ["<"]),
]:
    _Loader.add_implicit_resolver(_tag, _regex, _first)


def _error(loader: _Loader, node: Any, what: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(
        None, None, f"{node.value!r} is not {what}", node.start_mark)


def _int(loader: _Loader, node: Any) -> int:
    text = str(loader.construct_scalar(node)).strip()
    try:
        if re.fullmatch(r"[-+]?[0-9]+", text):
            return int(text, 10)
        if re.fullmatch(r"0o[0-7]+", text):
            return int(text[2:], 8)
        if re.fullmatch(r"0x[0-9a-fA-F]+", text):
            return int(text[2:], 16)
    except ValueError:  # more digits than int() converts
        pass
    raise _error(loader, node, "an integer (YAML 1.2: decimal, 0o octal or 0x hex)")


def _float(loader: _Loader, node: Any) -> float:
    text = str(loader.construct_scalar(node)).strip()
    if not _FLOAT.match(text) and not re.fullmatch(r"[-+]?[0-9]+", text):
        raise _error(loader, node, "a number")
    lower = text.lower()
    if lower.endswith(".inf"):
        return -math.inf if lower.startswith("-") else math.inf
    if lower == ".nan":
        return math.nan
    return float(text)


def _bool(loader: _Loader, node: Any) -> bool:
    text = str(loader.construct_scalar(node))
    if not _BOOL.match(text):
        raise _error(loader, node, "true or false")
    return text.lower() == "true"


def _null(loader: _Loader, node: Any) -> None:
    text = str(loader.construct_scalar(node))
    if not _NULL.match(text):
        raise _error(loader, node, "null")
    return None


_Loader.add_constructor("tag:yaml.org,2002:int", _int)
_Loader.add_constructor("tag:yaml.org,2002:float", _float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _bool)
_Loader.add_constructor("tag:yaml.org,2002:null", _null)
# YAML 1.2 has no timestamps: `2020-01-01` is a string; an explicit !!timestamp is refused.
_Loader.yaml_constructors = {k: v for k, v in _Loader.yaml_constructors.items()
                             if k != "tag:yaml.org,2002:timestamp"}


def _expanded_size(node: Any) -> int:
    """Nodes of the document with every alias expanded, computed on the shared node graph
    (linear in its size) and stopping past `MAX_NODES`."""
    memo: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path: meeting one again is a cycle
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        current, children_done = stack.pop()
        if id(current) in memo:
            continue
        if isinstance(current, yaml.ScalarNode):
            memo[id(current)] = 1
            continue
        children = ([n for pair in current.value for n in pair]
                    if isinstance(current, yaml.MappingNode) else list(current.value))
        if not children_done:
            if id(current) in open_nodes:
                raise YAMLLimitError(f"an alias refers to a node that contains it (line "
                                     f"{current.start_mark.line + 1}): a recursive structure "
                                     "expands without end")
            open_nodes.add(id(current))
            stack.append((current, True))
            stack.extend((c, False) for c in children if id(c) not in memo)
            continue
        open_nodes.discard(id(current))
        memo[id(current)] = min(MAX_NODES + 1, 1 + sum(memo.get(id(c), 1) for c in children))
    return memo[id(node)]


def load_yaml(text: str) -> Any:
    """Parses one YAML 1.2 document into plain data (dicts, lists, str, int, float, bool, None).

    Raises:
        yaml.YAMLError: invalid YAML, a duplicate key, a bad explicit tag value, or a
            `YAMLLimitError` for a document beyond the bounds.
    """
    if len(text) > MAX_BYTES:
        raise YAMLLimitError(f"larger than {MAX_BYTES} bytes")
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise YAMLLimitError(f"expands to more than {MAX_NODES} nodes through its aliases "
                                 "(&anchor / *alias)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def describe_error(err: yaml.YAMLError) -> str:
    """One line: what is wrong and on which line."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{err.problem}{where}"
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


class _Dumper(yaml.SafeDumper):
    """`yaml.SafeDumper` that also quotes strings YAML 1.2 would read as another type."""


for _tag, _regex, _first in [
    ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
    ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
    ("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789.")),
]:
    _Dumper.add_implicit_resolver(_tag, _regex, _first)


def dump_yaml(data: Any) -> str:
    """`data` as YAML that both YAML 1.1 and 1.2 read back the same (keys in order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
