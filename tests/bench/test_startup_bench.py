"""Smoke test of `tokenflow bench startup` (a two-step run; the numbers are not checked)."""

from __future__ import annotations

import json

import pytest

from tokenflow.bench.startup import PHASES, breakdown
from tokenflow.cli.main import main


@pytest.mark.slow
def test_bench_startup_prints_the_phases_of_a_short_run(capsys, tmp_path):
    assert main(["bench", "startup", "--output-dir", str(tmp_path), "--json",
                 "--run.steps", "2", "--run.eval_limit", "4", "--metrics.progress", "false"]) == 0
    out = json.loads(capsys.readouterr().out)
    (r,) = out["runs"]
    assert r["wall_s"] > r["window_s"] > 0 and abs(r["overhead_s"] - (r["wall_s"] - r["window_s"])) < 1e-9
    assert set(r["phases_s"]) == {label for label, _, _ in PHASES}  # every mark was recorded
    assert abs(r["phases_s"]["training window"] - r["window_s"]) < 0.05
    assert r["before_window_s"] + r["window_s"] + r["after_window_s"] - r["wall_s"] < 0.05
    assert (tmp_path / "run0" / "summary.json").is_file()


def test_breakdown_without_phases_gives_the_totals():
    """A summary from a version that recorded no phases still gives wall, window and overhead."""
    r = breakdown({"train_wall_s": 10.0, "wall_s": 12.0}, 100.0, 115.0)
    assert (r["wall_s"], r["window_s"], r["overhead_s"], r["phases_s"]) == (15.0, 10.0, 5.0, {})
