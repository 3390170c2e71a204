"""Killed runs resume exactly; failing reward functions and dying workers are reported, not hidden."""

from __future__ import annotations

import pytest
import json
import os
import signal
import textwrap

from tests.runtime.runtime_testlib import SMALL, ledger, small_config, start_cli, step_rows, wait_until, workers
from tokenflow.runtime.launch import train

pytestmark = pytest.mark.slow  # a real run (or several processes) per test


def test_sigkill_then_resume_neither_loses_nor_repeats_a_prompt(tmp_path):
    run = tmp_path / "run"
    args = [*SMALL, "--output-dir", str(run), "--run.steps", "16", "--run.checkpoint_every", "2",
            "--rollout.max_staleness", "2"]
    proc = start_cli(args, tmp_path / "first.log")
    try:
        wait_until(lambda: len(step_rows(run)) >= 5 if (run / "metrics.jsonl").exists() else False,
                   240, "five steps", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator and every worker, no goodbyes
        proc.wait()
    steps_before = len(step_rows(run))
    assert steps_before < 16, "the run finished before it could be killed"
    proc = start_cli(["--resume", str(run), "--metrics.progress", "false"], tmp_path / "second.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 16
    assert [r["step"] for r in step_rows(run)] == list(range(1, 17))  # each step logged once
    consumed = [p for line in ledger(run) for p in line["prompt_ids"]]
    assert [line["step"] for line in ledger(run)] == list(range(1, 17))
    assert len(consumed) == len(set(consumed)) == 16 * 4  # nothing repeated
    everything = sorted(consumed + summary["in_flight_prompt_ids"])
    assert everything == list(range(len(everything)))  # nothing lost


def test_a_reward_function_that_raises_fails_samples_not_the_run(tmp_path):
    (tmp_path / "flaky_reward.py").write_text(textwrap.dedent("""
        from tokenflow.tasks.arithmetic import arithmetic_reward
        def reward(prompt, completion, example):
            if example["a"] % 3 == 0:
                raise RuntimeError("cannot score multiples of three")
            return arithmetic_reward(prompt, completion, example)
    """))
    # The arithmetic task, but scored by the flaky function: a JSONL dump of its prompts.
    from tokenflow.tasks.arithmetic import ArithmeticTask

    t = ArithmeticTask()
    rows = [{"prompt": p.text, **p.example} for p in (t.train_prompt(i) for i in range(64))]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small_config("--task.name", "dataset", "--task.train_path", str(data),
                       "--task.reward", f"{tmp_path / 'flaky_reward.py'}:reward",
                       "--run.steps", "2", "--rollout.max_staleness", "1", "--run.checkpoint_every", "0")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    rows = step_rows(tmp_path / "run")
    assert any(r["reward/failed_frac"] > 0 for r in rows)
    assert all(r["reward/failed_frac"] < 1 for r in rows)


def test_a_dead_engine_stops_the_run_with_its_name(tmp_path):
    run = tmp_path / "run"
    args = [*SMALL, "--output-dir", str(run), "--run.steps", "50", "--runtime.max_worker_restarts", "0"]
    proc = start_cli(args, tmp_path / "log")
    try:
        wait_until(lambda: (run / "metrics.jsonl").exists() and len(step_rows(run)) >= 1, 240, "a step", proc)
        os.kill(workers(run)["engine"], signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "log").read_text()
    assert "engine process" in out and "died" in out and "--resume" in out


def test_lora_run_resumes_exactly_from_its_adapters(tmp_path):
    """A LoRA run: engines train on merged weights; a resume rebuilds the policy from the base
    model plus the checkpoint's adapters, and (synchronous, same seed) steps 3-4 come out as in
    a run that was never interrupted."""
    common = ("--trainer.lora_rank", "8", "--trainer.lora_alpha", "16", "--trainer.lr", "3e-3",
              "--rollout.max_staleness", "0", "--run.checkpoint_every", "2")
    whole = train(small_config(*common, "--run.steps", "4"), tmp_path / "whole")
    assert whole["steps"] == 4
    train(small_config(*common, "--run.steps", "2"), tmp_path / "split")
    resumed = train(small_config(*common, "--run.steps", "4"), tmp_path / "split", resume=True)
    assert resumed["steps"] == 4
    a, b = step_rows(tmp_path / "whole"), step_rows(tmp_path / "split")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for key in ("loss/total", "reward/mean"):
            assert abs(ra[key] - rb[key]) < 1e-6, (ra["step"], key)
    assert a[-1]["loss/total"] != a[0]["loss/total"]  # the adapters did train
