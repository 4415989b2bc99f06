"""`benchmarks/torch_peers.py`: runs in the suite without torch (its rows skipped with one line),
and a Python without LibMTL skips LibMTL's EW row with one line."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "torch_peers.py")


def _has(module):
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    return out.returncode == 0


def _bench():
    spec = importlib.util.spec_from_file_location("torch_peers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args):
    out = subprocess.run([sys.executable, SCRIPT, "--quick", *args], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def test_quick_without_a_torch_python_is_one_line():
    assert _run() == ["PyTorch rows need --torch-python (a venv with torch); nothing measured"]


@pytest.mark.skipif(_has("torch"), reason="this Python has torch")
def test_a_python_without_torch_is_one_line():
    assert _run("--torch-python", sys.executable) == [
        f"PyTorch rows skipped: --torch-python {sys.executable} cannot import torch"]


def test_a_missing_python_is_one_line():
    missing = os.path.join(ROOT, "no-such-venv", "bin", "python")
    lines = _run("--torch-python", missing)
    assert len(lines) == 1
    assert lines[0].startswith(f"PyTorch rows skipped: --torch-python {missing}")


@pytest.mark.skipif(_has("LibMTL"), reason="this Python has LibMTL")
def test_a_torch_without_libmtl_skips_its_row_with_one_line(tmp_path, monkeypatch):
    (tmp_path / "torch").mkdir()  # a stand-in torch: the check fails at `import LibMTL`
    (tmp_path / "torch" / "__init__.py").write_text(
        "import types\nhub = types.SimpleNamespace(load_state_dict_from_url=None)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    runs, line = _bench().libmtl_check(sys.executable, 4)
    assert (runs, line) == (
        False, "LibMTL EW row skipped (K=4): ModuleNotFoundError: No module named 'LibMTL'")
