"""Reward and held-out accuracy, against optimizer step and against training wall time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenflow.report.run_data import RunData
from tokenflow.report.style import color, figure, save, smooth, smoothing_window


def plot_learning(runs: list[RunData], path: Path) -> Path:
    fig, ax = figure(2, 2)
    for i, run in enumerate(runs):
        c = color(i)
        step, wall, reward = run.series("reward/mean")
        w = smoothing_window(len(reward))
        for a, x in ((ax[0, 0], step), (ax[0, 1], wall)):
            a.plot(x, reward, color=c, alpha=0.25, lw=0.8)
            a.plot(x, smooth(reward, w), color=c, lw=2,
                   label=f"{run.name} (mean of {w})" if w > 1 else run.name)
        if run.evals:
            s, t, acc = (np.array(v) for v in zip(*run.evals))
            label = f"{run.name}: {acc[0]:.3f} → {acc[-1]:.3f}"
            ax[1, 0].plot(s, acc, "o-", color=c, label=label)
            ax[1, 1].plot(t, acc, "o-", color=c, label=label)
    ax[0, 0].set(title="training reward", xlabel="optimizer step", ylabel="reward/mean")
    ax[0, 1].set(title="training reward", xlabel="training wall time (s)", ylabel="reward/mean")
    ax[1, 0].set(title="held-out greedy accuracy", xlabel="optimizer step", ylabel="accuracy")
    ax[1, 1].set(title="held-out greedy accuracy", xlabel="training wall time (s)", ylabel="accuracy")
    for a in ax.flat:
        a.grid(alpha=0.3)
        if a.has_data():
            a.legend(fontsize=8)
    return save(fig, path)
