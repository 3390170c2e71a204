"""Shared figure helpers: the non-interactive backend, run colours, smoothing, saving."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed (and none on a server)

import matplotlib.pyplot as plt
import numpy as np

RUN_COLORS = ("tab:blue", "tab:orange")


def color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


def figure(nrows: int, ncols: int, width: float = 11.0, row_height: float = 3.6):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, row_height * nrows), squeeze=False)
    return fig, axes


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points (shorter at the start), NaN-free input assumed."""
    if window <= 1 or len(y) == 0:
        return y
    c = np.cumsum(np.insert(y.astype(float), 0, 0.0))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def smoothing_window(n: int) -> int:
    return max(1, n // 15)


def save(fig, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay out (inside ``rect``, leaving room for a figure legend), write a PNG, free the figure."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
