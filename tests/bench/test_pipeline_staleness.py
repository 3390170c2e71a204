"""`tokenflow bench pipeline --staleness ...`: one run per (K, seed, corrections), then a row per K."""

from __future__ import annotations

import json
import tomllib

import pytest
from rich.console import Console

from tests.bench.test_pipeline_seeds import bench
from tests.runtime.runtime_testlib import SMALL
from tokenflow.bench.pipeline_staleness import COLLAPSE_MARGIN, _aggregate, curve, parse_staleness, print_table


def test_parse_staleness_always_includes_the_synchronous_reference():
    assert parse_staleness("4,1,2") == [0, 1, 2, 4]
    assert parse_staleness("0,8,8") == [0, 8]
    for bad in ("1,x", "-1,2", ""):
        with pytest.raises(ValueError, match="--staleness"):
            parse_staleness(bad)


def _run(seed: int, timing: int, accuracy: float) -> dict:
    return {"seed": seed, "timing": timing, "accuracy": accuracy, "train_wall_s": 10.0,
            "token_age_histogram": {"0": 3, "2": 1}, "weight_mean": 1.0, "weight_max": 5.0, "weight_min": 0.5,
            "tis_clipped_frac": 0.001, "entropy_first": 0.04, "entropy_min": 0.001 if accuracy < 0.5 else 0.02,
            "entropy_min_step": 20, "weight_max_at_low": 172.0, "token_age_at_low": 3.5}


def test_a_row_counts_the_runs_below_the_synchronous_minimum_as_collapsed():
    """Two timings of two seeds; one run fell below the synchronous minimum − margin."""
    runs = [_run(0, 0, 0.41), _run(0, 1, 0.977), _run(1, 0, 0.969), _run(1, 1, 0.926)]
    row = _aggregate(runs, collapse_below=0.953 - COLLAPSE_MARGIN)
    assert row["runs"] == 4 and row["accuracy_min"] == 0.41 and row["collapsed"] == 1
    assert row["accuracy_mean"] == pytest.approx((0.41 + 0.977 + 0.969 + 0.926) / 4)
    (c,) = row["at_collapse"]
    assert (c["seed"], c["timing"], c["accuracy"], c["entropy_min"], c["weight_max_at_low"]) == (0, 0, 0.41, 0.001, 172.0)
    assert _aggregate(runs, collapse_below=None)["collapsed"] == 0  # the synchronous row


def test_the_table_shows_each_row_and_each_collapsed_run():
    runs = [_run(0, 0, 0.41), _run(0, 1, 0.977), _run(1, 0, 0.969), _run(1, 1, 0.926)]
    row = {**_aggregate(runs, collapse_below=0.853), "k": 4, "corrections": "on", "gap": -0.1}
    console = Console(record=True, width=240)
    print_table({"seeds": [0, 1], "timings": 2, "steps": 20, "collapse_below": 0.853, "rows": [row]}, console)
    text = console.export_text()
    assert "2 seeds (0, 1) × 2 timings" in text and "0.821 ± 0.275" in text and "1 / 4" in text
    assert "collapsed: K=4 on seed 0 timing 0: accuracy 0.410; entropy 0.040 at step 1 → 0.001 at step 20" in text


def test_curve_finds_the_entropy_low_and_what_preceded_it(tmp_path):
    rows = [{"step": i, "loss/total": 0.0, "policy/entropy": e, "offpolicy/is_ratio_max": w,
             "offpolicy/is_ratio_mean": 1.0, "offpolicy/token_age_mean": a}
            for i, (e, w, a) in enumerate([(0.5, 2.0, 0.0), (0.4, 9.0, 3.0), (0.01, 30.0, 4.0), (0.2, 1.0, 1.0)], 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"step": 0, "eval/accuracy": 0.4}, *rows]))
    c = curve(tmp_path)
    assert (c["entropy_first"], c["entropy_min"], c["entropy_min_step"]) == (0.5, 0.01, 3)
    assert c["weight_max_at_low"] == 30.0 and c["token_age_at_low"] == pytest.approx(7 / 3)
    assert c["weight_max"] == 30.0


def test_bad_sweep_arguments_are_refused(tmp_path):
    r = bench("--staleness", "0,two", "--output-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "--staleness" in r.stderr
    r = bench("--staleness", "0,2", "--corrections", "maybe", "--output-dir", str(tmp_path / "b"))
    assert r.returncode == 2 and "--corrections" in r.stderr
    r = bench("--staleness", "0,2", "--timings", "0", "--output-dir", str(tmp_path / "c"))
    assert r.returncode == 2 and "--timings" in r.stderr


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


@pytest.mark.slow
def test_timings_repeat_each_asynchronous_run(tmp_path):
    """--timings 2: the synchronous run once, every asynchronous one twice (t0, t1); each row
    reports its minimum and how many of its runs collapsed."""
    out = tmp_path / "sw"
    r = bench("--staleness", "2", "--seeds", "1", "--timings", "2", "--corrections", "on", "--output-dir", str(out),
              *SMALL, "--run.steps", "2")
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads((out / "bench.json").read_text())
    assert result["timings"] == 2
    assert [(run["k"], run["timing"]) for run in result["runs"]] == [(0, 0), (2, 0), (2, 1)]
    assert (out / "on" / "K0" / "seed0" / "summary.json").is_file()
    assert all((out / "on" / "K2" / "seed0" / f"t{t}" / "summary.json").is_file() for t in (0, 1))
    sync, k2 = result["rows"]
    assert result["collapse_below"] == pytest.approx(sync["accuracy_min"] - 0.1)
    assert k2["runs"] == 2 and k2["accuracy_min"] == min(run["accuracy"] for run in result["runs"][1:])
    assert k2["collapsed"] == sum(run["accuracy"] < result["collapse_below"] for run in result["runs"][1:])
    assert "collapsed" in r.stdout and f"{k2['collapsed']:>4} / 2" in r.stdout
