"""Generation rates on the engines' own clocks (`step_metrics.EngineClock`, `LiveFigures`): an
engine status pairs its token counter with its clock, so tokens ÷ seconds between two of them is
what it generated per second, however late or bunched the orchestrator handles them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tokenflow.runtime.orchestrator.step_metrics import EngineClock, EngineTotals, LiveFigures


@dataclass
class Status:
    wall_s: float
    tokens: int
    busy_s: float


def test_the_live_rate_is_tokens_over_engine_seconds_even_when_statuses_arrive_bunched():
    live, totals = LiveFigures(window_s=10.0), EngineTotals()
    # The engine generates 100 tok/s for 4 s, busy 80% of the time; the orchestrator is blocked
    # and handles the four statuses at once (t = 50), then runs an optimizer step at t = 51.
    for k in range(1, 5):
        totals.update("engine", Status(wall_s=10.0 + k, tokens=100 * k, busy_s=0.8 * k))
        figures = live.sample(50.0, trainer_busy_s=0.0, engines=totals)
    assert figures["tokens_per_s"] == pytest.approx(100.0)
    assert figures["engine_idle"] == pytest.approx(0.2)
    assert live.sample(51.0, trainer_busy_s=0.5, engines=totals)["tokens_per_s"] == pytest.approx(100.0)
    # Older than the window on the engine's clock: forgotten. 20 s later at 30 tok/s.
    for k in range(1, 21):
        totals.update("engine", Status(wall_s=14.0 + k, tokens=400 + 30 * k, busy_s=3.2 + 0.5 * k))
        figures = live.sample(51.0 + k, trainer_busy_s=0.5, engines=totals)
    assert figures["tokens_per_s"] == pytest.approx(30.0)


def test_engines_add_up_and_a_restarted_one_starts_a_new_clock():
    live, totals = LiveFigures(window_s=10.0), EngineTotals()
    for k in range(3):
        totals.update("a", Status(wall_s=float(k), tokens=50 * k, busy_s=float(k)))
        totals.update("b", Status(wall_s=5.0 + k, tokens=1000 + 20 * k, busy_s=float(k)))
        figures = live.sample(float(k), 0.0, totals)
    assert figures["tokens_per_s"] == pytest.approx(70.0)
    totals.update("b", Status(wall_s=0.5, tokens=10, busy_s=0.5))  # a new process: counters from 0
    figures = live.sample(3.0, 0.0, totals)
    assert figures["tokens_per_s"] == pytest.approx(50.0)  # b has one reading of its new clock
    totals.update("b", Status(wall_s=1.5, tokens=40, busy_s=1.5))
    assert live.sample(4.0, 0.0, totals)["tokens_per_s"] == pytest.approx(80.0)


def test_a_steps_rate_is_its_tokens_over_the_engines_seconds():
    clock, totals = EngineClock(), EngineTotals()
    totals.update("engine", Status(wall_s=2.0, tokens=0, busy_s=0.0))
    clock.reset(totals)
    totals.update("engine", Status(wall_s=6.0, tokens=700, busy_s=4.0))
    r = clock.step(totals)
    assert (r.tokens, r.seconds, r.tokens_per_s) == (700.0, 4.0, 175.0)
    # no reading since: the live rate stands in, and the next step's interval covers both
    r = clock.step(totals, fallback=160.0)
    assert (r.tokens, r.seconds, r.tokens_per_s) == (0.0, 0.0, 160.0)
    totals.update("engine", Status(wall_s=11.0, tokens=1400, busy_s=8.0))
    r = clock.step(totals)
    assert (r.tokens, r.seconds, r.tokens_per_s) == (700.0, 5.0, 140.0)
