"""``tokenflow simulate``: capacity planning for an async RL cluster by discrete-event simulation.

    tokenflow simulate [CONFIG.toml] [--preset NAME] [--section.key VALUE ...]
                       [--sweep "section.key=v1,v2,..." [--sweep ...]] [--json] [--out DIR]
    tokenflow simulate --calibrate RUN_DIR [--json]
    tokenflow simulate --list-presets

Dotted overrides take any key of the simulator's sections ([hardware], [workload],
[pipeline], [sim]) or of the training sections it reads ([rollout], [algorithm], [sampling],
[engine], [sync]). simpy, numpy and matplotlib are imported inside ``run``.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate an async RL cluster: idle time, throughput, staleness; sweep and calibrate",
        description="Discrete-event simulation of the tokenflow pipeline (engines, buffer, trainer, "
                    "weight sync). Dotted overrides: --hardware.inference_gpus 8, "
                    "--rollout.max_staleness 2, ...",
    )
    p.add_argument("config", nargs="?", metavar="CONFIG.toml",
                   help="training or simulator TOML ([hardware], [workload], [pipeline], [sim], "
                        "plus the training sections [rollout], [algorithm], [sampling], [engine], [sync])")
    p.add_argument("--preset", help="hardware preset the TOML and overrides sit on (see --list-presets)")
    p.add_argument("--sweep", action="append", default=None, metavar="KEY=V1,V2,...",
                   help="sweep a key over values; give once or twice (a grid)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--out", default="sim-out", metavar="DIR", help="folder for the sweep figure")
    p.add_argument("--calibrate", metavar="RUN_DIR",
                   help="fit rates on a run folder (calibration.json) or a bench pipeline folder "
                        "(sync/ and async/), then predict both runs' wall times")
    p.add_argument("--seeds", type=int, default=5, help="simulations averaged per calibrated prediction")
    p.add_argument("--list-presets", action="store_true", help="list presets and exit")
    p.set_defaults(func=run, _allow_overrides=True)


def run(args: argparse.Namespace, overrides: list[str] | None = None) -> int:
    """Dotted ``overrides`` arrive split off the command line by ``tokenflow.cli.main``."""
    from rich.console import Console
    from rich.markup import escape

    from tokenflow.config.loading import parse_overrides
    from tokenflow.sim.loading import build_layers, load_layers
    from tokenflow.sim.presets import PRESET_HELP

    console = Console()
    if not console.is_terminal:  # piped output: do not squeeze tables into 80 columns
        console = Console(width=120)
    if args.list_presets:
        for name, text in PRESET_HELP.items():
            console.print(f"[bold]{name}[/bold]  {text}")
        return 0
    try:
        if args.calibrate:
            return _calibrate(args, console)
        layers = build_layers(args.config, args.preset, parse_overrides(overrides or []))
        cfg = load_layers(layers)
        specs = args.sweep if args.sweep is not None else cfg.sim.sweep
        if specs:
            return _sweep(args, layers, specs, cfg.sim.objective, console)
        return _single(args, cfg, console)
    except (ValueError, FileNotFoundError) as e:  # ConfigError is a ValueError
        console.print("[red]error:[/red]", escape(str(e)), highlight=False)
        return 2


def _single(args, cfg, console) -> int:
    from tokenflow.sim.pipeline import simulate
    from tokenflow.sim.report import print_tables, result_tables

    result = simulate(cfg)
    if args.json:
        json.dump(result.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print_tables(result_tables(result), console)
    return 0


def _sweep(args, layers, specs, objective, console) -> int:
    from tokenflow.sim.report import best_line, print_tables, sweep_figure, sweep_table
    from tokenflow.sim.sweep import run_sweep

    sw = run_sweep(layers, specs, objective)
    figure = sweep_figure(sw, args.out)
    if args.json:
        json.dump({**sw.to_dict(), "figure": str(figure)}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_tables([sweep_table(sw)], console)
        console.print(best_line(sw), highlight=False, markup=False)
        console.print(f"figure: {figure}", highlight=False, markup=False)
    return 0 if sw.best is not None else 1


def _calibrate(args, console) -> int:
    from tokenflow.sim.calibration.calibrate import calibrate
    from tokenflow.sim.report import calibration_table, print_tables

    rep = calibrate(args.calibrate, seeds=args.seeds)
    if args.json:
        json.dump(rep.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print_tables([calibration_table(rep)], console)
    return 0
