"""Reading a checkpoint file, and comparing it with the live objects it is restored into.

Before anything is assigned, every requested part is compared with the file
(variable structure, shapes, dtypes); a mismatch is one `CheckpointMismatchError`
that lists every mismatched part. Variables are matched by their object-graph
path under the part, never by Keras names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from multihead._checks import variable_label
from multihead.io.checkpoint_parts import GROUPS, OPTIONAL, ORDER, checkpoint_root

_VALUE = "VARIABLE_VALUE"
_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
#: Object graphs are trees of modest depth; deeper paths are cycles through aliases.
_MAX_DEPTH = 64


class CheckpointMismatchError(ValueError):
    """Parts of a checkpoint do not match the model (or trainer) they are restored into.

    Attributes:
        path: the checkpoint prefix.
        mismatches: part name -> what differs.
    """

    def __init__(self, path: str, mismatches: Mapping[str, str]) -> None:
        self.path = path
        self.mismatches = dict(mismatches)
        listed = "; ".join(f"{part}: {why}" for part, why in self.mismatches.items())
        super().__init__(
            f"cannot restore {path!r}: {len(self.mismatches)} part(s) do not match the model: "
            f"{listed}. Restore only the matching parts (parts=[...]) or build the model as it "
            "was when the checkpoint was saved"
        )


class CheckpointReadError(ValueError):
    """A checkpoint file is missing, truncated or corrupted."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _is_variable(obj: Any) -> bool:
    return isinstance(obj, (tf.Variable, keras.Variable))


def _live_variables(obj: Any, view: tf.train.TrackableView) -> dict[str, Any]:
    """Relative object-graph path -> variable, for everything under `obj`."""
    found: dict[str, Any] = {}
    stack = [("", obj, 0)]
    seen: set[int] = set()
    while stack:
        path, node, depth = stack.pop()
        if _is_variable(node):
            found.setdefault(path, node)
            continue
        if id(node) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(node))
        for name, child in view.children(node).items():
            stack.append((f"{path}/{name}" if path else name, child, depth + 1))
    return found


class FileGraph:
    """The object graph and variable shapes of a checkpoint file.

    Args:
        path: the checkpoint prefix.

    Raises:
        CheckpointReadError: the file is missing or unreadable.
    """

    def __init__(self, path: str) -> None:
        try:
            self.reader = tf.train.load_checkpoint(path)
            proto = self.reader.get_tensor(_GRAPH_KEY)
            self.graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(proto)
            self.shapes = self.reader.get_variable_to_shape_map()
            self.dtypes = self.reader.get_variable_to_dtype_map()
        except Exception as err:  # noqa: BLE001 - any failure to parse means an unreadable file
            raise CheckpointReadError(f"cannot read checkpoint {path!r}: {_first_line(err)}") from None

    def node(self, path: str) -> int | None:
        """The node id at object-graph path `path` (`heads/y1`), or None."""
        node = 0
        for name in path.split("/"):
            children = {c.local_name: c.node_id for c in self.graph.nodes[node].children}
            if name not in children:
                return None
            node = children[name]
        return node

    def children(self, node: int) -> list[str]:
        """Names of the children of `node`."""
        return [c.local_name for c in self.graph.nodes[node].children]

    def variables(self, node: int) -> dict[str, tuple[tuple[int, ...], tf.DType]]:
        """Relative path -> (shape, dtype) of every variable under `node`."""
        found: dict[str, tuple[tuple[int, ...], tf.DType]] = {}
        stack = [("", node, 0)]
        seen: set[int] = set()
        while stack:
            path, n, depth = stack.pop()
            attrs = {a.name: a.checkpoint_key for a in self.graph.nodes[n].attributes}
            if _VALUE in attrs:
                key = attrs[_VALUE]
                found.setdefault(path, (tuple(self.shapes.get(key, ())), self.dtypes.get(key)))
                continue
            if n in seen or depth > _MAX_DEPTH:
                continue
            seen.add(n)
            for child in self.graph.nodes[n].children:
                stack.append((f"{path}/{child.local_name}" if path else child.local_name,
                              child.node_id, depth + 1))
        return found

    def parts(self) -> list[str]:
        """The part names in the file, in the order of the object graph."""
        found = []
        for child in self.graph.nodes[0].children:
            if child.local_name in GROUPS:
                found += [f"{child.local_name}/{n}" for n in self.children(child.node_id)]
            elif child.local_name != "save_counter":
                found.append(child.local_name)

        def key(part: str) -> tuple[int, str]:
            kind = part.split("/")[0]
            return (ORDER.index(kind) if kind in ORDER else len(ORDER), part)

        return sorted(found, key=key)


def compare(part: str, obj: Any, graph: FileGraph, view: tf.train.TrackableView) -> str | None:
    """What differs between part `part` in the file and the live `obj`, or None."""
    node = graph.node(part)
    if node is None:
        return f"not in the checkpoint (it has {', '.join(graph.parts()) or 'no parts'})"
    live = _live_variables(obj, view)
    saved = graph.variables(node)
    problems = []
    for path, var in live.items():
        if path not in saved:
            problems.append(f"{variable_label(var, path)} is not in the checkpoint")
            continue
        shape, dtype = saved[path]
        live_shape, live_dtype = tuple(var.shape), tf.as_dtype(var.dtype)
        if shape != live_shape or (dtype is not None and dtype != live_dtype):
            problems.append(
                f"{variable_label(var, path)} is {shape} {getattr(dtype, 'name', dtype)} in the "
                f"checkpoint but {live_shape} {live_dtype.name} in the model"
            )
    extra = sorted(p for p in saved if p not in live)
    if extra:
        problems.append(f"the checkpoint has {len(extra)} variable(s) the model lacks ({extra[0]}, ...)")
    if not problems:
        return None
    more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
    return ", ".join(problems[:2]) + more


def restore_objects(path: str, objects: Mapping[str, Any]) -> None:
    """Restores part name -> object from the checkpoint at `path`, all or nothing.

    Raises:
        CheckpointMismatchError: parts missing from the file or with other
            variables, shapes or dtypes; nothing is assigned.
        CheckpointReadError: the file is missing, truncated or corrupted.
    """
    graph = FileGraph(path)
    objects = {part: obj for part, obj in objects.items()
               if part not in OPTIONAL or graph.node(part) is not None}
    root = checkpoint_root(objects)
    view = tf.train.TrackableView(root)
    mismatches = {}
    for part, obj in objects.items():
        why = compare(part, obj, graph, view)
        if why:
            mismatches[part] = why
    if mismatches:
        raise CheckpointMismatchError(path, mismatches)
    try:
        status = root.read(path)
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, tf.errors.OpError, ValueError) as err:
        raise CheckpointReadError(f"cannot read checkpoint {path!r}: {_first_line(err)}") from None
