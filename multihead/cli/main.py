"""The `multihead` command: `train` (and `train --resume`), `validate`, `report`, `export`,
`predict`, `sweep` (in `multihead.cli.sweep`) and `compare`. Nothing in the package imports
this package; its module-level imports load no TensorFlow, so `--help` answers at once.

Exit codes: 0 success, 2 bad input (config, overrides, paths, a run directory in use)
with a one-line error on stderr and nothing written, 1 a run that failed (its directory,
logs and `status.json` kept), 130 / 143 a run stopped by SIGINT / SIGTERM (checkpointed,
resumable with `--resume`). `train` is one call of `multihead.experiments.run.experiment.run_experiment`;
`multihead.experiments.run.guard` has the run-directory rules.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
from typing import Any, Sequence


from multihead.cli import quiet
from multihead.experiments.config.schema import ConfigError, ExperimentConfig
from multihead.experiments.run.resume import RunInputError
from multihead.monitoring.metric_key import FORMS, MEAN_LOSS

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input given on the command line (exit code 2)."""


def _print_table(metrics: dict[str, Any], stream: Any) -> None:
    """The end-of-run table: per head, the loss and every configured metric on the eval data
    (`eval`), on the full train set (`final_train`), the loss of the last logged batch
    (`train`), the constant predictor's value (`baseline`) and how much better than it the
    eval is (direction-aware); then, with per-head early stopping or best checkpoints, each
    head's best evaluation, freeze and best checkpoint."""
    from multihead.monitoring.head_bests import (
        format_head_bests, format_versus, head_bests, versus_baseline)

    rows = [("head", "metric", "eval", "final_train", "train (last batch)", "baseline",
             "vs baseline")]
    for head, values in metrics["eval"].items():
        for name, value in values.items():
            base = metrics.get("baseline", {}).get(head, {}).get(name)
            final_train = metrics.get("final_train", {}).get(head, {}).get(name)
            batch = metrics.get("train", {}).get(head, {}) if name == "loss" else {}
            rows.append((head, name, f"{value:.4g}", _number(final_train),
                         f"{batch['loss']:.4g} @{batch['step']}" if batch else "-",
                         _number(base), format_versus(versus_baseline(name, value, base))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=stream)
    for line in format_head_bests(head_bests(metrics)):
        print(line, file=stream)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def cmd_validate(args: argparse.Namespace) -> int:
    """The config's rules; with `--build`, also what `train` builds and runs before its first
    step (the data, the model, the objectives, one forward and backward pass), timed."""
    from multihead.experiments.run.experiment import (
        load_experiment, prepare_runner, print_parameters)

    with quiet.tensorflow_lines_dropped(args.verbose):  # a rule may read an aggregation method
        config = load_experiment(args.config, args.set or [], args.allow_import or (),
                                 only_head=getattr(args, "only_head", None))
    heads = ", ".join(config.model.heads)
    length = f"{config.train.epochs} epochs" if config.train.epochs else f"{config.train.steps} steps"
    if not args.build:
        print(f"{args.config}: ok (task {config.task}, heads {heads}, {length}); the config only: "
              "the data, the model and a first step were not built (--build checks them as train "
              "does before its first step)")
        return 0
    start = time.perf_counter()
    runner = prepare_runner(config, args.config)
    print(f"{args.config}: ok (task {config.task}, heads {heads}, {length}); the data, the model "
          f"and a first step built and checked in {time.perf_counter() - start:.1f} s")
    print_parameters(runner, sys.stdout)
    return 0


def _checkpoint_name(run_dir: str, path: str) -> str:
    """How `predict` and `export` name a checkpoint: as `status.json` does, relative to the
    run directory (`checkpoints/final`), or the path given when it lies outside."""
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(run_dir))
    return path if relative.startswith("..") else relative


def _heads_arg(args: argparse.Namespace, model: Any) -> list[str]:
    heads = [h.strip() for h in args.heads.split(",") if h.strip()] if args.heads else None
    unknown = [h for h in heads or [] if h not in model.head_names]
    if heads is not None and (not heads or unknown):
        raise UsageError(f"--heads {args.heads!r}: the run's heads are {','.join(model.head_names)}")
    return heads or list(model.head_names)


def cmd_export(args: argparse.Namespace) -> int:
    from multihead.experiments.run.load import read_run_config, run_checkpoint
    from multihead.io.checkpoints import restore_checkpoint
    from multihead.io.export import export_saved_model

    run_dir, saved = args.run_dir, os.path.join(args.run_dir, "config.yaml")
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir!r}: not a directory; is it a multihead run directory?")
    if os.path.islink(args.out) or (os.path.lexists(args.out) and (
            not os.path.isdir(args.out) or os.listdir(args.out))):
        raise UsageError(f"OUT {args.out!r} exists and is not empty; choose another path")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise UsageError(f"OUT {args.out!r}: directory {os.path.dirname(os.path.abspath(args.out))!r} "
                         "does not exist")
    config = read_run_config(run_dir, allow_import=args.allow_import or ())
    if config.task == "supervised":  # the input the run recorded: its data is never built
        from multihead.experiments.run.load import build_run_model

        path = run_checkpoint(run_dir, _export_checkpoint(args, config))  # predict's, load_run's rule
        model = build_run_model(config, run_dir)
    else:
        from multihead.experiments.run.experiment import prepare_runner

        model = getattr(prepare_runner(config, saved), "model", None)
    if model is None:
        raise UsageError(f"task {config.task!r} has no model to export")
    chosen = _heads_arg(args, model)
    if config.task != "supervised":
        try:
            path = run_checkpoint(run_dir)
        except ConfigError:
            raise UsageError(f"{run_dir!r}: no checkpoint in {os.path.join(run_dir, 'checkpoints')} "
                             "to export") from None
    try:
        restore_checkpoint(path, model, parts=["trunk"] + [f"heads/{h}" for h in chosen])
        signatures = list(export_saved_model(model, args.out, heads=chosen).signatures)
    except ValueError as err:
        raise UsageError(f"export: {err}") from None
    print(f"wrote {args.out} from checkpoint {_checkpoint_name(run_dir, path)} "
          f"(signatures: {', '.join(signatures)})")
    return 0


def _export_checkpoint(args: argparse.Namespace, config: ExperimentConfig) -> str | None:
    """The checkpoint `export` restores: the final one, or with `--best` the run's best
    (`best`), or with `--best --head H` head H's own best (`best/H`)."""
    if not args.best:
        return None
    heads = [h.strip() for h in (args.heads or "").split(",") if h.strip()]
    if len(heads) > 1:
        raise UsageError(f"--best --heads {args.heads!r}: each head has its own best checkpoint; "
                         "export one head at a time (--best --head H)")
    if not heads:
        return "best"
    from multihead.experiments.run.load import best_checkpoint_name

    return best_checkpoint_name(config, heads[0])


def _input_names(model: Any) -> list[str] | None:
    """The input names of a model with named inputs (a functional trunk on a dict), else None."""
    from multihead.io.export import named_inputs

    named = named_inputs(model)
    return None if named is None else list(named)


def cmd_predict(args: argparse.Namespace) -> int:
    from multihead.experiments.build.data_sources import read_inputs
    from multihead.experiments.run.load import load_run
    from multihead.io.predictions import SUFFIXES, write_predictions

    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise UsageError(f"--out {args.out!r}: directory {out_dir!r} does not exist")
    if os.path.splitext(args.out)[1].lower() not in SUFFIXES:
        raise UsageError(f"--out {args.out!r}: predictions are written as .npz or .csv; end the "
                         "name with one of them")
    if os.path.islink(args.out) or (os.path.lexists(args.out) and not os.path.isfile(args.out)):
        raise UsageError(f"--out {args.out!r}: exists and is not a regular file (a directory, a "
                         "symlink, ...); choose another path")
    run = load_run(args.run_dir, checkpoint=args.checkpoint, allow_import=args.allow_import or ())
    heads = _heads_arg(args, run.model)
    inputs = read_inputs(run.config.data, args.data, input_names=_input_names(run.model))
    try:
        predictions = run.model.predict(inputs, batch_size=args.batch_size, heads=heads)
    except (ValueError, TypeError, KeyError) as err:
        raise UsageError(f"--data {args.data!r}: the model cannot take these inputs: "
                         f"{str(err).splitlines()[0]}") from None
    write_predictions(args.out, predictions)
    rows = len(next(iter(predictions.values())))
    print(f"wrote {args.out}: {rows} rows, heads {', '.join(heads)} "
          f"(checkpoint {_checkpoint_name(args.run_dir, run.checkpoint)})")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from multihead.experiments.run.experiment import run_experiment

    result = run_experiment(args.config, run_dir=args.run_dir, resume=args.resume,
                            overrides=args.set or [], allow_import=args.allow_import or (),
                            only_head=args.only_head, quiet=args.quiet,
                            config_inside=getattr(args, "config_inside", None))
    if result.message is not None:
        print(f"multihead: {result.message}", file=sys.stderr)
    if result.metrics is not None:
        if "eval" in result.metrics:
            _print_table(result.metrics, sys.stdout)
        print(f"wrote {result.run_dir} (tensorboard --logdir {result.run_dir})")
    return result.exit_code


def cmd_report(args: argparse.Namespace) -> int:
    from multihead.monitoring import report

    if args.png:
        directory = os.path.dirname(os.path.abspath(args.png))
        if not os.path.isdir(directory):
            raise UsageError(f"--png {args.png!r}: directory {directory!r} does not exist")
    if args.groups_config and args.groups is None:
        raise UsageError("--groups-config FILE: give --groups N too (the groups it writes)")
    try:
        run = report.load_report(args.run_dir)
    except report.ReportError as err:
        raise UsageError(str(err)) from None
    grouping = _groupings(args, run) if args.groups is not None else None
    if args.png:
        try:
            report.plot_report(run, args.png)
        except ImportError:
            raise UsageError("--png needs matplotlib: pip install 'multihead[plot]'") from None
    if args.json:
        tree = report.report_to_dict(run)
        if grouping is not None:
            from multihead.monitoring.groupings import grouping_to_dict

            tree["groupings"] = grouping_to_dict(grouping)
        print(json.dumps(tree, indent=2))
    else:
        print(report.format_report(run))
        if grouping is not None:
            from multihead.monitoring.groupings import format_grouping

            print("\n" + format_grouping(grouping, args.groups))
        if args.png:
            print(f"wrote {args.png}")
        if args.groups_config:
            print(f"wrote {args.groups_config} (multihead sweep {args.groups_config}: one run per group)")
    return 0


def _groupings(args: argparse.Namespace, run: Any) -> Any:
    """`report --groups N`: the split of the run's heads with the largest total affinity;
    with `--groups-config FILE`, written as a sweep of one run per group."""
    from multihead.monitoring.groupings import task_groupings

    if args.groups < 1:
        raise UsageError(f"--groups {args.groups}: must be >= 1")
    if not run.affinity:
        raise UsageError(f"--groups: {args.run_dir!r} has no affinity/<i>/<j> scalars; train it "
                         "with log.affinity_every: N (Trainer(affinity_every=N))")
    grouping = task_groupings(run.affinity, args.groups)
    if args.groups_config:
        from multihead._boundary import BoundaryError
        from multihead.experiments.results.groups import write_grouped_sweep

        try:
            write_grouped_sweep(args.run_dir, grouping, args.groups_config,
                                f", from multihead report --groups {args.groups}")
        except BoundaryError as err:
            raise UsageError(f"--groups-config {args.groups_config!r}: {err}") from None
    return grouping


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multihead",
        description="Train multi-head networks (shared trunk, one loss and optimizer per head).",
    )
    parser.add_argument("--version", action="version", version=f"multihead {importlib.metadata.version('multihead')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_commands(sub)
    return parser


def _command(sub: Any, name: str, tensorflow: bool, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand with `--verbose`; `tensorflow`: it needs TensorFlow, imported quietly
    before it runs (the parser itself imports none)."""
    command = sub.add_parser(name, **kwargs)
    command.add_argument("--verbose", action="store_true",
                         help="show TensorFlow's start-up and C++ log lines (CUDA probing, absl)")
    command.set_defaults(tensorflow=tensorflow)
    return command


def user_modules(p: argparse.ArgumentParser) -> None:
    """`--import MODULE`: a user module imported before the config is read."""
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="import MODULE (from the working directory or the Python path) before the "
                        "config is read, so the Keras classes and aggregation methods it registers "
                        "resolve by name (repeatable; passed on to a sweep's trials)")


def import_user_modules(modules: Sequence[str]) -> None:
    """Imports each `--import` module, in order; a failure is one line (exit 2)."""
    import importlib

    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the console script's path lacks it; python -m has it
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - the user's module: any failure is its own line
            line = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise UsageError(f"--import {module}: {type(err).__name__}: {line}") from None


def _add_commands(sub: Any) -> None:
    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", help="experiment YAML file, e.g. experiments/quickstart.yaml")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config value, e.g. --set train.steps=500 (repeatable; "
                            "the value is YAML 1.2)")
        allow_import(p)

    def allow_import(p: argparse.ArgumentParser) -> None:
        p.add_argument("--allow-import", action="append", metavar="MODULE",
                       help="let env.id 'MODULE:Env' or data.function 'MODULE:function' "
                            "(data.kind: python) import MODULE (repeatable)")
        user_modules(p)

    train = _command(sub, "train", True, help="train from an experiment config and write a run directory")
    with_config(train)
    train.add_argument("--run-dir", help="where to write the run (default runs/<config>-<time>)")
    train.add_argument("--quiet", action="store_true", help="no progress output")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue RUN_DIR from its latest checkpoint (exactly, as if never stopped)")
    train.add_argument("--only-head", metavar="HEAD[,HEAD...]",
                       help="train HEAD alone (same trunk, data and optimizer): a single-task "
                            "baseline; several heads: that group alone")
    # A sweep's trials: CONFIG lies in DIR, read through multihead._boundary (no symlink, no FIFO).
    train.add_argument("--config-inside", metavar="DIR", help=argparse.SUPPRESS)
    train.set_defaults(func=cmd_train)

    export = _command(sub, "export", True, help="write a run's model as a SavedModel, a signature per head")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `multihead train`")
    export.add_argument("out", metavar="OUT", help="the SavedModel directory to write (new or empty)")
    export.add_argument("--heads", "--head", metavar="A,B", help="heads to export (default: all)")
    export.add_argument("--best", action="store_true",
                        help="export the best checkpoint: with --head H, the model at H's own best "
                             "evaluation (RUN_DIR/best/H, callbacks.best_checkpoint.per_head)")
    allow_import(export)
    export.set_defaults(func=cmd_export)

    predict = _command(sub, "predict", True, help="a finished run's outputs on new data, as .npz or .csv")
    predict.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `multihead train`")
    predict.add_argument("--data", required=True, metavar="FILE",
                         help=".npz (input arrays by name, x by default), or .csv / .tfrecord laid "
                              "out as the run's data (its data.features)")
    predict.add_argument("--out", required=True, metavar="FILE",
                         help="where to write the outputs: .npz (an array per head) or .csv "
                              "(columns by head: y1, or y1_0, y1_1, ... for several outputs)")
    predict.add_argument("--heads", metavar="A,B", help="heads to predict (default: all)")
    predict.add_argument("--checkpoint", metavar="NAME",
                         help="final (default), latest, best, ckpt-<step> or a checkpoint path")
    predict.add_argument("--batch-size", type=int, default=1024, help="examples per call")
    allow_import(predict)
    predict.set_defaults(func=cmd_predict)

    # validate imports TensorFlow with --build only (a config rule may import it on the way)
    validate = _command(sub, "validate", False, help="check a config's rules; with --build, also "
                                                     "its data, model and a first step")
    with_config(validate)
    validate.add_argument("--only-head", metavar="HEAD[,HEAD...]",
                          help="check the run train --only-head HEAD would train")
    validate.add_argument("--build", action="store_true",
                          help="also read the data, build the model and the objectives and run one "
                               "forward and backward pass, as train does before its first step")
    validate.set_defaults(func=cmd_validate)

    _add_sweep_parser(sub)
    _add_compare_parser(sub)

    # report reads event files in Python with TensorBoard's protos: no TensorFlow
    rep = _command(sub, "report", False, help="per-head losses, gradient norms and conflicts of a run")
    rep.add_argument("run_dir", help="a run directory (with train/ event files)")
    rep.add_argument("--json", action="store_true", help="print JSON instead of tables")
    rep.add_argument("--png", metavar="FILE", help="also draw loss, gradient-norm and conflict plots")
    rep.add_argument("--groups", type=int, metavar="N",
                     help="split the heads into at most N groups with the largest total "
                          "inter-task affinity (needs log.affinity_every; docs/affinity.md)")
    rep.add_argument("--groups-config", metavar="FILE",
                     help="with --groups: write the run's config with a sweep of one run per "
                          "group (multihead sweep FILE)")
    rep.set_defaults(func=cmd_report)


def _add_sweep_parser(sub: Any) -> None:
    """`multihead sweep`: its options; the command lives in multihead/cli/sweep.py."""
    # the sweep process writes the HParams experiment summary with TensorFlow's writer
    sweep = _command(sub, "sweep", True, help="many runs from one config: a grid, random draws or an "
                                         "Optuna search, in parallel, resumable")
    sweep.add_argument("config", nargs="?", help="experiment YAML file (may hold a sweep: section)")
    sweep.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config value for every trial (repeatable)")
    sweep.add_argument("--allow-import", action="append", metavar="MODULE",
                       help="let the trials' env.id 'MODULE:Env' or data.function "
                            "'MODULE:function' import MODULE (repeatable; give it again with "
                            "--resume)")
    user_modules(sweep)
    sweep.add_argument("--grid", action="append", metavar="KEY=V1,V2",
                       help="an axis: one trial per value, product with the other axes (repeatable)")
    sweep.add_argument("--sample", action="append", metavar="KEY=KIND:...",
                       help="a random axis: loguniform:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or "
                            "choice:A,B (repeatable; --trials draws, or Optuna's search space)")
    sweep.add_argument("--simplex", type=int, metavar="N",
                       help="loss-weight preferences on the simplex over the heads, N per edge "
                            "(model.heads.<head>.weight, a zip axis: N trials for two heads)")
    sweep.add_argument("--only-head", metavar="HEAD[,HEAD...]",
                       help="every trial trains HEAD alone, as train --only-head: single-task "
                            "baselines over seeds (e.g. --grid seed=0,1,2)")
    sweep.add_argument("--trials", type=int, metavar="N", help="random draws / Optuna trials (default 10)")
    sweep.add_argument("--search", choices=("grid", "optuna"), default="grid",
                       help="grid: the axes' trials; optuna: an Optuna search over --sample axes")
    sweep.add_argument("--search-seed", type=int, default=0, help="seed of the random draws / Optuna sampler")
    sweep.add_argument("--objective", default=MEAN_LOSS,
                       help=f"{FORMS} (best so far, Optuna's value)")
    sweep.add_argument("--direction", default="minimize", help="minimize or maximize the objective")
    sweep.add_argument("--sweep-dir", help="where to write the sweep (default runs/sweep-<config>-<time>)")
    sweep.add_argument("--resume", metavar="SWEEP_DIR",
                       help="run the missing and failed trials of SWEEP_DIR; interrupted ones "
                            "continue from their checkpoints")
    sweep.add_argument("--jobs", type=int, default=1, help="trials run at once (processes)")
    sweep.add_argument("--threads", default="auto",
                       help="TensorFlow threads per trial: auto (max(1, cores // jobs)), none "
                            "(TensorFlow's default) or a count")
    sweep.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local processes, or Ray tasks (pip install 'multihead[ray]')")
    sweep.add_argument("--ray-address", help="an existing Ray cluster (ray.init(address=...)); "
                                             "default: a local Ray instance")
    sweep.add_argument("--ray-cpus", type=int, help="CPUs of the local Ray instance (default: all)")
    sweep.add_argument("--quiet", action="store_true", help="no progress lines")

    def run(args: argparse.Namespace) -> int:
        from multihead.cli.sweep import cmd_sweep

        return cmd_sweep(args)

    sweep.set_defaults(func=run)


def _add_compare_parser(sub: Any) -> None:
    """`multihead compare`: runs and sweeps side by side, Δm% against single-task baselines."""
    compare = _command(sub, "compare", False, help="per-head metrics of runs and sweeps, mean ± std over "
                                             "seeds, Δm%% against single-task baselines")
    compare.add_argument("paths", nargs="+", metavar="RUN_OR_SWEEP", help="run or sweep directories")
    compare.add_argument("--baseline", nargs="+", default=[], metavar="RUN",
                         help="single-task runs (train --only-head) or sweeps of them")
    compare.add_argument("--json", action="store_true", help="print JSON instead of tables")
    compare.add_argument("--png", metavar="FILE", help="also draw each head's eval curves per group "
                                                       "(with --pareto: the front)")
    compare.add_argument("--pareto", action="store_true",
                         help="mark the groups on the Pareto front of the heads' metrics (--metrics, "
                              "default each head's loss) and give its hypervolume")
    compare.add_argument("--metrics", metavar="M1,M2",
                         help="the metrics Δm%% is computed over, e.g. loss or accuracy,mae "
                              "(default: every metric the runs and baselines report, losses included)")

    def run(args: argparse.Namespace) -> int:
        from multihead.experiments.results.compare import (
            CompareError, compare as compare_runs, plot_comparison)

        if args.png and not os.path.isdir(os.path.dirname(os.path.abspath(args.png))):
            raise UsageError(f"--png {args.png!r}: directory {os.path.dirname(os.path.abspath(args.png))!r} "
                             "does not exist")
        chosen = None
        if args.metrics is not None:
            chosen = [m.strip() for m in args.metrics.split(",") if m.strip()]
            if not args.baseline and not args.pareto:
                raise UsageError("--metrics needs --baseline: it chooses what Δm% against the "
                                 "baselines is computed over")
        try:
            result = compare_runs(args.paths, baseline=args.baseline, metrics=chosen, pareto=args.pareto)
        except CompareError as err:
            if args.metrics is None or not str(err).startswith("metrics"):
                raise
            raise UsageError(f"--{err}") from None
        if args.png:
            try:
                plot_comparison(result, args.png, pareto=args.pareto)
            except ImportError:
                raise UsageError("--png needs matplotlib: pip install 'multihead[plot]'") from None
        print(json.dumps(result.to_dict(), indent=2) if args.json else result.format())
        if args.png and not args.json:
            print(f"wrote {args.png}")
        return 0

    compare.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet.configure(args.verbose)
    try:
        if args.tensorflow or getattr(args, "build", False):
            quiet.import_tensorflow(args.verbose)
        with quiet.tensorflow_lines_dropped(args.verbose):  # a user module may import it
            import_user_modules(getattr(args, "imports", None) or ())
        return args.func(args)
    except (ConfigError, UsageError, RunInputError) as err:
        print(f"multihead: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


def run() -> None:
    """The `multihead` console command: `main()`, then the process ends with its exit code;
    a process that joined a multi-worker cluster ends at once, after its exit handlers
    (`multihead._keras_internals.end_cluster_process`). Everything a run writes is closed
    before `main` returns."""
    code = main()
    if "tensorflow" in sys.modules:
        from multihead._keras_internals import end_cluster_process

        end_cluster_process(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
