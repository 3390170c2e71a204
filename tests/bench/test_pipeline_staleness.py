"""`tokenflow bench pipeline --staleness ...`: one run per (K, seed, corrections), then a row per K."""

from __future__ import annotations

import json
import tomllib

import pytest

from tests.bench.test_pipeline_seeds import bench
from tests.runtime.runtime_testlib import SMALL
from tokenflow.bench.pipeline_staleness import parse_staleness


def test_parse_staleness_always_includes_the_synchronous_reference():
    assert parse_staleness("4,1,2") == [0, 1, 2, 4]
    assert parse_staleness("0,8,8") == [0, 8]
    for bad in ("1,x", "-1,2", ""):
        with pytest.raises(ValueError, match="--staleness"):
            parse_staleness(bad)


def test_bad_sweep_arguments_are_refused(tmp_path):
    r = bench("--staleness", "0,two", "--output-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "--staleness" in r.stderr
    r = bench("--staleness", "0,2", "--corrections", "maybe", "--output-dir", str(tmp_path / "b"))
    assert r.returncode == 2 and "--corrections" in r.stderr


@pytest.mark.slow
def test_sweep_rows_summarise_their_runs(tmp_path):
    out = tmp_path / "sw"
    r = bench("--staleness", "2", "--seeds", "1", "--output-dir", str(out), *SMALL, "--run.steps", "3", "--json")
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads(r.stdout)
    assert json.loads((out / "bench.json").read_text()) == result
    rows = {(row["k"], row["corrections"]): row for row in result["rows"]}
    assert set(rows) == {(0, "-"), (2, "on"), (2, "off")}
    for run in result["runs"]:
        folder = out / run["corrections"] / f"K{run['k']}" / f"seed{run['seed']}"
        summary = json.loads((folder / "summary.json").read_text())
        algorithm = tomllib.loads((folder / "config.toml").read_text())["algorithm"]
        assert summary["max_staleness"] == run["k"] and summary["final_accuracy"] == run["accuracy"]
        assert summary["token_age_histogram"] == run["token_age_histogram"]
        # "off" is the run without a behaviour weight; "on" keeps the config's corrections.
        assert algorithm["behaviour_logprobs"] is (run["corrections"] == "on")
    for (k, setting), row in rows.items():
        assert row["gap"] == pytest.approx(row["accuracy_mean"] - rows[(0, "-")]["accuracy_mean"])
        hist = row["token_age_histogram"]
        assert row["token_age_max"] == max(int(a) for a, c in hist.items() if c)
        assert sum(hist.values()) == sum(sum(r["token_age_histogram"].values()) for r in result["runs"]
                                         if r["k"] == k and r["corrections"] == (setting if k else "on"))
    # Synchronously π_prox = μ up to the engine/trainer mismatch; with K = 2 and the weight on,
    # stale tokens carry w = π_prox/μ that differs from 1 by far more than that mismatch (1e-6).
    # Off, the trainer reports the weight it used: exactly 1.
    assert abs(rows[(0, "-")]["weight_max"] - 1) < 1e-3
    assert rows[(2, "on")]["weight_max"] > 1.01 and rows[(2, "on")]["token_age_max"] >= 1
    assert rows[(2, "off")]["weight_max"] == 1.0 and rows[(2, "off")]["weight_min"] == 1.0
