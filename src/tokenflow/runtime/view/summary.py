"""The end-of-run summary as a person reads it: a small table, the run folder, the next commands.

``summary.json`` (and ``tokenflow train --json``) keep the machine-readable form; this view only
formats that same dict.
"""

from __future__ import annotations

from pathlib import Path


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def older_than(histogram: dict, k: int) -> float:
    """Share of the consumed tokens in ``histogram`` (age → count) more than ``k`` versions old."""
    counts = {int(a): int(c) for a, c in (histogram or {}).items()}
    total = sum(counts.values())
    return sum(c for a, c in counts.items() if a > k) / total if total else 0.0


def _age(histogram: dict, k: int | None = None) -> str:
    """Mean and max token age; with the staleness budget ``k``, the share trained older than it
    (``max_staleness`` bounds admission, not age: a straggler overtaken by younger groups waits)."""
    counts = {int(a): int(c) for a, c in (histogram or {}).items()}
    total = sum(counts.values())
    if not total:
        return "–"
    mean = sum(a * c for a, c in counts.items()) / total
    text = f"mean {mean:.2f}, max {max(counts)} versions behind"
    if k is not None and max(counts) > k:
        text += (f"; {older_than(counts, k):.1%} older than max_staleness {k} (an admission bound; "
                 "algorithm.max_token_age drops them, rollout.batch_order = \"admission\" waits for them)")
    return text


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """(label, value) rows of the table; also used by tests."""
    base, final = summary.get("baseline_accuracy"), summary.get("final_accuracy")
    if final is None:
        acc = "–"
    elif base is None:
        acc = f"{final:.3f}  (the starting model not evaluated: run.baseline_eval = false)"
    else:
        acc = f"{base:.3f} → {final:.3f}  ({final - base:+.3f})"
    mode = summary.get("mode", "async")
    how = "synchronous" if mode == "sync" else f"async, admission bound max_staleness {summary.get('max_staleness')}"
    train_wall = summary.get("train_wall_s") or 0.0
    wall = summary.get("wall_s") or 0.0
    tokens = summary.get("tokens_generated") or 0
    # tokens_generated counts the evaluations' tokens too, so the rate is over the whole wall time.
    rate = f", {tokens / wall:,.0f} tok/s over the wall time" if wall > 0 else ""
    rows = [
        ("held-out accuracy", acc),
        ("steps", f"{summary.get('steps')} ({how}, {summary.get('update_mode')} weight updates)"),
        ("wall time", f"{summary.get('wall_s', 0):.1f} s  (training window {train_wall:.1f} s)"),
        ("idle", f"trainer {_pct(summary.get('trainer_idle_frac'))}, engine {_pct(summary.get('engine_idle_frac'))}"),
        ("token age", _age(summary.get("token_age_histogram"), summary.get("max_staleness"))),
        ("throughput", f"{tokens:,.0f} tokens generated{rate}"),
    ]
    if summary.get("last_reward_mean") is not None:
        rows.append(("last reward", f"{summary['last_reward_mean']:.3f} (mean of the last batch)"))
    peaks = summary.get("peak_rss_gb") or {}
    if peaks:  # each worker's peak resident memory, sampled through the run (memory_watch)
        rows.append(("peak memory", ", ".join(f"{w} {gb:.2f} GB" for w, gb in sorted(peaks.items()))
                     + " resident"))
    engines = summary.get("engines") or {}
    if engines.get("added") or engines.get("removed"):  # engines joined or left (Ray, runtime.elastic)
        rows.append(("engines", f"added {', '.join(engines['added']) or 'none'}, removed "
                                f"{', '.join(engines['removed']) or 'none'} ({engines['readmitted_groups']} groups "
                                f"re-sent); at the end {', '.join(engines['final'])}"))
    return rows


def next_commands(run_dir: str) -> list[str]:
    cmds = [f"tokenflow report {run_dir}"]
    if (Path(run_dir) / "tensorboard").is_dir():
        cmds.append(f"tensorboard --logdir {run_dir}/tensorboard")
    cmds.append(f"tokenflow eval {run_dir}")
    return cmds


def print_summary(summary: dict, console=None) -> None:
    """Print the table to ``console`` (default: a rich console on stdout)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    run_dir = summary.get("run_dir", "")
    table = Table(title=f"tokenflow run {run_dir}", box=box.SIMPLE, show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for label, value in summary_rows(summary):
        table.add_row(label, value)
    table.add_row("run folder", f"{run_dir}  (summary.json, metrics.jsonl, checkpoints/)")
    for i, cmd in enumerate(next_commands(run_dir)):
        table.add_row("look further" if i == 0 else "", f"[cyan]{cmd}[/]")
    console.print(table)
