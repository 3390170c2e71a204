"""A Gantt view of a window of the run: who worked, who waited, and where the syncs fell.

One row per activity (engine steps, weight swaps, scorer calls, buffer waits, trainer phases,
sync phases, trainer idle), one panel per run, drawn from the trace. A run without a trace gets
the trainer's step and weight-push intervals from ``metrics.jsonl`` and a note that the other
rows need ``--metrics.trace true``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.patches import Patch

from tokenflow.report.run_data import RunData
from tokenflow.report.style import figure, save

# row → [(span name, legend label, colour)], drawn in order (later on top)
ROWS: list[tuple[str, list[tuple[str, str, str]]]] = [
    ("engine", [("engine/prefill", "engine prefill", "#9467bd"),
                ("engine/decode", "engine decode", "#1f77b4")]),
    ("weight swap", [("engine/weight_swap", "weight swap (engine)", "#d62728")]),
    ("scorer", [("scorer/score", "scorer call", "#8c564b")]),
    ("buffer", [("buffer/admission_blocked", "admission blocked (budget full)", "#bcbd22"),
                ("buffer/batch_wait", "trainer waits for a batch", "#ff7f0e")]),
    ("trainer", [("trainer/step", "trainer step (other)", "#c7c7c7"),
                 ("trainer/prox_logprobs", "trainer log-probs", "#17becf"),
                 ("trainer/forward", "trainer forward", "#2ca02c"),
                 ("trainer/backward", "trainer backward", "#98df8a"),
                 ("trainer/optimizer", "optimizer", "#e377c2")]),
    ("sync", [("sync/send", "weight push (trainer)", "#7f7f7f"),
              ("sync/wait_slot", "sync wait for slot", "#ad494a"),
              ("sync/pack", "sync pack", "#393b79"),
              ("sync/broadcast", "sync broadcast", "#637939"),
              ("sync/receive", "sync receive (engine)", "#8c6d31")]),
    ("trainer idle", [("trainer/idle", "trainer idle", "#ff9896")]),
]


def default_window(run: RunData, window_s: float | None) -> tuple[float, float]:
    """``window_s`` seconds (default 10) centred on the middle of the training window."""
    total = run.train_wall_s or (run.timeline.window_end() if run.timeline else 0.0)
    length = min(window_s or 10.0, total) if total > 0 else (window_s or 10.0)
    start = max(0.0, total / 2 - length / 2)
    return start, start + length


def _bars(iv: np.ndarray, lo: float, hi: float, min_width: float) -> list[tuple[float, float]]:
    iv = iv[(iv[:, 1] > lo) & (iv[:, 0] < hi)] if len(iv) else iv
    return [(max(s, lo), max(min(e, hi) - max(s, lo), min_width)) for s, e in iv]


def _draw_trace(a, run: RunData, lo: float, hi: float, used: dict) -> list[str]:
    tl = run.timeline
    engines = sorted({tl.processes.get(p, "") for n in ("engine/decode", "engine/prefill")
                      for p, _, _ in tl.spans.get(n, [])}) or ["engine"]
    labels: list[str] = []
    min_width = (hi - lo) / 600  # a 1 ms swap stays visible (~2 px) in a 10 s window
    for row, spans in ROWS:
        procs = engines if row == "engine" else [None]
        for proc in procs:
            y = len(labels)
            labels.append(proc if row == "engine" and len(engines) > 1 else row)
            for name, label, col in spans:
                iv = tl.intervals((name,), process=proc)
                bars = _bars(iv, lo, hi, min_width)
                if bars:
                    a.broken_barh(bars, (y - 0.38, 0.76), facecolors=col, edgecolors=col, linewidth=0.4)
                    used[label] = col
    return labels


def _draw_metrics(a, run: RunData, lo: float, hi: float, used: dict) -> list[str]:
    _, wall, train_s = run.series("time/train_s")
    sync_s = np.array([r.get("sync/trainer_s", 0.0) for r in run.steps if "time/train_s" in r])
    # time/wall_s is stamped when the orchestrator reads the trainer's reply: the step ends there.
    train = np.stack([wall - sync_s - train_s, wall - sync_s], axis=1) if len(wall) else np.zeros((0, 2))
    sync = np.stack([wall - sync_s, wall], axis=1) if len(wall) else np.zeros((0, 2))
    for y, (iv, label, col) in enumerate(((train, "trainer step", "#2ca02c"), (sync, "weight push", "#7f7f7f"))):
        bars = _bars(iv, lo, hi, (hi - lo) / 600)
        if bars:
            a.broken_barh(bars, (y - 0.38, 0.76), facecolors=col, edgecolors=col, linewidth=0.4)
            used[label] = col
    a.text(0.5, 1.02, "no trace.json: engine, scorer and buffer rows need --metrics.trace true",
           transform=a.transAxes, ha="center", va="bottom", fontsize=8, color="#d62728")
    return ["trainer", "sync"]


def plot_gantt(runs: list[RunData], path: Path, window_s: float | None = None) -> Path:
    heights = [len(ROWS) + 1 if r.timeline is not None else 3 for r in runs]
    fig, ax = figure(len(runs), 1, width=12.0, row_height=max(heights) * 0.42 + 1.0)
    used: dict[str, str] = {}
    for i, run in enumerate(runs):
        a = ax[i, 0]
        lo, hi = default_window(run, window_s)
        draw = _draw_trace if run.timeline is not None else _draw_metrics
        labels = draw(a, run, lo, hi, used)
        a.set_yticks(range(len(labels)), labels)
        a.set_ylim(len(labels) - 0.5, -0.5)
        a.set_xlim(lo, hi)
        a.set_xlabel("training wall time (s)")
        a.set_title(f"{run.name}: {lo:.1f}–{hi:.1f} s of a {run.train_wall_s:.1f} s training window",
                    loc="left", fontsize=10)
        a.grid(alpha=0.3, axis="x")
    handles = [Patch(color=c, label=label) for label, c in used.items()]
    ncol = min(5, len(handles)) or 1
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    legend_in = 0.25 * -(-len(handles) // ncol) + 0.1  # inches: rows of legend + margin
    return save(fig, path, rect=(0, legend_in / fig.get_figheight(), 1, 1))
