"""DAPO's dynamic sampling and overlong shaping in real runs of the shipped model.

* Synchronous (max_staleness 0): the runtime, where groups are dropped one by one as they are
  scored and admission refills their slots, trains on exactly what the plain loop trains on (it
  tops each step up with the next prompts), step for step.
* Every trained group carries reward variance, every prompt is accounted for exactly once
  (trained, dropped or still in flight), and the metrics count the drops.
"""

from __future__ import annotations

import pytest

from tests.runtime.runtime_testlib import ledger, small_config, step_rows
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.launch import train
from tokenflow.runtime.orchestrator.sync_loop import run_sync_loop

pytestmark = pytest.mark.slow  # a real run (or several processes) per test

SHAPING = ["--algorithm.dynamic_sampling", "true", "--algorithm.overlong_buffer_tokens", "32",
           "--algorithm.overlong_penalty", "0.5", "--run.save_rollouts", "true", "--run.checkpoint_every", "0"]


def check_accounting(run, summary) -> list[dict]:
    entries = ledger(run)
    trained = [p for e in entries for p in e["prompt_ids"]]
    dropped = [p for e in entries for p in e["dropped_prompt_ids"]]
    seen = trained + dropped + summary["in_flight_prompt_ids"]
    assert sorted(seen) == list(range(len(seen)))  # each prompt of the stream exactly once
    by_group: dict[tuple, set] = {}
    for r in read_jsonl(run / "rollouts.jsonl"):
        by_group.setdefault((r["step"], r["group_id"]), set()).add(r["reward"])
    assert all(len(rewards) > 1 for rewards in by_group.values())  # no flat group was trained
    rows = step_rows(run)
    assert [r["rollout/dropped_groups"] for r in rows] == [float(len(e["dropped_prompt_ids"])) for e in entries]
    assert rows[-1]["buffer/groups_dropped"] == len(dropped) > 0
    return rows


def test_synchronous_runtime_drops_and_refills_like_the_plain_loop(tmp_path, default_model):
    cfg = small_config("--rollout.max_staleness", "0", "--run.steps", "3", *SHAPING)
    summary = train(cfg, tmp_path / "run")
    rows = check_accounting(tmp_path / "run", summary)
    reference = run_sync_loop(cfg, default_model)
    for got, want in zip(rows, reference, strict=True):
        assert got["rollout/dropped_groups"] == want["rollout/dropped_groups"]
        assert got["reward/mean"] == pytest.approx(want["reward/mean"], abs=1e-6)
        assert got["reward/overlong_penalty_mean"] == pytest.approx(want["reward/overlong_penalty_mean"], abs=1e-6)
        assert got["loss/total"] == pytest.approx(want["loss/total"], abs=1e-6)
        assert got["reward/zero_signal_group_frac"] == 0.0
    assert any(r["rollout/overlong_frac"] > 0 for r in rows)  # the penalty met some completions
    # Each step's batch is the next prompts of the stream that were not dropped, in order.
    entries = ledger(tmp_path / "run")
    stream = sorted(p for e in entries for p in e["prompt_ids"] + e["dropped_prompt_ids"])
    assert [p for e in entries for p in e["prompt_ids"]] == [p for p in stream if p not in
                                                             {d for e in entries for d in e["dropped_prompt_ids"]}]


def test_asynchronous_run_accounts_for_every_prompt(tmp_path):
    summary = train(small_config("--rollout.max_staleness", "2", "--run.steps", "4", *SHAPING), tmp_path / "run")
    assert summary["steps"] == 4
    check_accounting(tmp_path / "run", summary)
