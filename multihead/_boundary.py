"""A run or sweep directory is a boundary: what is read from it stays inside it.

Run and sweep directories may come from anyone (a colleague's archive, a shared disk), so
every path read from one (`best/best.json`'s `path`, a trial's `run_dir` in `sweep.json`,
the checkpoint files, `inputs.json`, `config.yaml`, event files) goes through this module:

* `inside(base, rel)` resolves a relative path under `base` and refuses an absolute path, a
  `..` component, and a symlink anywhere below `base` (for reading and for writing: what a
  symlink points at may be outside the directory);
* `open_regular` opens only a regular file (`O_NOFOLLOW | O_NONBLOCK`, then `fstat`): a
  FIFO, a device or a directory named like a run file is refused instead of blocking;
* `read_bytes`, `read_text`, `read_json` read at most a bound, with one-line errors that
  name the file; `read_tail` reads a log's last bytes;
* `expect_kind` checks that an entry a writer will create, append to or remove is, if it
  exists, a directory or a regular file as expected (not a symlink, a FIFO, the other kind);
  `open_append` opens a log for appending under the rules of `open_regular`;
* `write_atomic` writes a result file (temp file in the same directory, fsync,
  `os.replace`), refusing a symlink at the target, readable as the umask allows (`temp_file`,
  `temp_dir`: mkstemp/mkdtemp with the modes `open` and `os.mkdir` give), and
  `rewrite_in_place` rewrites a small record within its own blocks on a full disk; `unlink_symlinks` clears symlinks planted
  at names a writer (TensorFlow's checkpoint writer) would follow.

`base` itself is trusted as given (the user named it); only what lies below it is not.
Every error is a `BoundaryError` (a `ValueError`) with one line naming the file.

Example:
    >>> path = inside("runs/x", "best/best-100")            # doctest: +SKIP
    >>> record = read_json("runs/x", "best/best.json")      # doctest: +SKIP
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, Iterable

#: Default bound of a file read whole (JSON records, configs): far above any real one.
MAX_READ_BYTES = 16 << 20


class BoundaryError(ValueError):
    """A path read from a run or sweep directory leaves it, or names something unsafe."""


def _parts(rel: Any, where: str) -> list[str]:
    if isinstance(rel, os.PathLike):
        rel = os.fspath(rel)
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise BoundaryError(f"{where}: expected a relative path, got {rel!r}")
    if os.path.isabs(rel) or rel.startswith(("/", "\\")):
        raise BoundaryError(f"{where}: {rel!r} is an absolute path; paths in a run directory "
                            "must be relative to it")
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts:
        raise BoundaryError(f"{where}: {rel!r} names the directory itself, not a path inside it")
    if ".." in parts:
        raise BoundaryError(f"{where}: {rel!r} leaves the directory ('..'); paths in a run "
                            "directory must stay inside it")
    return parts


def inside(base: str | os.PathLike[str], rel: str | os.PathLike[str], *,
           where: str | None = None) -> str:
    """`base/rel`, checked to stay inside `base`.

    Refuses an absolute `rel`, a `..` component, and any existing component below `base`
    that is a symlink (the last one included): what it points at may be outside. Components
    that do not exist yet are allowed (a path about to be written).

    Args:
        base: the run or sweep directory (trusted as given).
        rel: the relative path read from it.
        where: how the error names the source of `rel` (default: the resolved path).

    Raises:
        BoundaryError: the path leaves `base` or passes through a symlink.
    """
    base = os.fspath(base)
    if where is None:
        shown = os.fspath(rel) if isinstance(rel, (str, os.PathLike)) else repr(rel)
        where = os.path.join(base, shown)
    path = base
    parts = _parts(rel, where)
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break  # the rest does not exist yet
        except OSError as err:
            raise BoundaryError(f"{where}: cannot inspect {path!r} ({err.strerror})") from None
        if stat.S_ISLNK(mode):
            raise BoundaryError(f"{where}: {path!r} is a symlink; a run directory's files must "
                                "be inside it (copy the target in its place)")
        if i < len(parts) - 1 and not stat.S_ISDIR(mode):
            raise BoundaryError(f"{where}: {path!r} is not a directory")
    return os.path.join(base, *parts)


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only file descriptor on `path`, which must be a regular file (not a symlink).

    Opened with `O_NOFOLLOW | O_NONBLOCK`, so neither a symlink nor a FIFO (whose open
    would block until a writer appears) is followed or waited on; then `fstat` checks
    the kind. The caller closes the descriptor.

    Raises:
        BoundaryError: missing, a symlink, or not a regular file.
    """
    path = os.fspath(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BoundaryError(f"{path}: is a symlink; a run directory's files must be inside "
                                "it (copy the target in its place)") from None
        if err.errno == errno.ENOENT:
            raise BoundaryError(f"{path}: no such file") from None
        raise BoundaryError(f"{path}: cannot open ({err.strerror})") from None
    return _regular(fd, path)


def _regular(fd: int, path: str) -> int:
    """`fd`, opened non-blocking, switched to blocking once `fstat` says it is a regular
    file; else closed, and one line naming what `path` is."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BoundaryError(f"{path}: is {_kind(mode)}; expected a regular file")
    os.set_blocking(fd, True)
    return fd


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a symlink" if stat.S_ISLNK(mode) else "a regular file" if stat.S_ISREG(mode) else
            "not a regular file")


def expect_kind(base: str | os.PathLike[str], rel: str, *, directory: bool) -> str:
    """`inside(base, rel)`, which, if it exists, must be a directory (`directory`) or a regular
    file, and not a symlink: checked before a writer creates, appends to or removes it.

    Raises:
        BoundaryError: the path leaves `base`, or exists as something else (a FIFO, a file
            where a directory belongs, a directory where a file belongs).
    """
    path = inside(base, rel)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as err:
        raise BoundaryError(f"{path}: cannot inspect it ({err.strerror})") from None
    if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        raise BoundaryError(f"{path}: is {_kind(mode)}; expected "
                            f"{'a directory' if directory else 'a regular file'}")
    return path


def open_append(path: str | os.PathLike[str]) -> int:
    """A write-only, appending file descriptor on `path` (created if missing), which must be
    a regular file: a symlink is not followed (`O_NOFOLLOW`), a FIFO not waited on
    (`O_NONBLOCK`: without a reader its open fails at once), a directory refused. The
    caller closes the descriptor.

    Raises:
        BoundaryError: `path` is a symlink, a FIFO, a directory, or cannot be opened.
    """
    path = os.fspath(path)
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK |
             getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BoundaryError(f"{path}: is a symlink; refusing to write through it "
                                "(remove it or choose another path)") from None
        if err.errno == errno.ENXIO:
            raise BoundaryError(f"{path}: is a FIFO; expected a regular file") from None
        if err.errno == errno.EISDIR:
            raise BoundaryError(f"{path}: is a directory; expected a regular file") from None
        raise BoundaryError(f"{path}: cannot open for writing ({err.strerror})") from None
    return _regular(fd, path)


def read_tail(path: str | os.PathLike[str], limit: int = 1 << 20) -> bytes:
    """The last `limit` bytes of the regular file `path` (opened by `open_regular`): a log
    read for its last lines stays bounded whatever its size.

    Raises:
        BoundaryError: missing, a symlink, not a regular file, or unreadable.
    """
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
            return fh.read(limit)
    except OSError as err:
        raise BoundaryError(f"{os.fspath(path)}: cannot read ({err.strerror})") from None


def is_regular(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a regular file itself (a symlink, FIFO or device is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_bytes(base: str | os.PathLike[str], rel: str, *, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of the regular file `base/rel` (see `inside`), at most `limit` of them.

    Raises:
        BoundaryError: the path is unsafe, not a regular file, or larger than `limit`.
    """
    path = inside(base, rel)
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as err:
        raise BoundaryError(f"{path}: cannot read ({err.strerror})") from None
    if len(data) > limit:
        raise BoundaryError(f"{path}: larger than {limit} bytes; is it the right file?")
    return data


def read_text(base: str | os.PathLike[str], rel: str, *, limit: int = MAX_READ_BYTES) -> str:
    """`read_bytes` decoded as UTF-8 (an error names the file)."""
    data = read_bytes(base, rel, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BoundaryError(f"{os.path.join(os.fspath(base), rel)}: not UTF-8 text "
                            f"(byte {err.start})") from None


def read_json(base: str | os.PathLike[str], rel: str, *, limit: int = MAX_READ_BYTES,
              expect: type | tuple[type, ...] = dict) -> Any:
    """The JSON value of `base/rel`, of type `expect` (a mapping by default).

    Raises:
        BoundaryError: unsafe path, not a regular file, too large, not JSON, or not `expect`.
    """
    text = read_text(base, rel, limit=limit)
    path = os.path.join(os.fspath(base), rel)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as err:
        where = f" (line {err.lineno})" if isinstance(err, json.JSONDecodeError) else ""
        raise BoundaryError(f"{path}: not valid JSON{where}") from None
    if not isinstance(value, expect):
        names = " or ".join(t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,)))
        raise BoundaryError(f"{path}: expected a JSON {'object' if expect is dict else names}, "
                            f"got {type(value).__name__}")
    return value


def refuse_symlink(path: str | os.PathLike[str]) -> None:
    """Raises `BoundaryError` when `path` itself is a symlink (a write would follow it)."""
    if os.path.islink(path):
        raise BoundaryError(f"{os.fspath(path)}: is a symlink; refusing to write through it "
                            "(remove it or choose another path)")


def unlink_symlinks(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Removes the symlinks among `paths` (never what they point at); returns those removed.

    For a writer that would follow a symlink at its target name (TensorFlow's checkpoint
    writer merges the index in place): the name becomes a fresh file of this run.
    """
    removed = []
    for path in paths:
        if os.path.islink(path):
            os.unlink(path)
            removed.append(os.fspath(path))
    return removed


def unlink_symlinks_at(prefix: str | os.PathLike[str]) -> list[str]:
    """Removes every symlink named `<prefix>.*` or `<prefix>_*` in the prefix's directory:
    the names a TensorFlow checkpoint write of `prefix` creates (`.index`, `.data-*`, the
    `_temp` shard directory), so that the write cannot follow one out of the directory."""
    directory, name = os.path.split(os.path.abspath(os.fspath(prefix)))
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return unlink_symlinks(e.path for e in entries
                           if e.name.startswith((name + ".", name + "_")) and e.is_symlink())


#: Attempts at a free temp name before giving up (each name has 64 random bits).
_TEMP_ATTEMPTS = 100


def temp_file(directory: str | os.PathLike[str], prefix: str = ".tmp-",
              suffix: str = "") -> tuple[int, str]:
    """`tempfile.mkstemp`, but created with mode `0o666 & ~umask` as `open(path, "w")` would,
    so a file written through it and renamed into place is as readable as the rest of the
    directory (mkstemp's files are 0600 whatever the umask).

    Returns:
        An open file descriptor (write-only) and the file's path.

    Raises:
        OSError: the file cannot be created (no space, no permission).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_ATTEMPTS):
        path = os.path.join(os.fspath(directory), f"{prefix}{os.urandom(8).hex()}{suffix}")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name in {os.fspath(directory)!r}")


def temp_dir(parent: str | os.PathLike[str], prefix: str = ".tmp-") -> str:
    """`tempfile.mkdtemp`, but created with mode `0o777 & ~umask` as `os.mkdir` would (mkdtemp's
    directories are 0700), for a directory renamed into place when complete."""
    for _ in range(_TEMP_ATTEMPTS):
        path = os.path.join(os.fspath(parent), f"{prefix}{os.urandom(8).hex()}")
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name in {os.fspath(parent)!r}")


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Writes `data` to `path` all or nothing: a temp file in the same directory, fsync,
    `os.replace`. A symlink at `path` is refused (not followed, not replaced); a failure
    (a full disk) leaves any previous file as it was and no temp file behind.

    Raises:
        BoundaryError: `path` is a symlink or a directory.
        OSError: the write failed (disk full, permissions).
    """
    path = os.fspath(path)
    refuse_symlink(path)
    if os.path.isdir(path):
        raise BoundaryError(f"{path}: is a directory; expected a file path")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = temp_file(directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def rewrite_in_place(path: str | os.PathLike[str], data: str | bytes) -> bool:
    """Overwrites the regular file `path` with `data` within the disk blocks it already has
    (a file takes whole blocks, so rewriting up to them needs no new one), for a record that
    must survive a full disk. Not atomic: for a small record, as a last resort.

    Returns:
        False, writing nothing, when `path` is missing, a symlink, or `data` does not fit.
    """
    data = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or len(data) > max(info.st_size, info.st_blocks * 512):
            return False
        written = os.pwrite(fd, data, 0) == len(data)
        os.ftruncate(fd, len(data))  # shrinking needs no space
        return written
    except OSError:
        return False
    finally:
        os.close(fd)
