"""What the elastic-engine tests share: the run's config and the checks of exactly-once
accounting and of an added engine's versions."""

from __future__ import annotations

from tests.runtime.runtime_testlib import ledger, small_config, step_rows
from tokenflow.metrics.sinks import read_jsonl


def run_config(*overrides: str):
    return small_config("--runtime.backend", "ray", "--rollout.max_staleness", "2", "--run.checkpoint_every", "0",
                        "--run.save_rollouts", "true", "--runtime.worker_timeout_s", "60",
                        "--runtime.ray_engine_cpus", "1", "--runtime.ray_trainer_cpus", "1",
                        # One group at a time per engine: the engines are the bottleneck, so each
                        # holds queued groups whenever it is removed (and the trainer waits on them).
                        "--engine.max_num_seqs", "4", *overrides)


def exactly_once(run, summary, steps: int) -> None:
    """Every admitted prompt was consumed once, or is still in flight at the end."""
    assert summary["steps"] == steps
    rows = step_rows(run)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["rollout/count"] == 16 for r in rows)  # whole groups only
    consumed = [p for line in ledger(run) for p in line["prompt_ids"]]
    assert len(consumed) == len(set(consumed)) == steps * 4
    everything = sorted(consumed + summary["in_flight_prompt_ids"])
    assert everything == list(range(len(everything)))


def joined_with_its_versions(run, name: str) -> tuple[dict, set]:
    """The engine's "joined" record and the versions on its trained tokens, each one it loaded
    (no earlier than the trainer's version when it joined)."""
    events = read_jsonl(run / "engines.jsonl")
    joined = next(e for e in events if e["event"] == "joined" and e["engine"] == name)
    loaded = [e["version"] for e in events if e["event"] == "loaded" and e["engine"] == name]
    assert loaded and min(loaded) >= joined["version"] and loaded == sorted(loaded)
    mine = [r for r in read_jsonl(run / "rollouts.jsonl") if r["engine"] == name]
    assert mine, f"{name} generated nothing that was trained"
    versions = {v for r in mine for v in r["versions"]}
    assert versions <= set(loaded), (versions, loaded)
    assert min(versions) >= joined["version"] >= 1
    return joined, versions
