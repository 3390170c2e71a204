"""`tokenflow bench ...`: benchmarks that print their numbers (and one JSON object with --json)."""

from __future__ import annotations

import importlib

# name -> module; each module defines register(subparsers) and does heavy imports in run().
BENCHMARKS = {
    "engine": "tokenflow.bench.engine",
    "pipeline": "tokenflow.bench.pipeline",
    "sync": "tokenflow.bench.sync",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (engine, pipeline, sync)")
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    for name, module in BENCHMARKS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        mod.register(sub)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
