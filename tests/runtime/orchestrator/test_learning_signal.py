"""Loud warnings when a run cannot learn: no reward variance, every sample failed, entropy collapse."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tokenflow.config.loading import load_config
from tokenflow.config.root import TrainConfig
from tokenflow.runtime.orchestrator.learning_signal import ENTROPY_COLLAPSE_RATIO, SignalWatch

from tests.runtime.runtime_testlib import small_config

ROOT = Path(__file__).parents[3]
HEALTHY = {"reward/failed_frac": 0.0, "reward/zero_signal_group_frac": 0.4, "reward/mean": 0.5,
           "policy/entropy": 0.03}


def watch(**overrides) -> SignalWatch:
    return SignalWatch(load_config(TrainConfig, None, {"metrics.no_signal_warn_steps": 3, **overrides}))


def test_equal_rewards_warn_once_after_n_steps_naming_the_knobs(caplog):
    w = watch()
    flat = {**HEALTHY, "reward/zero_signal_group_frac": 1.0, "reward/mean": 0.0}
    assert w.observe(1, flat) == [] and w.observe(2, flat) == []
    (text,) = w.observe(3, flat)
    for knob in ("rollout.group_size (now 8", "sampling.temperature (now 1)", "partial credit", "doesnt-learn.md"):
        assert knob in text
    assert w.observe(4, flat) == []  # once per run
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_a_step_with_signal_resets_the_count():
    w = watch()
    flat = {**HEALTHY, "reward/zero_signal_group_frac": 1.0}
    for step, m in enumerate([flat, flat, HEALTHY, flat, flat], 1):
        assert w.observe(step, m) == []


def test_every_sample_failed_warns_at_once():
    (text,) = watch().observe(1, {**HEALTHY, "reward/failed_frac": 1.0})
    assert "failed scoring" in text and "runtime.score_timeout_s = 10 s" in text
    assert watch().observe(1, {**HEALTHY, "reward/failed_frac": 0.9}) == []


def test_entropy_collapse_relative_to_the_first_step():
    w = watch()
    w.observe(1, HEALTHY)
    low = {**HEALTHY, "policy/entropy": 0.03 * ENTROPY_COLLAPSE_RATIO * 0.9}
    just_above = {**HEALTHY, "policy/entropy": 0.03 * ENTROPY_COLLAPSE_RATIO * 1.1}
    assert [w.observe(s, just_above) for s in (2, 3, 4)] == [[], [], []]
    assert w.observe(5, low) == [] and w.observe(6, low) == []
    (text,) = w.observe(7, low)
    assert "entropy collapsed" in text and "algorithm.clip_high" in text and "trainer.lr" in text


def test_steps_that_trained_no_sequence_measured_no_entropy():
    """Every sequence skipped (all advantages 0): policy/entropy is 0 by default, not a collapse."""
    w = watch()
    w.observe(1, HEALTHY)
    skipped = {**HEALTHY, "reward/zero_signal_group_frac": 0.9, "policy/entropy": 0.0, "perf/sequences": 0.0}
    assert [w.observe(s, skipped) for s in (2, 3, 4, 5)] == [[], [], [], []]
    (text,) = [t for s in (6, 7, 8) for t in w.observe(s, {**skipped, "perf/sequences": 3.0})]
    assert "entropy collapsed" in text


def test_zero_turns_the_warnings_off():
    w = watch(**{"metrics.no_signal_warn_steps": 0})
    assert w.observe(1, {**HEALTHY, "reward/failed_frac": 1.0}) == []


@pytest.mark.slow
def test_a_run_whose_reward_never_varies_warns(tmp_path, caplog, monkeypatch):
    """A real run on an exact-match-like reward that is always 0: the warning lands mid-run."""
    (tmp_path / "never.py").write_text("def score(prompt, completion, example):\n    return 0.0\n")
    from tokenflow.runtime.launch import train

    cfg = small_config("--run.steps", "3", "--metrics.no_signal_warn_steps", "2", "--task.name", "dataset",
                       "--task.train_path", str(ROOT / "examples/custom_task/sums.jsonl"),
                       "--task.reward", f"{tmp_path / 'never.py'}:score")
    with caplog.at_level(logging.WARNING, logger="tokenflow"):
        train(cfg, tmp_path / "run")
    warnings = [r.getMessage() for r in caplog.records if "CANNOT LEARN" in r.getMessage()]
    assert len(warnings) == 1 and "for 2 steps every group's samples got the same reward (mean reward 0.000)" in warnings[0]
