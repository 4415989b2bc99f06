"""`multihead sweep`: trials from a config's axes, run by a local or Ray backend, or an
Optuna search (see `multihead sweep --help` and docs/sweeps.md).

The command sits here, above the sweep modules it drives, so `multihead.experiments.sweep`
never imports its Ray and Optuna backends back.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Sequence

from multihead._boundary import BoundaryError
from multihead.experiments.config.schema import ConfigError
from multihead.experiments.run.directory import default_run_dir
from multihead.experiments.sweep.index import INDEX, read_index
from multihead.experiments.sweep.sweep import (
    LocalBackend,
    Sweep,
    as_sets,
    check_new_dir,
    check_sweep_dir,
    check_objective,
    create_sweep,
    load_base,
    parse_grid_arg,
    parse_sample_arg,
    threads_per_trial,
    trial_overrides,
)


def _default_sweep_dir(config_path: str) -> str:
    return default_run_dir(config_path, prefix="sweep-")


def resolve_threads(text: str, jobs: int) -> int | None:
    """`--threads`: auto (`max(1, cores // jobs)`), none (TensorFlow's default) or a count."""
    if text == "auto":
        return threads_per_trial(jobs)
    if text == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"--threads {text!r}: use auto, none or a count >= 1")
    return value


def make_backend(name: str, threads: int | None, address: str | None = None,
                 num_cpus: int | None = None, allow_import: Sequence[str] = (),
                 imports: Sequence[str] = ()) -> Any:
    if name == "local":
        if address:
            raise ConfigError("--ray-address: only used with --backend ray")
        return LocalBackend(threads, allow_import, imports)
    from multihead.experiments.sweep.ray_backend import RayBackend  # imports ray: only when used

    return RayBackend(threads, address=address, num_cpus=num_cpus, allow_import=allow_import,
                      imports=imports)


def _heads(base: Mapping[str, Any]) -> list[str]:
    heads = (base.get("model") or {}).get("heads") or {}
    return [str(h) for h in heads]


def _only_head(config_path: str, base: dict[str, Any], head: str,
               allow_import: Sequence[str]) -> dict[str, Any]:
    """`sweep --only-head HEAD`: the base config every trial runs is the single-task baseline
    of HEAD (`train --only-head`), so each trial trains HEAD alone."""
    from multihead.experiments.config.schema import from_dict, to_dict
    from multihead.experiments.run.single_task import head_list, only_heads

    config = from_dict(base, config_path, allow_import)
    return to_dict(only_heads(config, head_list(head), source=f"{config_path}: --only-head",
                              allow_import=allow_import))


def _simplex_axes(spec: Any, heads: Sequence[str], per_edge: int) -> None:
    """`--simplex N`: one zip axis per head, `model.heads.<head>.weight`, stepping together
    through the preference vectors of `simplex_preferences(heads, N)`."""
    from multihead.experiments.results.pareto import simplex_preferences

    keys = [f"model.heads.{h}.weight" for h in heads]
    taken = [k for k in keys if k in spec.keys()]
    if taken:
        raise ConfigError(f"--simplex: {taken[0]} is already an axis of the sweep")
    if spec.zip:
        raise ConfigError(f"--simplex: the sweep has zip axes already ({', '.join(spec.zip)}); "
                          "the preferences are a zip axis of their own")
    try:
        vectors = simplex_preferences(heads, per_edge)
    except ValueError as err:
        raise ConfigError(f"--simplex {per_edge}: {err}") from None
    for key, head in zip(keys, heads):
        spec.zip[key] = [v[head] for v in vectors]


def _lock(sweep_dir: str) -> Any:
    """The sweep directory's lock (`RunLock`, as `train` takes on a run directory): one
    sweep process at a time acts on a sweep's index and trial directories."""
    from multihead.experiments.run.guard import RunLock, RunLocked, RunLockError

    try:
        return RunLock(sweep_dir)
    except (RunLocked, RunLockError) as err:
        raise ConfigError(str(err).replace("run directory", "sweep directory", 1)) from None


def cmd_sweep(args: Any) -> int:
    """`multihead sweep` (see `multihead sweep --help` and docs/sweeps.md)."""
    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: must be >= 1")
    if args.resume:
        if args.config or args.grid or args.sample or args.set or getattr(args, "only_head", None):
            raise ConfigError("--resume SWEEP_DIR: the trials are those of its sweep.json; give no "
                              "CONFIG, --grid, --sample, --set or --only-head")
        if not os.path.isdir(args.resume) or not os.path.lexists(os.path.join(args.resume, INDEX)):
            read_index(args.resume)  # the one-line "no sweep.json there"
        with _lock(args.resume):
            return _bounded(_sweep, args, args.resume)
    if not args.config:
        raise ConfigError("a CONFIG is required (or --resume SWEEP_DIR)")
    sweep_dir = args.sweep_dir or _default_sweep_dir(args.config)
    return _bounded(_sweep, args, sweep_dir)


def _bounded(run: Any, *args: Any) -> int:
    """`run(*args)`, a malformed entry of the sweep directory (`BoundaryError`: a symlink, a
    FIFO, a file where a directory belongs) becoming the one-line exit 2 of a `ConfigError`."""
    try:
        return run(*args)
    except BoundaryError as err:
        raise ConfigError(str(err)) from None


def _sweep(args: Any, sweep_dir: str) -> int:
    stream = None if args.quiet else sys.stderr
    threads = resolve_threads(args.threads, args.jobs)
    allow_import = tuple(getattr(args, "allow_import", None) or ())
    if args.resume:
        sweep = Sweep(sweep_dir, read_index(sweep_dir), stream)
        check_sweep_dir(sweep_dir, sweep.index["trials"])  # before anything is started
        search = sweep.index.get("search", "grid")
    else:
        base, spec = load_base(args.config, args.set or [], allow_import)
        if getattr(args, "only_head", None):
            base = _only_head(args.config, base, args.only_head, allow_import)
        for text in args.grid or []:
            key, values = parse_grid_arg(text)
            if key in spec.keys():
                raise ConfigError(f"--grid {text!r}: {key} is already an axis of the sweep")
            spec.grid[key] = values
        if getattr(args, "simplex", None) is not None:
            _simplex_axes(spec, _heads(base), args.simplex)
        for text in args.sample or []:
            key, distribution = parse_sample_arg(text)
            if key in spec.keys():
                raise ConfigError(f"--sample {text!r}: {key} is already an axis of the sweep")
            spec.random[key] = distribution
        if args.sample:
            spec.count, spec.seed = args.trials or 10, args.search_seed
        objective = check_objective(args.objective, args.direction, _heads(base))
        search = args.search
        if search == "optuna":
            if not spec.random:
                raise ConfigError("--search optuna: give the search space with --sample KEY=KIND:... "
                                  "or sweep.random.axes")
            if spec.grid or spec.zip:
                raise ConfigError("--search optuna: searches the --sample / sweep.random axes only; "
                                  "remove --grid and sweep.grid/zip")
            trials: list[dict[str, Any]] = []
        else:
            if not spec.keys():
                raise ConfigError(f"{args.config}: no axes to sweep; give --grid KEY=V1,V2 "
                                  "(repeatable) or a sweep: section")
            trials = trial_overrides(spec)
        check_new_dir(sweep_dir)  # before the lock file is written into it
        try:
            os.makedirs(sweep_dir, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"--sweep-dir {sweep_dir!r}: cannot create it ({err.strerror})") from None
        with _lock(sweep_dir):
            sweep = create_sweep(sweep_dir, base, trials, objective, stream, search=search)
            if search == "optuna":
                from multihead.experiments.sweep.search import save_space

                save_space(sweep, spec, n_trials=args.trials or 10, seed=args.search_seed)
            return _run(args, sweep, search, threads, stream, allow_import)
    return _run(args, sweep, search, threads, stream, allow_import)


def _run(args: Any, sweep: Sweep, search: str, threads: int | None, stream: Any,
         allow_import: tuple[str, ...]) -> int:
    if stream is not None:
        print(f"sweep directory: {sweep.sweep_dir} ({args.jobs} jobs, "
              f"{threads or 'default'} threads each)", file=stream)
    sweep.allow_import = allow_import
    backend = make_backend(args.backend, threads, args.ray_address, args.ray_cpus, allow_import,
                           tuple(getattr(args, "imports", None) or ()))
    if search == "optuna":
        from multihead.experiments.sweep.search import run_optuna

        index = run_optuna(sweep, backend, args.jobs)
    else:
        index = sweep.run(backend, args.jobs)
    failed = [t for t in index["trials"] if t["status"] == "failed"]
    for trial in failed:
        print(f"{trial['id']} failed: {trial['error']}", file=sys.stderr)
    best = sweep.best()
    print(f"wrote {sweep.sweep_dir} ({len(index['trials'])} trials, {len(failed)} failed"
          + (f"; best {sweep.objective.name} {best['objective']:.6g}: {best['id']} "
             f"{' '.join(as_sets(best['overrides']))}" if best else "") + ")")
    return 1 if failed else 0
