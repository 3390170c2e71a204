"""A run folder read back for reporting: summary, per-step metrics, evaluations, token ages.

Time axis: ``time/wall_s`` in ``metrics.jsonl`` counts seconds from the start of the training
window (the first admission, once the engines are loaded; the baseline evaluation runs beside
the first groups), which is also the zero of the trace-derived timeline
(:mod:`tokenflow.report.timeline`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from tokenflow.metrics.sinks import read_jsonl

log = logging.getLogger(__name__)


@dataclass
class RunData:
    root: Path
    name: str
    summary: dict
    rows: list[dict] = field(repr=False)

    # ---- per-step series -------------------------------------------------------------------
    @cached_property
    def steps(self) -> list[dict]:
        """One row per optimizer step (the rows the trainer's metrics are in)."""
        return [r for r in self.rows if "loss/total" in r]

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(step, wall_s, value) of every step row that has ``key``."""
        rows = [r for r in self.steps if key in r]
        return (np.array([r["step"] for r in rows], dtype=float),
                np.array([r.get("time/wall_s", np.nan) for r in rows], dtype=float),
                np.array([r[key] for r in rows], dtype=float))

    @property
    def train_wall_s(self) -> float:
        if "train_wall_s" in self.summary:
            return float(self.summary["train_wall_s"])
        walls = [r["time/wall_s"] for r in self.steps if "time/wall_s" in r]
        return float(walls[-1]) if walls else 0.0

    @cached_property
    def evals(self) -> list[tuple[int, float, float]]:
        """(step, wall_s, accuracy) of each held-out evaluation, in order.

        Evaluation rows carry no wall time: the baseline sits at 0, a mid-run evaluation at its
        step's wall time, the final one at the end of the training window."""
        wall_at = {r["step"]: r.get("time/wall_s", np.nan) for r in self.steps}
        out = []
        rows = [r for r in self.rows if "eval/accuracy" in r]
        for i, r in enumerate(rows):
            s = int(r["step"])
            if i == 0 and s == 0:
                w = 0.0
            elif i == len(rows) - 1 and s == self.summary.get("steps"):
                w = self.train_wall_s
            else:
                w = wall_at.get(s, np.nan)
            out.append((s, float(w), float(r["eval/accuracy"])))
        return out

    # ---- derived totals --------------------------------------------------------------------
    def engine_tokens_per_s(self) -> float:
        """Generation rate over the training window (step-duration weighted per-step rates)."""
        _, _, rate = self.series("perf/engine_tokens_per_s")
        _, _, dt = self.series("time/step_s")
        n = min(len(rate), len(dt))
        return float((rate[:n] * dt[:n]).sum() / dt[:n].sum()) if n and dt[:n].sum() > 0 else 0.0

    def trainer_tokens_per_s(self) -> float:
        """Tokens trained per second of the training window (busy or not)."""
        _, _, tokens = self.series("perf/train_tokens")
        return float(tokens.sum() / self.train_wall_s) if self.train_wall_s > 0 else 0.0

    def last(self, key: str, default: float = float("nan")) -> float:
        for r in reversed(self.steps):
            if key in r:
                return float(r[key])
        return default

    # ---- token ages --------------------------------------------------------------------------
    @cached_property
    def age_histogram(self) -> tuple[dict[int, int], str]:
        """Token age at consumption → token count, and where it came from.

        ``summary.json`` holds the buffer's histogram; older runs have it only in
        ``rollouts.jsonl`` (with ``run.save_rollouts``); otherwise it is empty."""
        hist = self.summary.get("token_age_histogram")
        if hist:
            return {int(a): int(c) for a, c in hist.items()}, "summary.json"
        path = self.root / "rollouts.jsonl"
        if path.is_file():
            counts: Counter = Counter()
            for r in read_jsonl(path):
                # rollouts of step s were taken by trainer version s - 1
                for v in r.get("versions", []):
                    counts[int(r["step"]) - 1 - int(v)] += 1
            if counts:
                return dict(sorted(counts.items())), "rollouts.jsonl"
        return {}, ""

    def mean_token_age(self) -> float:
        hist, _ = self.age_histogram
        total = sum(hist.values())
        if total:
            return sum(a * c for a, c in hist.items()) / total
        return self.last("buffer/token_age_mean", 0.0)  # the buffer's running mean

    def max_token_age(self) -> float:
        hist, _ = self.age_histogram
        return float(max(hist)) if hist else self.last("buffer/token_age_max", 0.0)

    # ---- trace -------------------------------------------------------------------------------
    @property
    def trace_path(self) -> Path | None:
        p = self.root / "trace.json"
        return p if p.is_file() else None

    @cached_property
    def timeline(self):
        """The run's :class:`~tokenflow.report.timeline.Timeline`, or None without a trace."""
        from tokenflow.report.timeline import Timeline

        return Timeline.load(self.trace_path) if self.trace_path else None


def load_run(path: str | Path, name: str | None = None) -> RunData:
    root = Path(path)
    metrics = root / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{root} is not a run folder (no metrics.jsonl)")
    summary_path = root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if not summary:
        log.warning("%s has no summary.json (still running, or killed): totals come from metrics.jsonl", root)
    return RunData(root=root, name=name or root.name, summary=summary, rows=read_jsonl(metrics))


def run_names(paths: list[Path]) -> list[str]:
    """Legend names: folder names, with the parent's added when two are the same."""
    names = [p.resolve().name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]
    return names
