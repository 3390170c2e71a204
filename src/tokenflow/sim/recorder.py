"""Raw observations of one simulation: per-engine state intervals and per-step records.

Kept raw (intervals, not running totals) so the steady-state window can be cut exactly after
the run, once the end of the warm-up steps is known.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

ENGINE_STATES = ("decode", "prefill", "swap", "paused", "idle")


@dataclass
class StepRecord:
    """One optimizer step, times in simulated seconds."""

    index: int
    start_s: float
    data_s: float
    """When the batch was complete and taken."""
    train_end_s: float
    sync_start_s: float
    """When the weight transfer began (after waiting for a free shared-memory slot or for every
    engine to join a broadcast); = end on a step without a sync."""
    end_s: float
    completion_tokens: int
    prompt_tokens: int
    rejected_tokens: int
    ages: Counter = field(default_factory=Counter)
    """Completion tokens by age (trainer version - token version)."""

    @property
    def wait_data_s(self) -> float:
        return self.data_s - self.start_s

    @property
    def train_s(self) -> float:
        return self.train_end_s - self.data_s

    @property
    def sync_wait_s(self) -> float:
        return self.sync_start_s - self.train_end_s

    @property
    def sync_s(self) -> float:
        return self.end_s - self.sync_start_s


class Recorder:
    def __init__(self, engines: int) -> None:
        self.engines = engines
        # engine -> state -> [(start, end, tokens, steps)]
        self.intervals: list[dict[str, list[tuple[float, float, int, int]]]] = [
            defaultdict(list) for _ in range(engines)]
        self.steps: list[StepRecord] = []
        self.reprefill: list[tuple[float, int]] = []
        """(time, tokens) re-prefilled after aborts."""

    def engine(self, idx: int, state: str, start: float, end: float,
               tokens: int = 0, steps: int = 0) -> None:
        if end > start:
            self.intervals[idx][state].append((start, end, tokens, steps))

    def step(self, rec: StepRecord) -> None:
        self.steps.append(rec)

    def engine_time(self, idx: int, state: str, t0: float, t1: float) -> tuple[float, float, float]:
        """(seconds, tokens, decode steps) of ``state`` inside [t0, t1], prorated at the edges."""
        secs = toks = nsteps = 0.0
        for a, b, tok, st in self.intervals[idx].get(state, ()):
            lo, hi = max(a, t0), min(b, t1)
            if hi > lo:
                frac = (hi - lo) / (b - a)
                secs += hi - lo
                toks += tok * frac
                nsteps += st * frac
        return secs, toks, nsteps
