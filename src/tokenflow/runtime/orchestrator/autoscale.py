"""When to add or remove an engine (``runtime.elastic``): from who waited on whom.

At each optimizer step the orchestrator reads, over the steps since its last reading, the
fraction of wall time the trainer was idle (waiting on generation: no full batch) and the
fraction of engine time the engines were idle (waiting on the trainer: the staleness budget
admits no more prompts until new weights land). An engine is added after
``runtime.elastic_patience`` steps in a row in which the trainer waited at least
``runtime.elastic_idle_frac`` of the time while the engines did not; one is removed after as many
steps in which the engines waited that much while the trainer did not. Nothing is decided while a
change is still under way, and the count of steps starts again after each change, so the effect
of one engine is measured before the next. Both waiting at once (``max_staleness = 0``: the two
take turns) decides nothing. Nor is anything decided once fewer than ``elastic_patience`` steps
remain: a change costs (the weight sync is rebuilt, a removed engine's groups are generated again)
and would not run long enough to pay for that, or to be measured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    trainer_wait: float
    """Fraction of the window the trainer was idle."""
    engine_wait: float
    """Fraction of the engines' time they were idle."""


def reading(wall_s: float, trainer_busy_s: float, engine_wall_s: float, engine_busy_s: float) -> Reading:
    """A window's fractions from its deltas (clamped to [0, 1]; an empty window reads as busy)."""
    tw = 1.0 - trainer_busy_s / wall_s if wall_s > 0 else 0.0
    ew = 1.0 - engine_busy_s / engine_wall_s if engine_wall_s > 0 else 0.0
    return Reading(min(1.0, max(0.0, tw)), min(1.0, max(0.0, ew)))


class AutoScale:
    def __init__(self, min_engines: int, max_engines: int, idle_frac: float, patience: int) -> None:
        self.min, self.max, self.idle, self.patience = min_engines, max_engines, idle_frac, patience
        self.add_streak = self.remove_streak = 0

    def observe(self, r: Reading, engines: int, steps_left: int | None = None) -> int:
        """+1 to add an engine, -1 to remove one, 0 to wait; ``engines``: how many run now,
        ``steps_left``: how many steps the run has still to go (None: no end in sight)."""
        trainer_waits, engines_wait = r.trainer_wait >= self.idle, r.engine_wait >= self.idle
        self.add_streak = self.add_streak + 1 if trainer_waits and not engines_wait else 0
        self.remove_streak = self.remove_streak + 1 if engines_wait and not trainer_waits else 0
        if steps_left is not None and steps_left < self.patience:
            return 0
        if self.add_streak >= self.patience and engines < self.max:
            self.restart()
            return 1
        if self.remove_streak >= self.patience and engines > self.min:
            self.restart()
            return -1
        return 0

    def restart(self) -> None:
        """Count again from zero (after a change, or while one is under way)."""
        self.add_streak = self.remove_streak = 0
