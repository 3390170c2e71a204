"""`tokenflow bench ...`: benchmarks that print their numbers (and one JSON object with --json).

May import: layers 1-5 and ``tokenflow.cli``'s shared helpers (a front end, layer 6).
"""

from __future__ import annotations

# name -> module; each module defines register(subparsers) and does heavy imports in run().
BENCHMARKS = {
    "chaos": "tokenflow.bench.chaos",
    "engine": "tokenflow.bench.engine",
    "pipeline": "tokenflow.bench.pipeline",
    "serve": "tokenflow.bench.serve",
    "startup": "tokenflow.bench.startup",
    "sync": "tokenflow.bench.sync",
}


def register(subparsers) -> None:
    from tokenflow.cli.main import register_all

    parser = subparsers.add_parser("bench", help="benchmarks (chaos, engine, pipeline, serve, startup, sync)")
    register_all(parser.add_subparsers(dest="bench", metavar="BENCHMARK"), BENCHMARKS)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
