"""A sweep directory is a boundary (issue 35, item 1): `config.yaml`, `logs/<id>.log`,
`trials/<id>` and `sweep.json` are read and written as regular files and directories inside
it, by `sweep --resume` and by each trial (`train --config-inside`). A symlink out, a FIFO, a
directory where a file belongs or a file where a directory belongs is one line on stderr and
exit 2, before any trial starts; files outside the sweep are untouched; nothing hangs.

Every command runs in this process under an alarm (what it refuses, it refuses before
starting a trial process), so a hang fails the test rather than the suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal

import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.sweep.sweep import LocalBackend, trial_command

ALARM = 120  # an in-process command that only reads and refuses; a hang is far beyond
TINY = {
    "seed": 0,
    "data": {"kind": "mmoe", "train_size": 64, "eval_size": 16, "input_dim": 4},
    "model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"y1": {}, "y2": {}}},
    "train": {"steps": 2, "batch_size": 16, "eval_every": 2},
    "log": {"every": 2, "histograms_every": 0},
}
_TF_LOG = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages before absl)")


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _bounded(what: str):
    """Fails the test when the block runs longer than `ALARM` seconds (a blocked open)."""
    def hang(signum, frame):
        raise _Hang

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(ALARM)
    try:
        yield
    except _Hang:
        pytest.fail(f"{what} hung (> {ALARM} s)")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _cli(*args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `multihead ARGS` in this process, under an alarm."""
    out, err = io.StringIO(), io.StringIO()
    with _bounded(f"multihead {' '.join(map(str, args))}"):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _refused(result, *needles: str) -> str:
    code, _, err = result
    lines = [line for line in err.strip().splitlines() if not _TF_LOG.match(line)]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith("multihead: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def victim(tmp_path):
    """A file outside the sweep that no command may read into the sweep or change."""
    path = tmp_path / "victim.yaml"
    path.write_text(yaml.safe_dump({**TINY, "seed": 99, "secret": "victim text"}))
    before = (path.read_bytes(), os.stat(path).st_mtime_ns)
    yield path
    assert (path.read_bytes(), os.stat(path).st_mtime_ns) == before, "the victim changed"


@pytest.fixture
def sweep(tmp_path):
    """A sweep directory with one pending trial, as `sweep` writes it before running."""
    root = tmp_path / "sweep"
    (root / "trials").mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(TINY))
    (root / "sweep.json").write_text(json.dumps({
        "version": 1, "config": "config.yaml", "search": "grid", "objective": "eval/mean_loss",
        "direction": "minimize", "axes": ["seed"],
        "trials": [{"id": "t000", "overrides": {"seed": 1}, "run_dir": "trials/t000",
                    "status": "pending", "error": None, "metrics": None, "objective": None}]}))
    return root


def _listing(root) -> set[str]:
    """Every path below `root` (symlinks not followed): what a refused command must not add."""
    found = set()
    for base, dirs, files in os.walk(root):
        found |= {os.path.relpath(os.path.join(base, n), root) for n in dirs + files}
    return found - {".lock"}


def _resume_refused(sweep, *needles: str) -> None:
    index, listing = (sweep / "sweep.json").read_bytes(), _listing(sweep)
    _refused(_cli("sweep", "--resume", sweep, "--quiet"), *needles)
    assert (sweep / "sweep.json").read_bytes() == index  # nothing ran, nothing recorded
    assert _listing(sweep) == listing  # no log, no trial directory created


def test_resume_refuses_a_config_symlinked_out_of_the_sweep(sweep, victim):
    os.unlink(sweep / "config.yaml")
    os.symlink(victim, sweep / "config.yaml")
    _resume_refused(sweep, "config.yaml' is a symlink")
    assert "victim text" not in (sweep / "sweep.json").read_text()
    assert not (sweep / "logs").exists()


def test_resume_refuses_a_config_that_is_a_fifo(sweep):
    os.unlink(sweep / "config.yaml")
    os.mkfifo(sweep / "config.yaml")
    _resume_refused(sweep, "config.yaml: is a FIFO; expected a regular file")


def test_resume_refuses_a_trial_log_that_is_a_fifo(sweep):
    (sweep / "logs").mkdir()
    os.mkfifo(sweep / "logs" / "t000.log")
    _resume_refused(sweep, "logs/t000.log: is a FIFO; expected a regular file")


def test_resume_refuses_a_trial_log_that_is_a_directory(sweep):
    (sweep / "logs" / "t000.log").mkdir(parents=True)
    _resume_refused(sweep, "logs/t000.log: is a directory; expected a regular file")


def test_resume_refuses_a_trial_log_symlinked_out(sweep, victim):
    (sweep / "logs").mkdir()
    os.symlink(victim, sweep / "logs" / "t000.log")
    _resume_refused(sweep, "t000.log' is a symlink")


def test_resume_refuses_logs_that_are_a_file(sweep):
    (sweep / "logs").write_text("not a folder\n")
    _resume_refused(sweep, "logs: is a regular file; expected a directory")


def test_resume_refuses_a_trial_directory_that_is_a_regular_file(sweep):
    (sweep / "trials" / "t000").write_text("not a run directory\n")
    _resume_refused(sweep, "trials/t000: is a regular file; expected a directory")
    assert (sweep / "trials" / "t000").read_text() == "not a run directory\n"  # not removed


def test_resume_refuses_a_trial_directory_that_is_a_fifo(sweep):
    os.mkfifo(sweep / "trials" / "t000")
    _resume_refused(sweep, "trials/t000: is a FIFO; expected a directory")


def test_resume_refuses_an_index_that_is_a_fifo(sweep):
    os.unlink(sweep / "sweep.json")
    os.mkfifo(sweep / "sweep.json")
    _refused(_cli("sweep", "--resume", sweep, "--quiet"), "sweep.json: is a FIFO")


def test_resume_refuses_an_index_symlinked_out(sweep, tmp_path):
    os.replace(sweep / "sweep.json", tmp_path / "outside.json")
    os.symlink(tmp_path / "outside.json", sweep / "sweep.json")
    before = (tmp_path / "outside.json").read_bytes()
    _refused(_cli("sweep", "--resume", sweep, "--quiet"), "sweep.json")
    assert (tmp_path / "outside.json").read_bytes() == before


# -- the trial reads the sweep's config through the boundary too --------------------------


def test_trial_command_reads_the_config_inside_the_sweep(sweep):
    command = trial_command(str(sweep / "config.yaml"), str(sweep / "trials" / "t000"), {}, False)
    assert command[command.index("--config-inside") + 1] == str(sweep)


def test_a_trial_refuses_a_config_symlinked_out(sweep, victim, tmp_path):
    """What a trial process runs: a symlink planted after the sweep's own check is refused
    by the trial, which never reads the outside file."""
    os.unlink(sweep / "config.yaml")
    os.symlink(victim, sweep / "config.yaml")
    _refused(_cli("train", sweep / "config.yaml", "--config-inside", sweep, "--quiet",
                  "--run-dir", sweep / "trials" / "t000"), "config.yaml' is a symlink")
    assert not (sweep / "trials" / "t000").exists()


def test_a_trial_refuses_a_config_that_is_a_fifo(sweep):
    os.unlink(sweep / "config.yaml")
    os.mkfifo(sweep / "config.yaml")
    _refused(_cli("train", sweep / "config.yaml", "--config-inside", sweep, "--quiet",
                  "--run-dir", sweep / "trials" / "t000"), "config.yaml: is a FIFO")
    assert not (sweep / "trials" / "t000").exists()


def test_the_backend_refuses_a_log_that_became_a_fifo(sweep):
    """A FIFO planted at a trial's log after the resume check: the open fails at once."""
    (sweep / "logs").mkdir()
    os.mkfifo(sweep / "logs" / "t000.log")
    from multihead._boundary import BoundaryError

    with _bounded("starting a trial"), pytest.raises(BoundaryError, match="is a FIFO"):
        LocalBackend(threads=1).start(str(sweep / "config.yaml"), str(sweep / "trials" / "t000"),
                                      str(sweep / "logs" / "t000.log"), {}, resume=False)
