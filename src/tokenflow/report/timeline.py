"""A merged ``trace.json`` read back as intervals on the run's time axis.

Zero is the start of the training window: the ``orchestrator/window_start`` mark the
orchestrator records when it opens it (in traces from before that mark: the end of the last
``orchestrator/eval`` span before the first ``trainer/step``, the baseline evaluation), so trace
times line up with ``time/wall_s`` in ``metrics.jsonl``. Busy is defined as the runtime's idle clocks define it:
the engine is busy inside a prefill or decode step, the trainer inside a step or its weight push.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ENGINE_BUSY = ("engine/prefill", "engine/decode")
TRAINER_BUSY = ("trainer/step", "sync/send")


def merge_intervals(iv: np.ndarray) -> np.ndarray:
    """Union of [start, end] rows, sorted and disjoint."""
    if len(iv) == 0:
        return np.zeros((0, 2))
    iv = iv[np.argsort(iv[:, 0])]
    out = [list(iv[0])]
    for s, e in iv[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return np.array(out)


def busy_in_bins(iv: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Fraction of each bin [edges[i], edges[i+1]) covered by the (merged) intervals."""
    iv = merge_intervals(iv)
    if len(iv) == 0:
        return np.zeros(len(edges) - 1)
    # Cumulative busy time is piecewise linear through (s_i, c_i) and (e_i, c_i + d_i).
    d = iv[:, 1] - iv[:, 0]
    c = np.concatenate([[0.0], np.cumsum(d)[:-1]])
    x = iv.reshape(-1)
    y = np.stack([c, c + d], axis=1).reshape(-1)
    cum = np.interp(edges, x, y, left=0.0, right=y[-1])
    return np.diff(cum) / np.diff(edges)


@dataclass
class Timeline:
    t0_wall: float
    """Wall-clock seconds (time.time()) of the training window's start."""
    processes: dict[int, str]
    """pid → process name (orchestrator, engine, trainer, scorer)."""
    spans: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)
    """span name → [(pid, start, end)] in seconds from t0."""
    counters: dict[str, list[tuple[float, dict]]] = field(default_factory=dict)
    tracer_self_s: dict[int, float] = field(default_factory=dict)
    """pid → seconds the tracer itself spent in that process (its "trace/self_s" counter)."""

    @classmethod
    def load(cls, path: str | Path) -> Timeline:
        events = json.loads(Path(path).read_text(encoding="utf-8")).get("traceEvents", [])
        return cls.from_events(events)

    @classmethod
    def from_events(cls, events: list[dict]) -> Timeline:
        processes = {e["pid"]: e["args"]["name"] for e in events
                     if e.get("ph") == "M" and e.get("name") == "process_name"}
        spans: dict[str, list] = defaultdict(list)
        counters: dict[str, list] = defaultdict(list)
        self_s: dict[int, float] = {}
        for e in events:
            ph = e.get("ph")
            if ph == "X":
                s = e["ts"] / 1e6
                spans[e["name"]].append((e["pid"], s, s + e.get("dur", 0.0) / 1e6))
            elif ph == "C" and e["name"] == "trace/self_s":
                self_s[e["pid"]] = max(self_s.get(e["pid"], 0.0), e["args"]["self_s"])
            elif ph == "C":
                counters[e["name"]].append((e["ts"] / 1e6, e.get("args", {})))
        t0 = _window_start(spans)
        rel = {k: sorted((p, s - t0, e - t0) for p, s, e in v) for k, v in spans.items()}
        cnt = {k: sorted(((t - t0, a) for t, a in v), key=lambda x: x[0]) for k, v in counters.items()}
        return cls(t0, processes, rel, cnt, self_s)

    # ---- queries -------------------------------------------------------------------------------
    def intervals(self, names, process: str | None = None) -> np.ndarray:
        """[start, end] rows of every span named in ``names`` (optionally of one process kind)."""
        rows = [(s, e) for n in names for pid, s, e in self.spans.get(n, [])
                if process is None or self.processes.get(pid, "").startswith(process)]
        return np.array(rows, dtype=float).reshape(-1, 2)

    def process_kinds(self) -> set[str]:
        """Kinds of process (name without a trailing number) that recorded at least one span."""
        pids = {pid for v in self.spans.values() for pid, _, _ in v}
        return {self.processes.get(p, "?").rstrip("0123456789") for p in pids}

    def tracer_cost(self) -> dict[str, float]:
        """Process kind → the most seconds the tracer spent in one process of that kind."""
        out: dict[str, float] = {}
        for pid, sec in self.tracer_self_s.items():
            kind = self.processes.get(pid, "?").rstrip("0123456789")
            out[kind] = max(out.get(kind, 0.0), sec)
        return out

    def idle_in_bins(self, edges: np.ndarray) -> dict[str, np.ndarray]:
        return {"engine": 1.0 - busy_in_bins(self.intervals(ENGINE_BUSY), edges),
                "trainer": 1.0 - busy_in_bins(self.intervals(TRAINER_BUSY), edges)}

    def window_end(self) -> float:
        """End of the last trainer step (the training window's end on this axis)."""
        steps = self.intervals(("trainer/step",))
        return float(steps[:, 1].max()) if len(steps) else 0.0


def _window_start(spans: dict[str, list]) -> float:
    marks = spans.get("orchestrator/window_start")
    if marks:
        return min(s for _, s, _ in marks)
    steps = spans.get("trainer/step", [])
    first_step = min((s for _, s, _ in steps), default=None)
    evals = [e for _, _, e in spans.get("orchestrator/eval", [])]
    if first_step is not None:
        before = [e for e in evals if e <= first_step]
        if before:
            return max(before)
        return first_step
    starts = [s for v in spans.values() for _, s, _ in v]
    return min(starts) if starts else 0.0
