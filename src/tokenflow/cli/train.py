"""`tokenflow train [CONFIG.toml] [--section.key value ...]`."""

from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a model with asynchronous RL",
        description="Train with asynchronous RL. With no CONFIG, runs the preset \"tiny-cpu\": the "
                    "shipped tiny model on the arithmetic task on the CPU. A CONFIG starts from the "
                    "library's defaults unless it names a preset (preset = \"tiny-cpu\" at its top, or "
                    "--preset). Any key can be overridden as --section.key VALUE.")
    p.add_argument("config", nargs="?", help="TOML config file (default: the preset tiny-cpu)")
    p.add_argument("--preset", help="start from this preset (wins over the file's own `preset = ...`)")
    p.add_argument("--output-dir", help="run folder (default runs/<run.name>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument("--trust-run-config", action="store_true",
                   help="with --resume: run the code the run folder's config names (task.reward, task.env, "
                        "task.agent, scorer.token files or modules; trust_remote_code = true); without it such "
                        "a config is refused, since a run folder is data that may come from anywhere")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config, then the memory estimate (as comments), and exit")
    p.add_argument("--help-config", action="store_true",
                   help="list every config key with the value it resolves to (for this CONFIG, preset and "
                        "overrides), the library default where different, and its documentation (the section [KEY] is "
                        "defined in tokenflow/config/KEY.py; run, model, metrics: run.py; task, episode: "
                        "task.py; rollout, sampling: rollout.py)")
    p.add_argument("--json", action="store_true", help="print only the summary, as JSON, on stdout")
    p.set_defaults(func=run, _allow_overrides=True)


def _load(args, overrides):
    from pathlib import Path

    from tokenflow.config.loading import load_config
    from tokenflow.config.presets import DEFAULT_PRESET
    from tokenflow.config.root import TrainConfig

    if args.resume:
        path = Path(args.resume) / "config.toml"
        if not path.is_file():
            from tokenflow.config.loading import ConfigError

            raise ConfigError(f"{args.resume} is not a run folder (no config.toml); give --resume the folder of a run")
        from tokenflow.runtime.run.folder_code import refuse_folder_code
        from tokenflow.runtime.run.folder_guard import claim_for_resume

        claim_for_resume(args.resume, mark=False)  # a run folder, no links in it: before its config is read
        cfg = load_config(TrainConfig, path, overrides)  # fully resolved already: no preset
        refuse_folder_code(cfg, overrides, path, args.trust_run_config)
        return cfg
    preset = args.preset or (None if args.config else DEFAULT_PRESET)
    return load_config(TrainConfig, args.config, overrides, preset=preset)


def help_config(cfg) -> str:
    """Every key: ``key = resolved value`` (and the library default where it differs), then its doc."""
    from tokenflow.config.loading import describe_fields

    lines = []
    for key, value, default, doc in describe_fields(type(cfg), resolved=cfg):
        note = "" if value == default else f"    # library default: {default}"
        body = "\n".join(f"    {line.strip()}" for line in doc.splitlines())
        lines.append(f"{key} = {value}{note}\n{body}" if body else f"{key} = {value}{note}")
    return "\n".join(lines) + "\n"


def _input_errors() -> tuple[type[Exception], ...]:
    """Exceptions that mean bad input (exit 2, one line), as opposed to a run that failed (exit 1)."""
    from tokenflow.config.loading import ConfigError
    from tokenflow.errors import CheckpointError, InputError
    from tokenflow.runtime.run.resources import RunInUse
    from tokenflow.tasks.dataset import DatasetError
    from tokenflow.tasks.reward_loading import RewardFunctionError

    return ConfigError, InputError, DatasetError, RewardFunctionError, RunInUse, CheckpointError


def _memory_lines(cfg) -> list[str]:
    """The memory estimate, as TOML comments (the output stays a loadable config)."""
    from tokenflow.model_store import resolve_model_path
    from tokenflow.model_store.catalog import BUILT_MODELS, built_model_path, is_built
    from tokenflow.runtime.run.memory_budget import dry_run_lines

    name = cfg.model.path
    if name in BUILT_MODELS and not is_built(name):  # a dry run builds nothing
        return [f"# memory estimate: unavailable ({name} is not built yet)"]
    try:
        folder = str(built_model_path(name)) if name in BUILT_MODELS else resolve_model_path(name)
        return dry_run_lines(cfg, folder)
    except Exception as e:  # noqa: BLE001 - a model not built yet, a folder without config.json
        return [f"# memory estimate: unavailable ({type(e).__name__}: {_one_line(e)})"]


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _resume_command(run_dir, cfg=None) -> str:
    """``tokenflow train --resume DIR``, with ``--trust-run-config`` when this run's own config
    names code (a reward file, ...): the folder is the user's, made by this very command."""
    from tokenflow.runtime.run.folder_code import code_keys

    trust = " --trust-run-config" if cfg is not None and code_keys(cfg, set()) else ""
    return f"tokenflow train --resume {run_dir}{trust}"


def _resume_advice(run_dir, cfg=None) -> str:
    """What to do after a failed run: a command that works from where the folder stands."""
    from tokenflow.runtime.run.run_dir import RunDir

    cps = RunDir(run_dir).complete_checkpoints()
    if cps:
        return f"The last checkpoint ({cps[-1].name}) is intact; continue with: {_resume_command(run_dir, cfg)}"
    return (f"No checkpoint was written yet; start the run again with: {_resume_command(run_dir, cfg)} "
            "(it starts from step 0 with the same config)")


def _reusable(run_dir) -> bool:
    """A folder a run started in and died before its first checkpoint: nothing in it to keep.
    `RunFolderError` for a non-empty folder that is no run folder (tokenflow never cleans one)."""
    from tokenflow.runtime.run.folder_guard import claim_for_new_run
    from tokenflow.runtime.run.run_dir import RunDir

    claim_for_new_run(run_dir)
    rd = RunDir(run_dir)
    return rd.config.is_file() and not rd.summary.exists() and not rd.complete_checkpoints()


def run(args, overrides: list[str] | None = None) -> int:
    from tokenflow.config.loading import to_toml

    if not (args.dry_run or args.help_config):
        # Start the fork server the local backend's workers come from (runtime.worker_start) before
        # reading the config, so that its imports overlap that as well as the preflight (a no-op
        # when `tokenflow` started it already). The run stops it if its config starts workers
        # another way.
        from tokenflow.runtime.backends.local.start import warm

        warm("forkserver")
    overrides = overrides or []
    input_errors = _input_errors()
    try:
        cfg = _load(args, overrides)
    except input_errors as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    from tokenflow.metrics import phases

    phases.mark("config_loaded")
    if args.help_config:
        sys.stdout.write(help_config(cfg))
        return 0
    if args.dry_run:
        from tokenflow.runtime.run.preflight import precision_warnings

        sys.stdout.write(to_toml(cfg))
        sys.stdout.write("\n".join(_memory_lines(cfg)) + "\n")
        sys.stdout.writelines(f"# warning: {w}\n" for w in precision_warnings(cfg))
        return 0
    from pathlib import Path

    from tokenflow.runtime.launch import RunFinished, default_run_dir, train

    if args.resume:
        run_dir = Path(args.resume)
    else:
        run_dir = Path(args.output_dir) if args.output_dir else default_run_dir(cfg)
        try:
            reusable = _reusable(run_dir)
        except input_errors as e:
            print(f"error: {_one_line(e)}", file=sys.stderr)
            return 2
        if run_dir.exists() and any(run_dir.iterdir()) and not reusable:
            print(f"error: run folder {run_dir} exists; continue it with --resume {run_dir} "
                  "or choose another --output-dir / --run.name", file=sys.stderr)
            return 2
    from tokenflow.runtime.orchestrator.orchestrator import RunFailed
    from tokenflow.errors import WorkerDied

    try:
        summary = train(cfg, run_dir, resume=bool(args.resume))
    except RunFinished as e:
        print(str(e), file=sys.stderr)
        return 0
    except input_errors as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except (RunFailed, WorkerDied) as e:
        print(f"error: {e}\n{_resume_advice(run_dir, cfg)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; continue with: {_resume_command(run_dir, cfg)}", file=sys.stderr)
        return 130
    if args.json:
        from tokenflow.metrics.sinks import dumps_strict

        sys.stdout.write(dumps_strict(summary, indent=2) + "\n")
    else:
        from tokenflow.runtime.view.summary import print_summary

        print_summary(summary)
    return 0
