"""The comparison's outputs: a table on stdout (and in table.md), results.json, and a figure of
held-out accuracy against training wall time."""

from __future__ import annotations

import statistics
from pathlib import Path

SIDE_ORDER = ("trl", "tokenflow-sync", "tokenflow-async")
COLORS = {"trl": "tab:orange", "tokenflow-sync": "tab:blue", "tokenflow-async": "tab:green"}


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (workload, side): means over seeds, and each seed's accuracy."""
    rows = []
    for workload in dict.fromkeys(r["workload"] for r in runs):
        for side in SIDE_ORDER:
            mine = [r for r in runs if r["workload"] == workload and r["side"] == side]
            if not mine:
                continue
            walls = [r["train_wall_s"] for r in mine]
            rows.append({
                "workload": workload, "side": side, "seeds": [r["seed"] for r in mine],
                "train_wall_s": _mean(walls), "train_wall_spread_s": max(walls) - min(walls),
                "s_per_step": _mean([r["train_wall_s"] / r["steps"] for r in mine]),
                "completion_tokens_per_s": _mean([r["completion_tokens"] / r["train_wall_s"] for r in mine]),
                "process_wall_s": _mean([r["process_wall_s"] for r in mine]),
                "accuracy": _mean([r["final_accuracy"] for r in mine]),
                "accuracy_per_seed": [r["final_accuracy"] for r in mine],
                "baseline_accuracy": mine[0]["points"][0]["accuracy"],
            })
    for row in rows:
        trl = next((r for r in rows if r["workload"] == row["workload"] and r["side"] == "trl"), None)
        row["trl_wall_over_this"] = trl["train_wall_s"] / row["train_wall_s"] if trl else None
    return rows


def table(rows: list[dict]) -> str:
    head = ("| workload | side | training wall (s) | s/step | completion tokens/s | held-out accuracy "
            "(mean; per seed) | TRL wall ÷ this | process wall (s) |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['trl_wall_over_this']:.2f}" if r["trl_wall_over_this"] else "–"
        seeds = " / ".join(f"{a:.3f}" for a in r["accuracy_per_seed"])
        lines.append(f"| {r['workload']} | {r['side']} | {r['train_wall_s']:.1f} (±{r['train_wall_spread_s'] / 2:.1f}) "
                     f"| {r['s_per_step']:.3f} | {r['completion_tokens_per_s']:.0f} | {r['accuracy']:.3f}; {seeds} "
                     f"| {ratio} | {r['process_wall_s']:.1f} |")
    return "\n".join(lines)


def figure(runs: list[dict], path: Path) -> Path:
    """Accuracy against training wall time, one panel per workload, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        labelled = set()
        for r in (r for r in runs if r["workload"] == workload):
            pts = r["points"]
            label = None if r["side"] in labelled else r["side"]
            labelled.add(r["side"])
            ax.plot([p["wall_s"] for p in pts], [p["accuracy"] for p in pts], marker="o", ms=3,
                    color=COLORS.get(r["side"]), alpha=0.8, label=label)
        ax.set_title(f"workload: {workload}")
        ax.set_xlabel("training wall time (s)")
        ax.set_ylabel("held-out greedy accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
