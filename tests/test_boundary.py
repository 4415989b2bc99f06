"""`multihead._boundary`: paths read from a run directory stay inside it, only regular files
are opened, JSON reads are bounded, result files are written all or nothing."""

import errno
import os
import time

import pytest

from multihead._boundary import (
    BoundaryError,
    expect_kind,
    inside,
    open_append,
    open_regular,
    read_tail,
    read_json,
    unlink_symlinks_at,
    write_atomic,
)


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    (run / "best" / "best.json").write_text('{"path": "best-3"}')
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret.txt").write_text("secret")
    return run, victim


def test_inside_resolves_relative_paths_and_allows_missing_ones(run):
    run_dir, _ = run
    assert inside(run_dir, "best/best.json") == os.path.join(run_dir, "best", "best.json")
    assert inside(run_dir, "./best//x/y") == os.path.join(run_dir, "best", "x", "y")  # not there yet


@pytest.mark.parametrize("rel, message", [
    ("/etc/passwd", "is an absolute path"),
    ("../victim/secret.txt", "leaves the directory ('..')"),
    ("best/../../victim", "leaves the directory ('..')"),
    ("", "expected a relative path"),
    (".", "names the directory itself"),
    (5, "expected a relative path, got 5"),
])
def test_inside_refuses_paths_that_leave(run, rel, message):
    with pytest.raises(BoundaryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        inside(run[0], rel)


def test_inside_refuses_a_symlink_anywhere_below_the_base(run):
    run_dir, victim = run
    os.symlink(victim, run_dir / "train")
    os.symlink(victim / "secret.txt", run_dir / "best" / "best-3.index")
    with pytest.raises(BoundaryError, match=r"train' is a symlink"):
        inside(run_dir, "train/events.out.tfevents.1")
    with pytest.raises(BoundaryError, match=r"best-3.index' is a symlink"):
        inside(run_dir, "best/best-3.index")
    # a symlink within the directory is refused too: the rule is simple and checkable
    os.symlink(run_dir / "best", run_dir / "alias")
    with pytest.raises(BoundaryError, match="alias' is a symlink"):
        inside(run_dir, "alias/best.json")
    # the base itself is the user's choice
    os.symlink(run_dir, run_dir.parent / "link")
    assert read_json(run_dir.parent / "link", "best/best.json") == {"path": "best-3"}


def test_open_regular_refuses_a_fifo_at_once_and_a_symlink_and_a_directory(run):
    run_dir, victim = run
    os.mkfifo(run_dir / "fifo")
    started = time.monotonic()
    with pytest.raises(BoundaryError, match="is a FIFO; expected a regular file"):
        open_regular(run_dir / "fifo")
    assert time.monotonic() - started < 5  # an open without O_NONBLOCK blocks forever
    os.symlink(victim / "secret.txt", run_dir / "link")
    with pytest.raises(BoundaryError, match="is a symlink"):
        open_regular(run_dir / "link")
    with pytest.raises(BoundaryError, match="is a directory"):
        open_regular(run_dir / "best")
    with pytest.raises(BoundaryError, match="no such file"):
        open_regular(run_dir / "none")


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON (line 1)"),
    ("[1, 2]", "expected a JSON object, got list"),
    ("\xff", "not UTF-8 text"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ('{"a": "' + "x" * 2000 + '"}', "larger than 1000 bytes"),
])
def test_read_json_gives_one_line_naming_the_file(tmp_path, text, message):
    (tmp_path / "m.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(BoundaryError) as info:
        read_json(tmp_path, "m.json", limit=1000 if "x" * 10 in text else 1 << 20)
    line = str(info.value)
    assert line.startswith(str(tmp_path / "m.json")) and message in line and "\n" not in line


def test_write_atomic_refuses_a_symlink_and_keeps_the_old_file_on_failure(run, monkeypatch):
    run_dir, victim = run
    os.symlink(victim / "secret.txt", run_dir / "metrics.json")
    with pytest.raises(BoundaryError, match="is a symlink; refusing to write through it"):
        write_atomic(run_dir / "metrics.json", "{}")
    assert (victim / "secret.txt").read_text() == "secret"
    with pytest.raises(BoundaryError, match="is a directory"):
        write_atomic(run_dir / "best", "{}")

    write_atomic(run_dir / "inputs.json", "old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(run_dir / "inputs.json", "new")
    with pytest.raises(OSError, match="No space left"):
        write_atomic(run_dir / "other.json", "new")
    assert (run_dir / "inputs.json").read_text() == "old"  # never a truncated file
    assert sorted(os.listdir(run_dir)) == ["best", "inputs.json", "metrics.json"]  # no temp file


def test_unlink_symlinks_at_removes_only_links_at_the_checkpoint_names(run):
    run_dir, victim = run
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir()
    os.symlink(victim / "secret.txt", ckpt / "ckpt-5.index")
    os.symlink(victim, ckpt / "ckpt-5_temp")
    os.symlink(victim / "secret.txt", ckpt / "ckpt-50.index")  # another checkpoint's name
    (ckpt / "ckpt-5.data-00000-of-00001").write_text("mine")
    removed = unlink_symlinks_at(ckpt / "ckpt-5")
    assert sorted(os.path.basename(p) for p in removed) == ["ckpt-5.index", "ckpt-5_temp"]
    assert sorted(os.listdir(ckpt)) == ["ckpt-5.data-00000-of-00001", "ckpt-50.index"]
    assert (victim / "secret.txt").read_text() == "secret"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_write_atomic_creates_files_as_open_would_under_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        write_atomic(tmp_path / "sweep.json", "{}")
        with open(tmp_path / "plain.txt", "w") as fh:  # what the rest of a run directory gets
            fh.write("x")
    finally:
        os.umask(previous)
    assert os.stat(tmp_path / "sweep.json").st_mode & 0o777 == 0o666 & ~umask
    assert os.stat(tmp_path / "plain.txt").st_mode & 0o777 == 0o666 & ~umask


def test_expect_kind_allows_missing_paths_and_refuses_the_wrong_kind(run):
    run_dir, victim = run
    assert expect_kind(run_dir, "logs/t000.log", directory=False) == os.path.join(run_dir, "logs", "t000.log")
    assert expect_kind(run_dir, "best", directory=True) == os.path.join(run_dir, "best")
    os.mkfifo(run_dir / "fifo")
    os.symlink(victim, run_dir / "link")
    for rel, directory, message in [("best", False, "is a directory; expected a regular file"),
                                    ("best/best.json", True, "is a regular file; expected a directory"),
                                    ("fifo", False, "is a FIFO; expected a regular file"),
                                    ("link", True, "is a symlink")]:
        with pytest.raises(BoundaryError, match=message):
            expect_kind(run_dir, rel, directory=directory)


def test_open_append_refuses_a_fifo_at_once_a_symlink_and_a_directory(run):
    run_dir, victim = run
    os.mkfifo(run_dir / "fifo")
    started = time.monotonic()
    with pytest.raises(BoundaryError, match="is a FIFO; expected a regular file"):
        os.close(open_append(run_dir / "fifo"))  # no reader: an open without O_NONBLOCK blocks
    assert time.monotonic() - started < 5
    os.symlink(victim / "secret.txt", run_dir / "link")
    with pytest.raises(BoundaryError, match="is a symlink; refusing to write through it"):
        open_append(run_dir / "link")
    assert (victim / "secret.txt").read_text() == "secret"
    with pytest.raises(BoundaryError, match="is a directory"):
        open_append(run_dir / "best")
    for text in ("a\n", "b\n"):  # created, then appended to
        with os.fdopen(open_append(run_dir / "log"), "a") as fh:
            fh.write(text)
    assert (run_dir / "log").read_text() == "a\nb\n"


def test_read_tail_reads_the_last_bytes_of_a_regular_file_only(run):
    run_dir, victim = run
    (run_dir / "log").write_bytes(b"x" * 100 + b"the end\n")
    assert read_tail(run_dir / "log", limit=8) == b"the end\n"
    assert read_tail(run_dir / "log") == b"x" * 100 + b"the end\n"
    os.symlink(victim / "secret.txt", run_dir / "link")
    with pytest.raises(BoundaryError, match="is a symlink"):
        read_tail(run_dir / "link")
