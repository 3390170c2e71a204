"""`tokenflow bench pipeline --seeds N`: one sync/async pair per seed, then mean and spread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.runtime_testlib import SMALL

ROOT = Path(__file__).parents[2]


def bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "bench", "pipeline", *args],
                          capture_output=True, text=True, env=env, timeout=900, check=False)


@pytest.mark.slow
def test_two_seeds_print_mean_and_spread_of_both_modes(tmp_path):
    out = tmp_path / "bp"
    r = bench("--seeds", "2", "--output-dir", str(out), *SMALL, "--run.steps", "2", "--run.seed", "5",
              "--runtime.lend_trainer_threads", "true")  # set: kept (off unless set, next test)
    assert r.returncode == 0, r.stderr[-4000:]
    text = r.stdout
    assert "seed 5: steps 2" in text and "seed 6: steps 2" in text
    assert "over 2 seeds (5, 6)" in text
    for line in ("held-out accuracy  sync  (K=0)", "held-out accuracy  async (K=1)", "accuracy gap (async − sync)",
                 "async / sync", "ideal max(G,T)/(G+T)", "(async / sync) ÷ ideal"):
        assert line in text, line
    summary = json.loads((out / "bench.json").read_text())
    assert summary["seeds"] == [5, 6]
    per_seed = summary["per_seed"]
    for seed, result in zip((5, 6), per_seed):
        folder = out / f"seed{seed}"
        assert json.loads((folder / "bench.json").read_text()) == result
        for mode in ("sync", "async"):
            run = json.loads((folder / mode / "summary.json").read_text())
            assert run["max_staleness"] == (0 if mode == "sync" else 1)
            assert result[f"{mode}_accuracy"] == run["final_accuracy"]
            cfg = (folder / mode / "config.toml").read_text()
            assert f"seed = {seed}" in cfg and "lend_trainer_threads = true" in cfg
    accs = [s["async_accuracy"] for s in per_seed]
    assert summary["async_accuracy"]["mean"] == pytest.approx(sum(accs) / 2)
    assert summary["async_accuracy"]["sd"] == pytest.approx(abs(accs[0] - accs[1]) / 2 ** 0.5)
    assert summary["accuracy_gap"] == pytest.approx(summary["async_accuracy"]["mean"] - summary["sync_accuracy"]["mean"])
    ratio = summary["async_over_sync"]["mean"] / summary["ideal_async_over_sync"]["mean"]
    assert summary["wall_ratio_over_ideal"] == pytest.approx(ratio)
    assert f"{summary['async_accuracy']['mean']:.3f} ± {summary['async_accuracy']['sd']:.3f}" in text


@pytest.mark.slow
def test_one_seed_keeps_the_single_pair_layout(tmp_path):
    out = tmp_path / "bp"
    r = bench("--output-dir", str(out), *SMALL, "--run.steps", "2", "--json")
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads(r.stdout)
    assert (out / "sync" / "summary.json").is_file() and (out / "async" / "summary.json").is_file()
    assert result["seed"] == 0 and 0.0 <= result["async_token_age_over_k_frac"] <= 1.0
    assert json.loads((out / "bench.json").read_text()) == result
    # Not set: both runs keep their own threads (the ideal assumes each side as fast in both modes).
    assert result["lend_trainer_threads"] is False
    for mode in ("sync", "async"):
        assert "lend_trainer_threads = false" in (out / mode / "config.toml").read_text()


@pytest.mark.slow
def test_seeds_must_be_positive_and_not_with_a_teacher(tmp_path):
    r = bench("--seeds", "0", "--output-dir", str(tmp_path / "a"))
    assert r.returncode == 2 and "--seeds" in r.stderr
    r = bench("--seeds", "2", "--teacher", "default", "--output-dir", str(tmp_path / "b"))
    assert r.returncode == 2 and "--teacher" in r.stderr
