"""`tokenflow samples RUN_DIR [--step N] [--worst | --best] [--limit K]`: read what the model
wrote, from the run's ``samples.jsonl`` (`tokenflow.runtime.run.samples`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "samples", help="print the decoded samples a run wrote (prompt, completion, reward)",
        description="Print the samples a run wrote to samples.jsonl: a few of each training step "
                    "(run.samples_per_step) and every held-out one of each evaluation, with the "
                    "reward and its components, the policy versions and the token age. Without "
                    "--worst/--best the most recent come last.")
    p.add_argument("run", metavar="RUN_DIR", help="a run folder")
    p.add_argument("--step", type=int, default=None, metavar="N", help="only the samples of step N")
    p.add_argument("--kind", choices=("train", "eval"), default=None,
                   help="only training samples or only held-out ones")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--worst", action="store_true", help="lowest reward first (failed samples first of all)")
    order.add_argument("--best", action="store_true", help="highest reward first")
    p.add_argument("--limit", type=int, default=10, metavar="K", help="print at most K samples (default 10)")
    p.set_defaults(func=run)


def read_samples(path: Path) -> list[dict]:
    """The rows of a samples file; a line cut short by a kill mid-write is skipped."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def select(rows: list[dict], *, step: int | None = None, kind: str | None = None, worst: bool = False,
           best: bool = False, limit: int = 10) -> list[dict]:
    """The rows to show: filtered by step and kind; the worst or best ``limit`` by reward, or the
    last ``limit`` in the order they were written."""
    rows = [r for r in rows if (step is None or r.get("step") == step) and (kind is None or r.get("kind") == kind)]
    if worst or best:
        def reward(r: dict) -> float:
            value = r.get("reward")
            return float("-inf") if r.get("failed") or value is None else float(value)

        return sorted(rows, key=reward, reverse=best)[:max(limit, 0)]
    return rows[-limit:] if limit > 0 else []


def _title(r: dict) -> str:
    reward = "failed" if r.get("failed") or r.get("reward") is None else f"reward {r['reward']:.3g}"
    parts = [f"step {r.get('step')}", str(r.get("kind")), f"prompt {r.get('prompt_id')}",
             f"sample {r.get('sample_index')}", reward]
    parts += [f"{k} {v:.3g}" for k, v in sorted((r.get("components") or {}).items()) if isinstance(v, (int, float))]
    versions = r.get("versions") or []
    parts.append("version " + ",".join(str(v) for v in versions))
    if r.get("kind") == "train":
        parts.append(f"age {r.get('token_age_mean', 0):.2g} (max {r.get('token_age_max', 0)})")
    parts.append(f"{r.get('tokens')} tokens, {r.get('finish_reason')}")
    return " · ".join(parts)


def show(rows: list[dict], console) -> None:
    from rich.panel import Panel
    from rich.text import Text

    for r in rows:
        body = Text()
        body.append("prompt  ", style="bold cyan")
        body.append(str(r.get("prompt", "")))
        body.append("\ncompletion  ", style="bold green")
        body.append(str(r.get("completion", "")))
        if r.get("error"):
            body.append("\nerror  ", style="bold red")
            body.append(str(r["error"]))
        # Text objects, not markup: a model's "[/bold]" is printed, not interpreted. The header
        # is a line of its own (a panel's title would be cut to the terminal's width).
        console.print(Text(_title(r), style="bold"))
        console.print(Panel(body, expand=True))


def run(args) -> int:
    path = Path(args.run) / "samples.jsonl"
    if not path.is_file():
        print(f"error: {args.run} holds no samples.jsonl (is it a run folder, written by a tokenflow "
              "that writes samples?)", file=sys.stderr)
        return 2
    rows = select(read_samples(path), step=args.step, kind=args.kind, worst=args.worst, best=args.best,
                  limit=args.limit)
    if not rows:
        print("no samples match", file=sys.stderr)
        return 1
    from rich.console import Console

    show(rows, Console(soft_wrap=False, highlight=False))
    return 0
