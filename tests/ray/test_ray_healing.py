"""A trainer actor killed in a Ray run is replaced while the run goes on (``runtime.max_worker_restarts``):
new trainer actors start from the last checkpoint, replay the batches since, and the run ends by
itself with every step logged once, every prompt consumed once, and the weights of a run nothing
happened to."""

from __future__ import annotations

import json

import pytest

from tests.runtime.runtime_testlib import kill_after_steps, ledger, small_config, step_rows, workers
from tokenflow.bench.chaos_checks import weights_diff
from tokenflow.bench.chaos_procs import TOLERANCE
from tokenflow.runtime.launch import train

pytestmark = pytest.mark.slow  # two real runs

STEPS = 8
# Synchronous, so the healed run must end with the unkilled run's weights; a checkpoint every 2
# steps, so the new trainer restores one and replays the step after it.
ARGS = ("--rollout.max_staleness", "0", "--run.steps", str(STEPS), "--run.checkpoint_every", "2",
        "--run.keep_checkpoints", "10", "--runtime.restart_window_s", "0")


@pytest.mark.timeout(240)  # a healed trainer at the wrong version would leave the engines waiting
def test_a_killed_trainer_actor_is_replaced_and_the_run_goes_on(tmp_path, ray_cluster):
    run = tmp_path / "healed"
    killed = {}
    killer = kill_after_steps(run, "trainer", 3, killed)
    summary = train(small_config(*ARGS, "--runtime.backend", "ray"), run)
    killer.join()
    assert killed and killed["after_step"] < STEPS, "the run ended before the trainer could be killed"
    assert summary["steps"] == STEPS
    # Every step logged once (the replayed ones are not logged again), whole groups only.
    rows = step_rows(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and all(r["rollout/count"] == 16 for r in rows)
    # Every prompt consumed once.
    consumed = [p for line in ledger(run) for p in line["prompt_ids"]]
    assert len(consumed) == len(set(consumed)) == STEPS * 4
    # The replacement, as the run recorded it: a new trainer process from a checkpoint, ready.
    heal = [json.loads(line) for line in (run / "heal.jsonl").read_text().splitlines()]
    replaced = [h for h in heal if h["worker"] == "trainer" and h["event"] == "replaced"]
    assert len(replaced) == 1 and replaced[0]["pid"] != killed["pid"]
    assert replaced[0]["restored_step"] in (0, 2, 4, 6) and replaced[0]["restored_step"] <= killed["after_step"]
    assert any(h["worker"] == "trainer" and h["event"] == "ready" for h in heal)
    assert workers(run)["trainer"] == replaced[0]["pid"]
    # The weights of a Ray run nothing happened to (about one float32 ulp: chaos_procs.TOLERANCE).
    reference = tmp_path / "reference"
    train(small_config(*ARGS, "--runtime.backend", "ray"), reference)
    last = f"checkpoints/step_{STEPS:06d}"
    assert weights_diff(run / last, reference / last) <= TOLERANCE
