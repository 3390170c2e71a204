"""The live view's figures line: token age says how much of the run trained older than K."""

from __future__ import annotations

from tokenflow.runtime.view.progress import format_figures
from tokenflow.runtime.view.summary import older_than

FIGURES = {"reward": 0.617, "tokens_per_s": 11500.0, "age_mean": 1.62, "age_max": 4.0,
           "trainer_idle": 0.14, "engine_idle": 0.42}


def test_age_names_the_share_older_than_the_staleness_budget():
    assert "age 1.62 (max 4)" in format_figures({**FIGURES, "over_k": 0.0})
    line = format_figures({**FIGURES, "over_k": 0.065})
    assert "age 1.62 (max 4, 6%>K)" in line
    assert len(line) <= 80


def test_older_than_counts_tokens_past_k():
    assert older_than({"0": 2, "1": 5, "2": 2, "4": 1}, 1) == 0.3
    assert older_than({0: 4}, 1) == 0.0 and older_than({}, 1) == 0.0
