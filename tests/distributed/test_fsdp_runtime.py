"""The local runtime with 2 FSDP trainer ranks: the synchronous run reproduces the plain loop,
and a run resumed from a sharded checkpoint (optimizer state gathered and re-sharded) continues
exactly."""

from __future__ import annotations

import pytest

from tests.runtime.runtime_testlib import ledger, small_config, step_rows
from tokenflow.runtime.launch import train
from tokenflow.model_store import resolve_model_path
from tokenflow.runtime.orchestrator.sync_loop import run_sync_loop

pytestmark = pytest.mark.slow  # a real run (or several processes) per test


def test_two_rank_runtime_matches_the_plain_loop_across_a_resume(tmp_path):
    args = ("--rollout.max_staleness", "0", "--run.checkpoint_every", "0", "--trainer.world_size", "2")
    train(small_config(*args, "--run.steps", "2"), tmp_path / "run")
    # Step 4's loss sees the weights step 3 made from the restored optimizer state.
    summary = train(small_config(*args, "--run.steps", "4"), tmp_path / "run", resume=True)
    assert summary["steps"] == 4
    rows = step_rows(tmp_path / "run")
    reference = run_sync_loop(small_config(*args, "--run.steps", "4"), resolve_model_path("default"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for got, want in zip(rows, reference):
        for key in ("reward/mean", "loss/total", "loss/policy", "optim/grad_norm"):
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
        assert got["perf/trainer_ranks"] == 2.0
    assert [r["prompt_ids"] for r in ledger(tmp_path / "run")] == [list(range(4 * k, 4 * k + 4)) for k in range(4)]
