"""The command-line options every shipped-model builder shares (`make_default_model`,
`make_tool_model`): where to write, how long and how to warm-start, the model's shape."""

from __future__ import annotations

import argparse
from pathlib import Path


def warm_start_parser(doc: str, *, out: str, steps: int, threads: int, eval_every: int,
                      slip_help: str) -> argparse.ArgumentParser:
    """A parser with the shared options and these defaults; each builder adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(out))
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--slip", type=float, default=0.6, help=slip_help)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=eval_every)
    return ap
