"""The metric files of a real run: TensorBoard and W&B hold what metrics.jsonl holds."""

from __future__ import annotations

import json

import pytest

from tests.metrics.conftest import STEPS
from tests.metrics.test_sinks import tensorboard_scalars
from tests.metrics.wandb_testlib import history
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.report.run_data import load_run


def step_rows(run_dir) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss/total" in r]


@pytest.mark.slow
def test_tensorboard_of_a_real_run_matches_metrics_jsonl(traced_run):
    scalars = tensorboard_scalars(traced_run / "tensorboard")
    rows = step_rows(traced_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for key in ("loss/total", "reward/mean", "offpolicy/token_age_mean", "buffer/fill",
                "perf/engine_tokens_per_s", "perf/trainer_idle_frac", "time/wall_s"):
        assert [s for s, _ in scalars[key]] == [r["step"] for r in rows], key
        assert [v for _, v in scalars[key]] == pytest.approx([r[key] for r in rows], rel=1e-5, abs=1e-6), key
    evals = [(r["step"], r["eval/accuracy"]) for r in read_jsonl(traced_run / "metrics.jsonl") if "eval/accuracy" in r]
    assert [s for s, _ in scalars["eval/accuracy"]] == [0, STEPS] == [s for s, _ in evals]
    assert [v for _, v in scalars["eval/accuracy"]] == pytest.approx([v for _, v in evals])
    namespaces = {k.split("/")[0] for k in scalars}
    assert {"reward", "loss", "policy", "offpolicy", "rollout", "buffer", "sync", "perf"} <= namespaces


@pytest.mark.slow
def test_wandb_offline_files_of_a_real_run(wandb_run):
    (f,) = (wandb_run / "wandb").glob("offline-run-*/run-*.wandb")
    rows = {r["_step"]: r for r in history(f)}
    for r in step_rows(wandb_run):
        assert rows[r["step"]]["reward/mean"] == pytest.approx(r["reward/mean"])
        assert rows[r["step"]]["loss/total"] == pytest.approx(r["loss/total"])
    summary = json.loads((wandb_run / "summary.json").read_text())
    assert rows[STEPS]["eval/accuracy"] == pytest.approx(summary["final_accuracy"])


@pytest.mark.slow
def test_token_age_histogram_in_summary_matches_the_rollouts(traced_run):
    """summary.json's histogram (the buffer's counts) = ages recomputed from rollouts.jsonl."""
    run = load_run(traced_run)
    from_summary, source = run.age_histogram
    assert source == "summary.json"
    run.summary.pop("token_age_histogram")
    del run.__dict__["age_histogram"]
    from_rollouts, source = run.age_histogram
    assert source == "rollouts.jsonl"
    assert from_rollouts == from_summary
    tokens = sum(len(r["completion_ids"]) for r in read_jsonl(traced_run / "rollouts.jsonl"))
    assert sum(from_summary.values()) == tokens
    assert run.last("buffer/token_age_mean") == pytest.approx(
        sum(a * c for a, c in from_summary.items()) / tokens)
