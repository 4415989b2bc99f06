"""The README's Python example and its two commands stay true."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        return fh.read()


def test_python_api_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    assert blocks, "README has no Python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - our own README
    metrics = namespace["trainer"].evaluate(namespace["data"].eval)
    assert set(metrics) == {"y1", "y2"}


def test_top_commands_match_ci():
    readme = _readme()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert "multihead train experiments/quickstart.yaml" in commands[0]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        ci_lines = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    assert ci_lines[-1] == commands[1].strip()  # CI runs exactly README's test command
