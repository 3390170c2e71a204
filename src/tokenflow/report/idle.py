"""Idle fraction of the engine and the trainer over the training window.

Two curves per worker and run: the cumulative idle fraction the runtime logs
(``perf/*_idle_frac``, whose last value is the one in ``summary.json``), and the idle fraction
within each time bin. Bins come from the trace when the run has one (exact busy intervals);
without a trace the trainer's comes from each step's own timings (train + weight push over the
step's wall time) and the engine's from differences of its cumulative fraction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenflow.report.run_data import RunData
from tokenflow.report.style import color, figure, save

WORKERS = ("trainer", "engine")


def default_bin_s(run: RunData) -> float:
    """About 1/40 of the window (≥ 1 s), rounded to a whole number of mean step times so each
    bin holds whole generate/train cycles (otherwise a synchronous run's bins alias)."""
    target = max(1.0, run.train_wall_s / 40)
    _, _, step_s = run.series("time/step_s")
    if not len(step_s) or step_s.mean() <= 0:
        return round(target, 1)
    return float(max(1, round(target / step_s.mean())) * step_s.mean())


def windowed_idle(run: RunData, bin_s: float) -> dict[str, tuple[np.ndarray, np.ndarray, str]]:
    """worker → (bin centres s, idle fraction per bin, source)."""
    tl = run.timeline
    end = run.train_wall_s
    if tl is not None and tl.window_end() > 0:
        end = min(end, tl.window_end()) if end > 0 else tl.window_end()
        edges = np.arange(0.0, end + 1e-9, bin_s)
        if end - edges[-1] > bin_s / 2 or len(edges) < 2:  # keep a last partial bin of some size
            edges = np.append(edges, end)
        idle = tl.idle_in_bins(edges)
        mids = (edges[:-1] + edges[1:]) / 2
        return {w: (mids, idle[w], f"trace, {bin_s:.2f} s bins") for w in WORKERS}
    return _from_metrics(run, bin_s)


def _from_metrics(run: RunData, bin_s: float) -> dict[str, tuple[np.ndarray, np.ndarray, str]]:
    _, wall, step_s = run.series("time/step_s")
    _, _, train_s = run.series("time/train_s")
    sync_s = np.array([r.get("sync/trainer_s", 0.0) for r in run.steps if "time/step_s" in r])
    n = min(len(wall), len(train_s), len(sync_s))
    trainer = 1.0 - ((train_s[:n] + sync_s[:n]) / step_s[:n].clip(min=1e-9))
    out = {"trainer": (wall[:n] - step_s[:n] / 2, trainer.clip(0, 1), "per step, from metrics")}
    _, w, cum = run.series("perf/engine_idle_frac")
    busy = (1.0 - cum) * w  # engine busy seconds since the window began (≈: status lags ≤ 1 s)
    xs, ys, j = [], [], 0
    for i in range(1, len(w)):
        if w[i] - w[j] >= bin_s:
            xs.append((w[i] + w[j]) / 2)
            ys.append(1.0 - (busy[i] - busy[j]) / (w[i] - w[j]))
            j = i
    out["engine"] = (np.array(xs), np.clip(ys, 0, 1), f"≈ from cumulative metrics, ≥{bin_s:.2f} s")
    return out


def plot_idle(runs: list[RunData], path: Path, bin_s: float | None = None) -> Path:
    bin_s = bin_s or default_bin_s(runs[0])
    fig, ax = figure(2, 1, width=11.0, row_height=3.4)
    for i, run in enumerate(runs):
        c = color(i)
        series = windowed_idle(run, bin_s)
        for row, worker in enumerate(WORKERS):
            a = ax[row, 0]
            x, y, source = series[worker]
            a.plot(x, y, color=c, lw=1, alpha=0.55, marker=".", ms=3, label=f"{run.name}: {source}")
            _, wall, cum = run.series(f"perf/{worker}_idle_frac")
            final = run.summary.get(f"{worker}_idle_frac", cum[-1] if len(cum) else float("nan"))
            a.plot(wall, cum, color=c, lw=2.2, label=f"{run.name}: cumulative (final {final:.1%})")
    for row, worker in enumerate(WORKERS):
        a = ax[row, 0]
        a.set(title=f"{worker} idle fraction", xlabel="training wall time (s)", ylabel="idle fraction",
              ylim=(-0.02, 1.02))
        a.grid(alpha=0.3)
        a.legend(fontsize=8, loc="upper right")
    return save(fig, path)
