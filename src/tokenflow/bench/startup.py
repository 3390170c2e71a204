"""`tokenflow bench startup`: where a run's wall time goes outside its training window.

Runs ``tokenflow train`` (the embedded default run unless a config or overrides say otherwise)
as a child process, times that process from outside (start to exit), and lays out the phases
the run recorded (``summary.json`` → ``phases``, see ``tokenflow.metrics.phases``):

    before the window   interpreter and command start, config, preflight, run folder and
                        worker processes, until the engines are loaded and training starts
    training window     ``train_wall_s``: training generation begins → the last optimizer step
                        (what the summary calls the training window; the trainer's start-up and
                        the starting model's evaluation overlap its beginning)
    after the window    the final weights reaching the engines, the final evaluation (the final
                        checkpoint is written meanwhile), shutting the workers down, exit

    overhead = process wall time − training window

Each run is a fresh process in a fresh folder (removed afterwards unless ``--keep``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (label, start mark, end mark) of each phase; a mark of None is the process's start or end.
PHASES = (
    ("interpreter + command start", None, "cli_main"),
    ("config", "cli_main", "config_loaded"),
    ("preflight (input checks)", "preflight_start", "preflight_end"),
    ("run folder, workers started", "preflight_end", "workers_spawned"),
    ("scorer, logger; engines load → window", "workers_spawned", "window_start"),
    ("training window", "window_start", "window_end"),
    ("final weights loaded", "window_end", "final_weights_loaded"),
    ("final evaluation", "final_weights_loaded", "final_eval_end"),
    ("final checkpoint (rest of it)", "final_eval_end", "final_checkpoint_end"),
    ("shutdown (workers, scorer, logger)", "final_checkpoint_end", "shutdown_end"),
    ("exit", "shutdown_end", None),
)
# Marks inside the window, as offsets from its start (they overlap training).
INSIDE = (("trainer ready", "trainer_ready"), ("starting model evaluated", "baseline_eval_end"),
          ("step 1 sent to the trainer", "step1_dispatched"))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "startup", help="process wall time vs training window of `tokenflow train`, phase by phase",
        description="Run `tokenflow train` (default: the embedded run) in a child process and print "
                    "its wall time, its training window, the overhead (wall − window) and each phase "
                    "of start-up and shutdown. Config overrides (--section.key VALUE) pass through.")
    p.add_argument("config", nargs="?", help="TOML config (default: the embedded run)")
    p.add_argument("--runs", type=int, default=1, help="runs, one after another (the medians are printed too)")
    p.add_argument("--output-dir", help="where the run folders go (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the run folders")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, _allow_overrides=True)


def measure(args: list[str], run_dir: Path, log_path: Path, env: dict | None = None) -> dict:
    """One `tokenflow train ARGS --output-dir RUN_DIR` in a child process: its phases (seconds)."""
    cmd = [sys.executable, "-m", "tokenflow.cli.main", "train", *args, "--output-dir", str(run_dir), "--json"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with open(log_path, "w") as log:
        t0 = time.time()
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        t1 = time.time()
    if rc != 0:
        raise RuntimeError(f"tokenflow train exited {rc}; its output is in {log_path}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return breakdown(summary, t0, t1, load)


def breakdown(summary: dict, t0: float, t1: float, load: float | None = None) -> dict:
    """Phases of one run from its summary and the process's start and end (epoch seconds)."""
    phases = summary.get("phases") or {}
    marks = dict(phases.get("marks") or {})
    start = phases.get("process_start") or t0
    at = {None: None, **{k: start + v for k, v in marks.items()}}
    wall = t1 - t0
    window = float(summary["train_wall_s"])
    rows = {}
    for label, a, b in PHASES:
        ta = t0 if a is None else at.get(a)
        tb = t1 if b is None else at.get(b)
        if ta is not None and tb is not None:
            rows[label] = tb - ta
    out = {"wall_s": wall, "window_s": window, "overhead_s": wall - window,
           "orchestrator_wall_s": summary.get("wall_s"), "load_1min": load, "phases_s": rows}
    if "window_start" in marks and "window_end" in marks:
        out["before_window_s"] = at["window_start"] - t0
        out["after_window_s"] = t1 - at["window_end"]
        out["inside_window_s"] = {label: at[m] - at["window_start"] for label, m in INSIDE if m in marks}
    if "tokenizer/started" in marks:  # the preflight's tokenizer child is the fork server's first
        out["fork_server_ready_s"] = at["tokenizer/started"] - t0
    out["accuracy"] = (summary.get("baseline_accuracy"), summary.get("final_accuracy"))
    return out


def _median(results: list[dict]) -> dict:
    keys = ("wall_s", "window_s", "overhead_s", "before_window_s", "after_window_s", "fork_server_ready_s")
    med = {k: statistics.median(r[k] for r in results if k in r) for k in keys if any(k in r for r in results)}
    labels = [label for label, _, _ in PHASES]
    med["phases_s"] = {label: statistics.median(r["phases_s"][label] for r in results if label in r["phases_s"])
                       for label in labels if any(label in r["phases_s"] for r in results)}
    return med


def _print(result: dict, title: str) -> None:
    load = result.get("load_1min")
    print(f"{title}{f'  (load average {load:.2f})' if load is not None else ''}")
    print(f"  process wall      {result['wall_s']:7.2f} s")
    print(f"  training window   {result['window_s']:7.2f} s")
    print(f"  overhead          {result['overhead_s']:7.2f} s   (wall − window)")
    if "before_window_s" in result:
        print(f"    before window   {result['before_window_s']:7.2f} s")
        print(f"    after window    {result['after_window_s']:7.2f} s")
    if "fork_server_ready_s" in result:
        print(f"  fork server ready {result['fork_server_ready_s']:7.2f} s after the start (its imports done)")
    for label, v in result["phases_s"].items():
        print(f"  {label:38s} {v:7.3f} s")
    for label, v in (result.get("inside_window_s") or {}).items():
        print(f"  {'  ' + label + ' (after the window opens)':38s} {v:7.3f} s")


def run(args, overrides: list[str] | None = None) -> int:
    train_args = ([args.config] if args.config else []) + list(overrides or [])
    base = Path(args.output_dir) if args.output_dir else Path(tempfile.mkdtemp(prefix="tokenflow-bench-startup-"))
    base.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for i in range(args.runs):
            run_dir = base / f"run{i}"
            if run_dir.exists():
                print(f"error: {run_dir} exists; choose another --output-dir", file=sys.stderr)
                return 2
            try:
                results.append(measure(train_args, run_dir, base / f"run{i}.log"))
            except RuntimeError as e:
                print(f"error: {e}", file=sys.stderr)
                args.keep = True
                return 1
            if not args.json:
                _print(results[-1], f"run {i + 1} of {args.runs}")
    finally:
        if not args.keep and not args.output_dir:
            shutil.rmtree(base, ignore_errors=True)
    out = {"runs": results, "median": _median(results)}
    if args.json:
        print(json.dumps(out))
    elif len(results) > 1:
        _print(out["median"], f"median of {len(results)} runs")
    return 0
