"""`tokenflow` command: parse the command line first, import heavy modules after.

Every command lives in its own module exposing ``register(subparsers)`` (light: argparse only)
which sets ``func`` on its parser; ``func(args)`` does the work and returns an exit status.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> module; each module defines register(subparsers).
COMMANDS = {
    "train": "tokenflow.cli.train",
    "eval": "tokenflow.cli.eval",
    "serve": "tokenflow.cli.serve",
    "tinker": "tokenflow.cli.tinker",
    "bench": "tokenflow.bench",
    "simulate": "tokenflow.cli.simulate",
    "report": "tokenflow.cli.report",
    "engines": "tokenflow.cli.engines",
    "samples": "tokenflow.cli.samples",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenflow",
        description="Asynchronous RL post-training for language models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    register_all(parser.add_subparsers(dest="command", metavar="COMMAND"), COMMANDS)
    return parser


def register_all(subparsers, modules: dict[str, str]) -> None:
    """Let each command module add its parser (their imports are light; heavy ones wait for run)."""
    for module in modules.values():
        importlib.import_module(module).register(subparsers)


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate ``--section.key VALUE`` / ``--section.key=VALUE`` config overrides from the rest."""
    rest, overrides = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "." in arg.split("=", 1)[0]:
            overrides.append(arg)
            if "=" not in arg and i + 1 < len(argv):
                overrides.append(argv[i + 1])
                i += 1
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def main(argv: list[str] | None = None) -> int:
    from tokenflow.metrics import phases

    phases.reset()
    phases.mark("cli_main")
    _warm_for_train(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    rest, extra = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest)
    if extra and not getattr(args, "_allow_overrides", False):
        parser.error(f"this command takes no config overrides: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "_allow_overrides", False):
        rc = int(args.func(args, extra) or 0)
    else:
        rc = int(args.func(args) or 0)
    if argv is None:  # this process's own command line: it exits next
        _before_exit()
    return rc


def _warm_for_train(argv: list[str]) -> None:
    """`tokenflow train` (not --dry-run, --help-config or --help): start the fork server its
    workers come from now, before the parser is even built, so that its imports overlap all of
    this process's start-up (``tokenflow.runtime.backends.local.start``; the run stops it again if its
    config starts workers another way)."""
    if argv[:1] != ["train"] or {"--dry-run", "--help-config", "-h", "--help"} & set(argv):
        return
    from tokenflow.runtime.backends.local.start import warm

    warm("forkserver")


def _before_exit() -> None:
    """Make the interpreter's exit quick. At exit CPython runs a full garbage collection over
    every object torch and transformers created (0.3-0.9 s on the development machine) before
    tearing down the modules; frozen objects are left out of it. Everything the command wrote is
    closed by now, and atexit handlers (queues, semaphores) still run."""
    import gc

    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
