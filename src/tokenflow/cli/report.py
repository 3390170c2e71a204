"""`tokenflow report RUN_DIR [RUN_DIR_B]`: figures and a text summary of a run, or two overlaid."""

from __future__ import annotations

import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="figures and a text summary of one run, or two overlaid",
        description="Write PNG figures (reward and accuracy against step and wall time, "
                    "throughput, idle fractions over time, token-age histogram, a Gantt view of a "
                    "window of the run) and a text summary for RUN_DIR; with a second run folder, "
                    "overlay the two (e.g. the sync and async runs of `tokenflow bench pipeline`).")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="one or two run folders")
    p.add_argument("--out", help="where the report goes (default RUN_DIR/report, or "
                                 "<parent>/report for two runs in one folder)")
    p.add_argument("--window", type=float, default=None, metavar="SECONDS",
                   help="length of the Gantt window, centred on the middle of the run (default 10)")
    p.add_argument("--bin", type=float, default=None, metavar="SECONDS",
                   help="time bin of the idle-fraction curves (default: 1/40 of the run, ≥ 1 s)")
    p.set_defaults(func=run)


def default_out(runs: list[Path]) -> Path:
    if len(runs) == 1:
        return runs[0] / "report"
    parents = {r.resolve().parent for r in runs}
    return (parents.pop() if len(parents) == 1 else runs[0]) / "report"


def run(args) -> int:
    runs = [Path(r) for r in args.runs]
    if len(runs) > 2:
        print("error: report takes one or two run folders", file=sys.stderr)
        return 2
    for r in runs:
        if not (r / "metrics.jsonl").is_file():
            print(f"error: {r} is not a run folder (no metrics.jsonl)", file=sys.stderr)
            return 2
    from tokenflow.report import make_report

    out = Path(args.out) if args.out else default_out(runs)
    # A live bar on a terminal; no per-figure log lines otherwise (a report takes seconds).
    report = make_report(runs, out, window_s=args.window, bin_s=args.bin, progress=sys.stderr.isatty())
    sys.stdout.write(report.text)
    print(f"\nwrote {', '.join(p.name for p in report.files)} to {out}")
    return 0
