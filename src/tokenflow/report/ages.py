"""Token age at consumption: how many optimizer steps old each trained token was.

Age = the trainer's version when the batch was taken − the version that generated the token
(0 = on-policy). The histogram comes from ``summary.json`` (the buffer's counts) or from
``rollouts.jsonl``; a run with neither gets its per-step mean and maximum age instead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenflow.report.run_data import RunData
from tokenflow.report.style import color, figure, save


def plot_ages(runs: list[RunData], path: Path) -> Path:
    with_hist = [r for r in runs if r.age_histogram[0]]
    if len(with_hist) == len(runs):
        return _histogram(runs, path)
    fig, ax = figure(1, 1, width=9.0, row_height=4.0)
    a = ax[0, 0]
    for i, run in enumerate(runs):
        step, _, mean = run.series("offpolicy/token_age_mean")
        _, _, mx = run.series("offpolicy/token_age_max")
        a.plot(step, mean, color=color(i), lw=2, label=f"{run.name}: mean")
        a.plot(step, mx, color=color(i), lw=1, ls="--", label=f"{run.name}: max")
    a.set(title="token age per step (no histogram in summary.json or rollouts.jsonl)",
          xlabel="optimizer step", ylabel="age (optimizer steps)")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    return save(fig, path)


def _histogram(runs: list[RunData], path: Path) -> Path:
    fig, ax = figure(1, 1, width=9.0, row_height=4.0)
    a = ax[0, 0]
    ages = sorted({age for r in runs for age in r.age_histogram[0]})
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        hist, source = run.age_histogram
        total = sum(hist.values())
        frac = np.array([hist.get(age, 0) / total for age in ages])
        x = np.arange(len(ages)) + (i - (len(runs) - 1) / 2) * width
        bars = a.bar(x, frac, width=width, color=color(i),
                     label=f"{run.name}: mean {run.mean_token_age():.2f}, max {run.max_token_age():.0f} "
                           f"({total:,} tokens, {source})")
        for rect, f in zip(bars, frac):
            if f > 0:
                a.annotate(f"{f:.1%}", (rect.get_x() + rect.get_width() / 2, f), ha="center",
                           va="bottom", fontsize=7)
    a.set_xticks(np.arange(len(ages)), [str(age) for age in ages])
    a.set(title="token age at consumption", xlabel="age (optimizer steps; 0 = on-policy)",
          ylabel="fraction of trained tokens", ylim=(0, 1.08))
    a.grid(alpha=0.3, axis="y")
    a.legend(fontsize=8)
    return save(fig, path)
