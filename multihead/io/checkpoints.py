"""Partial and full checkpoints on `tf.train.Checkpoint`, keyed by part, not by Keras names.

The object graph written is

    trunk                 the trunk layer
    heads/<name>          each head layer
    rng                   the seed states of the model's random layers (Dropout, ...)
    optimizers/<name>     each head's optimizer (slots, iterations, and the
                          variables it was built on)
    trunk_update          the aggregated trunk update (trunk optimizer, loss
                          weighting, RNG), when the trainer has one
    step                  the trainer's step counter
    data                  the position of `Trainer.fit` in its data stream
    targets/<name>        target networks (copies and sync counters)

so a checkpoint restores into a freshly built model in another process (Keras
auto-names such as `dense_7` never enter the keys), and any subset of parts can
be saved or restored: a trunk-only restore into a model with other heads works.
Before anything is assigned, every requested part is compared with the file
(variable structure, shapes, dtypes); a mismatch is one `CheckpointMismatchError`
that lists every mismatched part.

`CheckpointManager` adds periodic checkpoints of a training run (keep the last
N, atomic: the manager's state file only ever names complete checkpoints), and
an exact resume: step, optimizer slots, RNG seed states, target counters and the
data position are all restored, a corrupted latest checkpoint falls back to the
previous one with a warning, and TensorBoard events written after the restored
checkpoint are dropped so that the resumed run's steps continue without
duplicates.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile
import time
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import keras
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead.core.model import MultiHeadModel

if TYPE_CHECKING:
    from multihead.core.trainer import Trainer

#: Parts that name a group: `"heads"` is every `heads/<name>`, and so on.
_GROUPS = ("heads", "optimizers", "targets")
#: The order parts are listed in (the order of the object graph in the module doc).
_ORDER = ("trunk", "heads", "rng", "optimizers", "trunk_update", "step", "data", "targets", "run")
_VALUE = "VARIABLE_VALUE"
_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


class CheckpointMismatchError(ValueError):
    """Parts of a checkpoint do not match the model (or trainer) they are restored into.

    Attributes:
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


# -- state that only checkpoints need -----------------------------------------------------


class _RunClock(tf.Module):
    """Wall time at which a manager's checkpoint was saved (to rewind TensorBoard logs)."""

    def __init__(self) -> None:
        super().__init__(name="run_clock")
        self.saved_at = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="saved_at")


# -- parts ----------------------------------------------------------------------------------


def _target_map(targets: Mapping[str, Any] | None) -> dict[str, Any]:
    found = dict(targets or {})
    for name, target in found.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"targets: name {name!r} is not allowed; use a non-empty name without '/'")
        if not isinstance(target, tf.__internal__.tracking.Trackable):
            raise TypeError(
                f"targets[{name!r}] must be a trackable object (a TargetNetwork or tf.Module), "
                f"got {type(target).__name__}"
            )
    return found


def available_parts(model: MultiHeadModel, trainer: Trainer | None = None,
                    targets: Mapping[str, Any] | None = None) -> list[str]:
    """Every part name that `save_checkpoint` can write for this model (trainer, targets).

    Example:
        >>> available_parts(model)                                   # doctest: +SKIP
        ['trunk', 'heads/y1', 'heads/y2', 'rng']
    """
    parts = ["trunk"] + [f"heads/{h}" for h in model.head_names] + ["rng"]
    if trainer is not None:
        parts += [f"optimizers/{h}" for h in trainer.optimizers]
        if getattr(trainer, "trunk_update", None) is not None:
            parts.append("trunk_update")
        parts.append("step")
        if getattr(trainer, "data_position", None) is not None:
            parts.append("data")
    parts += [f"targets/{name}" for name in _target_map(targets)]
    return parts


def _expand(parts: Sequence[str] | None, known: list[str], trainer: Trainer | None) -> list[str]:
    if parts is None:
        return list(known)
    if isinstance(parts, str):
        raise TypeError(f"parts must be a list of part names, got the string {parts!r}; "
                        f"write parts=[{parts!r}]")
    wanted: list[str] = []
    for part in parts:
        if part in _GROUPS:
            members = [k for k in known if k.startswith(part + "/")]
        else:
            members = [part] if part in known else []
        if not members:
            hint = ""
            if trainer is None and part.split("/")[0] in ("optimizers", "step", "data", "trunk_update"):
                hint = " (optimizer, step and data parts need trainer=...)"
            elif part.startswith("targets"):
                hint = " (target parts need targets={name: target})"
            raise ValueError(f"unknown checkpoint part {part!r}{hint}; parts are {known}")
        wanted += [m for m in members if m not in wanted]
    if not wanted:
        raise ValueError("parts is empty; name at least one part or pass None for all")
    return wanted


def _part_objects(model: MultiHeadModel, trainer: Trainer | None, targets: Mapping[str, Any],
                  parts: Sequence[str]) -> dict[str, Any]:
    """Part name -> the trackable object saved under it."""
    objects: dict[str, Any] = {}
    for part in parts:
        kind, _, name = part.partition("/")
        if kind == "trunk":
            objects[part] = model.trunk
        elif kind == "heads":
            objects[part] = model.heads[name]
        elif kind == "rng":
            objects[part] = _group({
                "trunk": internals.seed_generator_states(model.trunk),
                "heads": _group({h: internals.seed_generator_states(model.heads[h]) for h in model.head_names}),
            })
        elif kind == "optimizers":
            objects[part] = trainer.optimizers[name]
        elif kind == "trunk_update":
            objects[part] = trainer.trunk_update
        elif kind == "step":
            objects[part] = trainer.step_variable
        elif kind == "data":
            objects[part] = trainer.data_position
        elif kind == "targets":
            objects[part] = targets[name]
    return objects


def _root(objects: Mapping[str, Any]) -> tf.train.Checkpoint:
    """The checkpoint root: `trunk`, `heads/<name>`, ... as nested `tf.train.Checkpoint`s."""
    top: dict[str, Any] = {}
    for part, obj in objects.items():
        kind, _, name = part.partition("/")
        if name:
            top.setdefault(kind, {})[name] = obj
        else:
            top[kind] = obj
    return tf.train.Checkpoint(**{k: _group(v) if isinstance(v, dict) else v for k, v in top.items()})


def _group(children: Mapping[str, Any]) -> Any:
    """A node whose children are exactly `children` (a head may be called `save` or `read`:
    a `tf.train.Checkpoint` node would lose its methods to such names)."""
    node = tf.__internal__.tracking.AutoTrackable()
    for name, child in children.items():
        setattr(node, name, child)
    return node


def _check_ready(model: MultiHeadModel, trainer: Trainer | None) -> None:
    if not isinstance(model, MultiHeadModel):
        raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
    if not model.built or not model.trunk.built:
        raise ValueError("the model has no variables yet: call model.build(input_shape) first")
    if trainer is not None:
        if trainer.model is not model:
            raise ValueError("trainer.model is not the model given; pass the trainer's own model")
        trainer.build_optimizers()  # their slots must exist before a save or restore


# -- comparing a file with live objects ----------------------------------------------------


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
        if id(node) in seen or depth > 64:
            continue
        seen.add(id(node))
        for name, child in view.children(node).items():
            stack.append((f"{path}/{name}" if path else name, child, depth + 1))
    return found


class _FileGraph:
    """The object graph and variable shapes of a checkpoint file."""

    def __init__(self, path: str) -> None:
        from tensorflow.core.protobuf import trackable_object_graph_pb2

        try:
            self.reader = tf.train.load_checkpoint(path)
            proto = self.reader.get_tensor(_GRAPH_KEY)
            self.graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(proto)
            self.shapes = self.reader.get_variable_to_shape_map()
            self.dtypes = self.reader.get_variable_to_dtype_map()
        except Exception as err:  # noqa: BLE001 - any failure to parse means an unreadable file
            raise CheckpointReadError(f"cannot read checkpoint {path!r}: {_first_line(err)}") from None

    def node(self, path: str) -> int | None:
        node = 0
        for name in path.split("/"):
            children = {c.local_name: c.node_id for c in self.graph.nodes[node].children}
            if name not in children:
                return None
            node = children[name]
        return node

    def children(self, node: int) -> list[str]:
        return [c.local_name for c in self.graph.nodes[node].children]

    def variables(self, node: int) -> dict[str, tuple[tuple[int, ...], tf.DType]]:
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
            if n in seen or depth > 64:
                continue
            seen.add(n)
            for child in self.graph.nodes[n].children:
                stack.append((f"{path}/{child.local_name}" if path else child.local_name,
                              child.node_id, depth + 1))
        return found

    def parts(self) -> list[str]:
        found = []
        for child in self.graph.nodes[0].children:
            if child.local_name in _GROUPS:
                found += [f"{child.local_name}/{n}" for n in self.children(child.node_id)]
            elif child.local_name not in ("save_counter",):
                found.append(child.local_name)

        def key(part: str) -> tuple[int, str]:
            kind = part.split("/")[0]
            return (_ORDER.index(kind) if kind in _ORDER else len(_ORDER), part)

        return sorted(found, key=key)


def _label(path: str, var: Any) -> str:
    return getattr(var, "path", None) or path or "the variable"


def _compare(part: str, obj: Any, graph: _FileGraph, view: tf.train.TrackableView) -> str | None:
    """What differs between part `part` in the file and the live `obj`, or None."""
    node = graph.node(part)
    if node is None:
        return f"not in the checkpoint (it has {', '.join(graph.parts()) or 'no parts'})"
    live = _live_variables(obj, view)
    saved = graph.variables(node)
    problems = []
    for path, var in live.items():
        if path not in saved:
            problems.append(f"{_label(path, var)} is not in the checkpoint")
            continue
        shape, dtype = saved[path]
        live_shape, live_dtype = tuple(var.shape), tf.as_dtype(var.dtype)
        if shape != live_shape or (dtype is not None and dtype != live_dtype):
            problems.append(
                f"{_label(path, var)} is {shape} {getattr(dtype, 'name', dtype)} in the checkpoint "
                f"but {live_shape} {live_dtype.name} in the model"
            )
    extra = sorted(p for p in saved if p not in live)
    if extra:
        problems.append(f"the checkpoint has {len(extra)} variable(s) the model lacks ({extra[0]}, ...)")
    if not problems:
        return None
    more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
    return ", ".join(problems[:2]) + more


def checkpoint_parts(path: str | os.PathLike[str]) -> list[str]:
    """The part names stored in a checkpoint written by multihead (`trunk`, `heads/y1`, ...).

    Raises:
        CheckpointReadError: the file is missing or unreadable.
    """
    return _FileGraph(os.fspath(path)).parts()


# -- save and restore -----------------------------------------------------------------------


def save_checkpoint(path: str | os.PathLike[str], model: MultiHeadModel,
                    parts: Sequence[str] | None = None, trainer: Trainer | None = None,
                    targets: Mapping[str, Any] | None = None) -> str:
    """Writes the chosen parts of `model` (and `trainer`, `targets`) to `path`.

    Example:
        >>> mh.save_checkpoint("ckpt/trunk", model, parts=["trunk"])           # doctest: +SKIP
        >>> mh.save_checkpoint("ckpt/all", model, trainer=trainer)             # doctest: +SKIP

    Args:
        path: checkpoint prefix; files `path.index` and `path.data-*` are written.
        model: a built model.
        parts: part names (`"trunk"`, `"heads/<name>"`, `"rng"`,
            `"optimizers/<name>"`, `"trunk_update"`, `"step"`, `"data"`,
            `"targets/<name>"`) or groups (`"heads"`, `"optimizers"`,
            `"targets"`); None saves every part available. An optimizer part
            also holds the variables it was built on.
        trainer: the trainer whose optimizers, step counter and data position to save.
        targets: name -> target network (any trackable object) to save.

    Returns:
        The checkpoint prefix.
    """
    _check_ready(model, trainer)
    targets = _target_map(targets)
    wanted = _expand(parts, available_parts(model, trainer, targets), trainer)
    ckpt = _root(_part_objects(model, trainer, targets, wanted))
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
    return ckpt.write(os.fspath(path))


def restore_checkpoint(path: str | os.PathLike[str], model: MultiHeadModel,
                       parts: Sequence[str] | None = None, trainer: Trainer | None = None,
                       targets: Mapping[str, Any] | None = None) -> list[str]:
    """Restores the chosen parts of a checkpoint into a built `model` (and `trainer`, `targets`).

    Every requested part is compared with the file before anything is assigned;
    parts in the file that are not asked for are ignored. Restoring the `data`
    part makes the trainer's next `fit` continue from the saved data position.

    Example:
        >>> fresh = build_model_with_other_heads()                            # doctest: +SKIP
        >>> mh.restore_checkpoint("ckpt/all", fresh, parts=["trunk"])          # doctest: +SKIP

    Args:
        path: the checkpoint prefix (as returned by `save_checkpoint`).
        model: a built model.
        parts: as for `save_checkpoint`; None restores every part available for
            the given model, trainer and targets.
        trainer: trainer whose optimizers, step and data position to restore.
        targets: name -> target network to restore.

    Returns:
        The parts restored.

    Raises:
        CheckpointMismatchError: requested parts missing from the file or with
            other variables, shapes or dtypes (all listed in one message);
            nothing is assigned.
        CheckpointReadError: the file is missing, truncated or corrupted.
    """
    _check_ready(model, trainer)
    targets = _target_map(targets)
    wanted = _expand(parts, available_parts(model, trainer, targets), trainer)
    objects = _part_objects(model, trainer, targets, wanted)
    _restore_objects(os.fspath(path), objects)
    if "data" in wanted:
        trainer.data_position.mark_restored()
    return wanted


def _restore_objects(path: str, objects: Mapping[str, Any]) -> None:
    graph = _FileGraph(path)
    root = _root(objects)
    view = tf.train.TrackableView(root)
    mismatches = {}
    for part, obj in objects.items():
        why = _compare(part, obj, graph, view)
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


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# -- periodic checkpoints of a run ------------------------------------------------------------


class CheckpointManager:
    """Periodic, atomic checkpoints of a training run, and exact resume.

    Built on `tf.train.CheckpointManager`: checkpoints are `<directory>/ckpt-<step>`,
    the last `keep` are kept, and the state file naming the latest is updated
    only after a checkpoint is completely written, so a crash during a save
    leaves the manager pointing at the previous complete checkpoint.

    Example:
        >>> manager = mh.CheckpointManager("runs/x/checkpoints", model, trainer, every=500)
        >>> manager.restore_latest()          # None on a fresh run       # doctest: +SKIP
        >>> trainer.fit(data, steps=10_000 - trainer.global_step, checkpoints=manager)

    Args:
        directory: where checkpoints are written.
        model: the model (built).
        trainer: the trainer; with it, every part is saved (optimizers, step,
            data position, ...). Without, only the model parts.
        every: `maybe_save(step)` saves when `step % every == 0`; 0 disables
            periodic saves (`save()` still works).
        keep: how many checkpoints to keep.
        targets: name -> target network (any trackable object) saved too.
    """

    def __init__(self, directory: str | os.PathLike[str], model: MultiHeadModel,
                 trainer: Trainer | None = None, *, every: int = 0, keep: int = 3,
                 targets: Mapping[str, Any] | None = None) -> None:
        for name, value, low in (("every", every, 0), ("keep", keep, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"CheckpointManager: {name} must be an integer >= {low}, got {value!r}")
        _check_ready(model, trainer)
        self.directory = os.fspath(directory)
        self.every = every
        self.keep = keep
        self.model = model
        self.trainer = trainer
        self._targets = _target_map(targets)
        self._clock = _RunClock()
        self._parts = available_parts(model, trainer, self._targets)
        self._objects = _part_objects(model, trainer, self._targets, self._parts)
        self._objects["run"] = self._clock
        self._manager = tf.train.CheckpointManager(
            _root(self._objects), self.directory, max_to_keep=keep, checkpoint_name="ckpt")
        self._last_saved: int | None = None
        self._last_seen: int | None = None
        # Non-chief workers of a multi-worker run do not write into `directory`.
        self._chief = bool(getattr(trainer, "is_chief", True)) if trainer is not None else True

    @property
    def parts(self) -> list[str]:
        """The parts every checkpoint of this manager holds."""
        return list(self._parts)

    @property
    def checkpoints(self) -> list[str]:
        """Kept checkpoint prefixes, oldest first."""
        return list(self._manager.checkpoints)

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest complete checkpoint, or None."""
        return self._manager.latest_checkpoint

    @staticmethod
    def step_of(path: str) -> int:
        """The step number in a checkpoint prefix `.../ckpt-<step>`."""
        return int(path.rsplit("-", 1)[1])

    def _step(self) -> int:
        if self.trainer is not None:
            return self.trainer.global_step
        return (self._last_saved or 0) + 1  # without a trainer: numbered by save

    def maybe_save(self, step: int) -> str | None:
        """The checkpoint cadence: called after each training step with the global step.

        Saves when a multiple of `every` was reached since the previous call, so a
        caller that advances several steps at once (several steps per execution)
        still saves once per period, at the first step it sees past the multiple.

        Returns:
            The checkpoint written, or None.
        """
        previous = self._last_seen if self._last_seen is not None else step - 1
        self._last_seen = step
        if self.every and step // self.every > previous // self.every and step != self._last_saved:
            return self.save()
        return None

    def save(self) -> str:
        """Writes a checkpoint of everything now, numbered by the trainer's step."""
        step = self._step()
        if self.trainer is not None and getattr(self.trainer, "monitor", None) is not None:
            self.trainer.monitor.flush()  # events up to this step are on disk before the save
        self._clock.saved_at.assign(time.time())
        path = self._write(step)
        self._last_saved = step
        return path

    def _write(self, step: int) -> str:
        if not self._chief:
            # As tf.distribute's multi-worker guide does: a non-chief worker writes to a
            # scratch directory it deletes, so that it takes part in whatever collective
            # reads saving involves, and only the chief's checkpoint remains.
            scratch = tempfile.mkdtemp(prefix="multihead-worker-ckpt-")
            try:
                _root(self._objects).write(os.path.join(scratch, f"ckpt-{step}"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return os.path.join(self.directory, f"ckpt-{step}")
        return self._manager.save(checkpoint_number=step)

    def restore_latest(self, rewind_logs: bool = True) -> int | None:
        """Restores the newest readable checkpoint.

        A missing, truncated or corrupted checkpoint is skipped with a warning
        and the previous one is tried.

        Args:
            rewind_logs: drop the TensorBoard events the trainer's log directory
                received after the restored checkpoint was saved (by the run that
                crashed), so that the resumed run logs each step once.

        Returns:
            The step of the restored checkpoint, or None if there is none.

        Raises:
            CheckpointMismatchError: the checkpoint does not fit the model.
            CheckpointReadError: checkpoints exist but none is readable.
        """
        candidates = list(reversed(self._manager.checkpoints))
        if not candidates:
            return None
        for i, path in enumerate(candidates):
            try:
                _restore_objects(path, self._objects)
            except CheckpointReadError as err:
                fallback = candidates[i + 1] if i + 1 < len(candidates) else None
                warnings.warn(
                    f"{err}; falling back to {fallback!r}" if fallback else f"{err}; no older checkpoint",
                    RuntimeWarning, stacklevel=2,
                )
                continue
            if self.trainer is not None and getattr(self.trainer, "data_position", None) is not None:
                self.trainer.data_position.mark_restored()
            monitor = getattr(self.trainer, "monitor", None) if self.trainer is not None else None
            if rewind_logs and monitor is not None:
                rewind_events(monitor.log_dir, float(self._clock.saved_at.numpy()))
            step = self.step_of(path)
            self._last_saved = self._last_seen = step
            return step
        raise CheckpointReadError(
            f"no readable checkpoint in {self.directory!r} (tried {', '.join(candidates)})"
        )


# -- TensorBoard logs of a resumed run ------------------------------------------------------


def _read_events(path: str) -> list[Any]:
    """Events of one file, stopping at a truncated or corrupted record (a crash's tail)."""
    from tensorflow.core.util import event_pb2

    events = []
    try:
        for record in tf.data.TFRecordDataset(path):
            events.append(event_pb2.Event.FromString(record.numpy()))
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError):
        pass
    return events


def rewind_events(log_dir: str | os.PathLike[str], saved_at: float) -> int:
    """Drops the TensorBoard events written after wall time `saved_at` under `log_dir`.

    When a run crashes after a checkpoint, its logs run ahead of the checkpoint;
    the resumed run logs those steps again. Event files holding records newer
    than `saved_at` are rewritten without them (atomically); files left with no
    record but the header are removed. Files holding no event newer than
    `saved_at` are not touched, nor are files a writer of this process still
    has open (the resumed run's own, or a live trainer's: rewriting them would
    lose its later events); close a trainer before rewinding its logs.

    Returns:
        The number of events dropped.
    """
    dropped = 0
    in_use = _open_files()
    own = f".{socket.gethostname()}.{os.getpid()}."  # in the names of this process's event files
    pattern = os.path.join(os.fspath(log_dir), "**", "events.out.tfevents.*")
    for path in sorted(glob.glob(pattern, recursive=True)):
        if in_use is not None and os.path.realpath(path) in in_use:
            continue
        events = _read_events(path)
        created = events[0].wall_time if events else float("inf")
        if in_use is None and own in os.path.basename(path) and created > saved_at:
            continue  # without /proc: this process's files newer than the checkpoint are its own
        late = [e for e in events if e.wall_time > saved_at and not e.HasField("file_version")]
        size_ok = _records_end(path, len(events))
        if not late and size_ok:
            continue
        keep = [e for e in events if e.HasField("file_version") or e.wall_time <= saved_at]
        dropped += len(events) - len(keep)
        if not any(not e.HasField("file_version") for e in keep):
            os.remove(path)
            continue
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".rewind-")
        os.close(fd)
        try:
            with tf.io.TFRecordWriter(tmp) as writer:
                for event in keep:
                    writer.write(event.SerializeToString())
            shutil.copymode(path, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return dropped


def _open_files() -> set[str] | None:
    """Real paths of the files this process has open (Linux), or None if unknown."""
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        return None
    found = set()
    for fd in os.listdir(fd_dir):
        try:
            found.add(os.path.realpath(os.readlink(os.path.join(fd_dir, fd))))
        except OSError:
            continue
    return found


def _records_end(path: str, count: int) -> bool:
    """True if the file holds exactly `count` whole records (no torn tail)."""
    size = os.path.getsize(path)
    total = 0
    with open(path, "rb") as fh:
        for _ in range(count):
            header = fh.read(12)
            if len(header) < 12:
                return False
            length = int.from_bytes(header[:8], "little")
            total += 12 + length + 4
            fh.seek(length + 4, os.SEEK_CUR)
    return total == size
