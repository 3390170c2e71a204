"""run.final_checkpoint = false: a smoke run ends without its final checkpoint (the periodic ones
are written), its summary is written, and a resume continues from the last periodic checkpoint."""

from __future__ import annotations

import json

import pytest

from tests.runtime.runtime_testlib import ledger, small_config, step_rows
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.launch import train

pytestmark = pytest.mark.slow  # real runs


def test_a_run_without_its_final_checkpoint_resumes_from_the_last_periodic_one(tmp_path):
    run = tmp_path / "run"
    cfg = small_config("--run.steps", "3", "--run.checkpoint_every", "2", "--run.final_checkpoint", "false")
    summary = train(cfg, run)
    assert summary["steps"] == 3 and summary["final_accuracy"] is not None
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    # Not finished for --resume: it trains step 3 again from step 2's checkpoint.
    resumed = train(cfg, run, resume=True)
    assert resumed["steps"] == 3
    assert [r["step"] for r in step_rows(run)] == [1, 2, 3] and [r["step"] for r in ledger(run)] == [1, 2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    # samples.jsonl too: the first run's step 3 and final evaluation were dropped, then written again.
    samples = read_jsonl(run / "samples.jsonl")
    assert [r["step"] for r in samples if r["kind"] == "train"] == [1, 1, 2, 2, 3, 3]
    assert [r["step"] for r in samples if r["kind"] == "eval"] == [0] * 24 + [3] * 24


def test_the_final_checkpoint_is_written_by_default(tmp_path):
    run = tmp_path / "run"
    train(small_config("--run.steps", "2", "--run.checkpoint_every", "0"), run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
