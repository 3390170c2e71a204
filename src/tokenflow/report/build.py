"""Put a report together: load the runs, draw each figure, write the text summary."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tokenflow.report.run_data import RunData, load_run, run_names

log = logging.getLogger(__name__)

FIGURES = ("learning", "throughput", "idle", "token_age", "gantt")


@dataclass
class Report:
    runs: list[RunData]
    text: str
    numbers: list[dict]
    files: list[Path]


def make_report(run_dirs: list[str | Path], out_dir: str | Path, *, window_s: float | None = None,
                bin_s: float | None = None, progress: bool = False) -> Report:
    """Write ``<figure>.png`` for each of :data:`FIGURES`, ``report.txt`` and ``report.json``."""
    from tokenflow.report.ages import plot_ages
    from tokenflow.report.curves import plot_learning
    from tokenflow.report.gantt import plot_gantt
    from tokenflow.report.idle import plot_idle
    from tokenflow.report.text import run_numbers, summary_text
    from tokenflow.report.throughput import plot_throughput
    from tokenflow.runtime.view.progress import Progress

    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p, name) for p, name in zip(paths, run_names(paths))]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    draw = {
        "learning": lambda p: plot_learning(runs, p),
        "throughput": lambda p: plot_throughput(runs, p),
        "idle": lambda p: plot_idle(runs, p, bin_s),
        "token_age": lambda p: plot_ages(runs, p),
        "gantt": lambda p: plot_gantt(runs, p, window_s),
    }
    bar = Progress(len(FIGURES) + 1, description="report", enabled=progress, unit="figure")
    files = []
    try:
        for i, name in enumerate(FIGURES):
            bar.status(f"drawing {name}.png")
            files.append(draw[name](out / f"{name}.png"))
            bar.update(i + 1, {})
        numbers = [run_numbers(r) for r in runs]
        text = summary_text(numbers)
        (out / "report.txt").write_text(text)
        (out / "report.json").write_text(json.dumps({"runs": numbers}, indent=2))
        files += [out / "report.txt", out / "report.json"]
        bar.update(len(FIGURES) + 1, {})
    finally:
        bar.close()
    log.debug("report written to %s", out)
    return Report(runs, text, numbers, files)
