"""Install multihead: `pip install -e .[test]` (add `[rl]` for the RL tasks, `[data]` for MultiDigits,
`[plot]` for PNG reports, `[optuna]` / `[ray]` for sweep search / backend, `[docs]` to build the documentation site with `mkdocs build --strict`)."""

import re
from pathlib import Path

from setuptools import find_packages, setup

_version = re.search(
    r'^__version__ = "([^"]+)"', Path(__file__).with_name("multihead").joinpath("__init__.py").read_text(), re.M
).group(1)

setup(
    name="multihead",
    version=_version,
    description="Shared trunk, several heads, one loss and one optimizer per head, on TensorFlow 2",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["multihead", "multihead.*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow==2.21.*",
        "numpy",
        "tensorboard",
        "pyyaml",
    ],
    extras_require={
        # scipy: reference QP solves in tests; scikit-learn: MultiDigits; tensorflow-datasets: data.kind tfds
        # (its etils.epath imports importlib_resources without declaring it in current releases)
        # optuna, ray, pandas: sweep search and backend, Comparison.to_dataframe; hypothesis: fuzz suite;
        # pytest-xdist: README's test command runs the suite on two worker processes
        "test": ["pytest", "pytest-xdist", "hypothesis", "gymnasium", "matplotlib>=3.7", "scipy", "scikit-learn",
                 "tensorflow-datasets", "importlib_resources", "optuna", "ray", "pandas"],
        "data": ["scikit-learn"],  # MultiDigits (data.kind: multidigits): sklearn's handwritten digits
        "tfds": ["tensorflow-datasets", "importlib_resources"],  # data.kind: tfds, datasets prepared locally
        "rl": ["gymnasium"],
        "plot": ["matplotlib>=3.7"],
        "optuna": ["optuna"],  # multihead sweep --search optuna
        "ray": ["ray"],  # multihead sweep --backend ray
        "pandas": ["pandas"],  # Comparison.to_dataframe()
        # API reference from the docstrings by static analysis (griffe): builds without importing TF.
        "docs": ["mkdocs~=1.6.1", "mkdocstrings~=1.0.8", "mkdocstrings-python~=2.0.11"],
    },
    entry_points={"console_scripts": ["multihead = multihead.cli.main:run"]},
)
