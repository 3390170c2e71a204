"""``runtime.elastic`` takes an engine out while the engines wait on the trainer (one Ray node,
shared-memory sync); the adding side is in test_elastic.py."""

from __future__ import annotations

import pytest

from tests.ray.elastic_testlib import exactly_once, run_config
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.launch import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_runtime_elastic_removes_an_engine_while_the_engines_wait_on_the_trainer(tmp_path, ray_cluster):
    # Four passes over every batch: the trainer is the bottleneck, two engines wait on it.
    run = tmp_path / "run"
    steps = 12
    cfg = run_config("--runtime.num_engines", "2", "--runtime.elastic", "true", "--runtime.max_engines", "2",
                     "--runtime.elastic_patience", "2", "--runtime.ray_engine_cpus", "0.5",
                     # Each window's waits, measured with a busy loop on the other core (CI runs
                     # tests side by side): the trainer 1-7% after its first, the engines 27-65%
                     # before the removal. At the default 0.5 a CI run decided nothing; 0.2 leaves
                     # a margin on both sides.
                     "--runtime.elastic_idle_frac", "0.2",
                     "--trainer.epochs", "4", "--trainer.skip_zero_advantage", "false", "--run.steps", str(steps))
    summary = train(cfg, run)
    exactly_once(run, summary, steps)
    events = read_jsonl(run / "engines.jsonl")
    decided = [e for e in events if e["event"] == "decided"]
    assert decided and decided[0]["op"] == "remove" and "the engines waited on the trainer" in decided[0]["why"], \
        decided
    removed = next(e for e in events if e["event"] == "removed")
    assert removed["why"] == decided[0]["why"] and summary["engines"]["removed"] == [removed["engine"]]
    assert len(summary["engines"]["final"]) == 1 and not summary["engines"]["added"]
    # Whatever it held went to the other engine and was trained once, from there: all of it, unless
    # the removal came so late that the run ended first (then what was not trained is in flight,
    # which exactly_once checked).
    held = next(e["groups"] for e in events if e["event"] == "readmitted")
    again = [r for r in read_jsonl(run / "rollouts.jsonl") if r["group_id"] in held]
    trained = {r["group_id"] for r in again}
    assert sorted(r["group_id"] for r in again) == sorted(g for g in trained for _ in range(4))
    assert trained == set(held) or removed.get("at_run_end"), (held, trained, removed)
    assert {r["engine"] for r in again} <= set(summary["engines"]["final"])
    # Nothing from the removed engine after it left: every rollout it made was generated before.
    late = [r for r in read_jsonl(run / "rollouts.jsonl") if r["engine"] == removed["engine"]
            and min(r["versions"]) > removed["version"]]
    assert not late
    print(f"runtime.elastic: {[(e['op'], e['step'], e['why']) for e in decided]}; {removed['engine']} removed "
          f"at step {removed['step']} ({len(held)} groups re-sent)")
