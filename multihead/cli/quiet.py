"""TensorFlow without its start-up chatter, unless `--verbose`.

Importing TensorFlow and probing its devices prints C++ log lines straight to file
descriptor 2, before any Python logging is configured: absl's "All log messages before
absl::InitializeLog() ..." warning, CUDA probing (`cudart_stub.cc`, an error-level
`failed call to cuInit` on every CPU-only machine) and cpu-feature / oneDNN notices.
`TF_CPP_MIN_LOG_LEVEL` does not reach the lines absl writes before it is initialised, so a
command that needs TensorFlow imports it here with descriptor 2 captured, and shows the
captured text only if the import fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from typing import BinaryIO, Iterator

#: `TF_CPP_MIN_LOG_LEVEL` of a quiet command: TensorFlow's C++ errors still show.
QUIET_LEVEL = "2"


def configure(verbose: bool) -> None:
    """Sets TensorFlow's C++ log level for this command, before TensorFlow is imported:
    every line with `verbose`, errors only without."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0" if verbose else QUIET_LEVEL


@contextlib.contextmanager
def _descriptor_2_to(sink: BinaryIO) -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def tensorflow_lines_dropped(verbose: bool) -> Iterator[None]:
    """Runs a block that may import TensorFlow on the way (a config rule that reads an
    aggregation method, a user module) with what C++ writes to descriptor 2 dropped, as
    `import_tensorflow` drops it; Python's own `sys.stderr` (warnings, messages) still shows.
    Nothing is changed with `verbose` or once TensorFlow is imported."""
    if verbose or "tensorflow" in sys.modules:
        yield
        return
    sys.stderr.flush()
    python_stderr = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    saved = sys.stderr
    sys.stderr = python_stderr
    try:
        with tempfile.TemporaryFile() as captured, _descriptor_2_to(captured):
            yield
    finally:
        sys.stderr = saved
        python_stderr.close()
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        tf.get_logger().setLevel(logging.ERROR)
        logging.getLogger("absl").setLevel(logging.ERROR)


def import_tensorflow(verbose: bool) -> None:
    """Imports TensorFlow and lists its devices (where CUDA is probed); without `verbose`
    the lines printed on the way are dropped and TensorFlow's and absl's Python loggers
    show errors only.

    Raises:
        Whatever the import raises, after printing what it wrote to stderr.
    """
    if verbose:
        import tensorflow as tf

        tf.config.list_physical_devices()
        return
    if "tensorflow" not in sys.modules:
        with tempfile.TemporaryFile() as captured:
            try:
                with _descriptor_2_to(captured):
                    import tensorflow as tf

                    tf.config.list_physical_devices()
            except BaseException:
                captured.seek(0)
                sys.stderr.write(captured.read().decode("utf-8", errors="replace"))
                raise
    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
