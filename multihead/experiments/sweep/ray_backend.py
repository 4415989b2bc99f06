"""`multihead sweep --backend ray`: each trial a Ray task, so a Ray cluster spreads a sweep.

The task runs the same `multihead train` process as the local backend, on whichever node
Ray schedules it, with `num_cpus` = the trial's thread count (so Ray packs as many trials
on a node as its CPUs allow). The sweep directory must be on a file system every node
sees (the trials write their run directories and logs there), and every node needs
multihead and its dependencies installed.

`pip install 'multihead[ray]'`. Without `--ray-address` the sweep starts a local Ray
instance on 127.0.0.1 (`--ray-cpus` bounds it) and stops it at the end; with
`--ray-address auto` or `ray://host:10001` it joins an existing cluster
(`ray.init(address=...)`) and leaves it running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Mapping, Sequence

from multihead._boundary import open_append
from multihead.experiments.config.schema import ConfigError
from multihead.experiments.sweep.sweep import _die_with_parent, thread_env, trial_command, trial_env


def _run_trial(command: list[str], env: dict[str, str], log_path: str) -> int:
    """A Ray task: one trial's `multihead train` process on this node; its exit code."""
    command = [sys.executable] + command[1:]  # this node's interpreter
    with os.fdopen(open_append(log_path), "a", encoding="utf-8") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **env},
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        return proc.wait()


class RayBackend:
    """Runs each trial as a Ray task (see the module docstring).

    Args:
        threads: TensorFlow threads (and Ray CPUs) per trial; None: 1 CPU, TF's own pools.
        address: an existing cluster (`ray.init(address=...)`); None starts a local instance.
        num_cpus: CPUs of the local instance (None: all of this machine's).
    """

    def __init__(self, threads: int | None, address: str | None = None,
                 num_cpus: int | None = None, allow_import: Sequence[str] = (),
                 imports: Sequence[str] = ()) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--backend ray needs Ray: pip install 'multihead[ray]'") from None
        self._ray = ray
        self.threads = threads
        self.allow_import = tuple(allow_import)
        self.imports = tuple(imports)
        self._owns = not ray.is_initialized()
        if self._owns:
            if address is None:
                ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                         log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False)
        self._task = ray.remote(_run_trial)
        self._env = {k: v for k, v in trial_env(threads).items()
                     if k == "PYTHONPATH" or k in thread_env(threads)}

    def start(self, base: str, run_dir: str, log_path: str, overrides: Mapping[str, Any],
              resume: bool) -> Any:
        command = trial_command(os.path.abspath(base), os.path.abspath(run_dir), overrides, resume,
                                self.allow_import, self.imports)
        return self._task.options(num_cpus=self.threads or 1).remote(
            command, self._env, os.path.abspath(log_path))

    def poll(self, ref: Any) -> int | None:
        ready, _ = self._ray.wait([ref], timeout=0)
        return self._ray.get(ref) if ready else None

    def stop(self, ref: Any) -> None:
        self._ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._owns:
            self._ray.shutdown()
