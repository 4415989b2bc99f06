"""README's first command installs what the main job needs and none of the test extras.

Slow (a fresh venv downloads or unpacks TensorFlow): run with `pytest -m slow`.
"""

import os
import re
import subprocess
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _extras() -> dict[str, list[str]]:
    text = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    block = text[text.index('"test": ['):]
    test = re.findall(r'"([A-Za-z0-9_.-]+)[^"]*"', block[:block.index("]")])
    return {"test": [name for name in test if name != "test"]}


@pytest.mark.slow
def test_readme_first_command_installs_no_test_extra_and_trains(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "-e", ROOT], capture_output=True,
                             text=True, timeout=1800)
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, timeout=120).stdout.lower()
    installed = {line.split("==")[0].replace("_", "-") for line in listed.splitlines()}
    extras = {name.lower().replace("_", "-") for name in _extras()["test"]}
    assert not extras & installed, f"README's first command installed test extras: {extras & installed}"
    run = subprocess.run([str(env_dir / "bin" / "multihead"), "train",
                          os.path.join(ROOT, "experiments", "quickstart.yaml"), "--set", "train.steps=100",
                          "--set", "train.eval_every=100", "--run-dir", str(tmp_path / "run"), "--quiet"],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.json").exists()
