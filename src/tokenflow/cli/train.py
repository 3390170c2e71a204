"""`tokenflow train [CONFIG.toml] [--section.key value ...]`."""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a model with asynchronous RL",
        description="Train with asynchronous RL. With no CONFIG, trains the shipped tiny model on "
                    "the arithmetic task on the CPU. Any key can be overridden as --section.key VALUE.")
    p.add_argument("config", nargs="?", help="TOML config file (default: the embedded arithmetic run)")
    p.add_argument("--output-dir", help="run folder (default runs/<run.name>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.add_argument("--help-config", action="store_true", help="list every config key with its documentation")
    p.set_defaults(func=run, _allow_overrides=True)


def _load(args, overrides):
    from pathlib import Path

    from tokenflow.config.loading import load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.launch import default_config_path

    if args.resume:
        path = Path(args.resume) / "config.toml"
        if not path.is_file():
            raise SystemExit(f"error: {args.resume} is not a run folder (no config.toml)")
    else:
        path = args.config or default_config_path()
    return load_config(TrainConfig, path, overrides)


def run(args, overrides: list[str] | None = None) -> int:
    from tokenflow.config.loading import ConfigError, describe_fields, to_toml

    overrides = overrides or []
    if args.help_config:
        from tokenflow.config.root import TrainConfig

        for key, default, doc in describe_fields(TrainConfig):
            print(f"{key} = {default}\n    {doc}")
        return 0
    try:
        cfg = _load(args, overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        sys.stdout.write(to_toml(cfg))
        return 0
    from pathlib import Path

    from tokenflow.runtime.launch import default_run_dir, train

    if args.resume:
        run_dir = Path(args.resume)
    else:
        run_dir = Path(args.output_dir) if args.output_dir else default_run_dir(cfg)
        if run_dir.exists() and any(run_dir.iterdir()):
            print(f"error: run folder {run_dir} exists; continue it with --resume {run_dir} "
                  "or choose another --output-dir / --run.name", file=sys.stderr)
            return 2
    from tokenflow.runtime.orchestrator import RunFailed
    from tokenflow.runtime.workers import WorkerDied

    try:
        summary = train(cfg, run_dir, resume=bool(args.resume))
    except (RunFailed, WorkerDied) as e:
        print(f"error: {e}\nThe last checkpoint is intact: tokenflow train --resume {run_dir}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; continue with: tokenflow train --resume {run_dir}", file=sys.stderr)
        return 130
    print(json.dumps(summary, indent=2))
    return 0
