"""Asynchronous training overlaps generation and training, read from measured idle fractions.

Over a training window W the engine is busy (1 − engine_idle)·W and the trainer
(1 − trainer_idle)·W, so both are busy at once for at least
(1 − engine_idle − trainer_idle)·W: that lower bound is the overlap measured here, not a wall
time (which moves with the machine's load). Synchronous training alternates the two, so the bound
is ≤ 0 there; at K = 1 on the default workload (generation the bottleneck) the trainer's whole
step should hide under generation.
"""

from __future__ import annotations

import pytest

from tokenflow.config.loading import load_config
from tokenflow.config.presets import default_config_path
from tokenflow.config.root import TrainConfig
from tokenflow.runtime.launch import train

pytestmark = pytest.mark.slow  # two real runs

RUN = ["--run.steps", "12", "--run.checkpoint_every", "0", "--run.eval_limit", "32", "--metrics.progress", "false",
       "--metrics.sinks", '["jsonl"]']


def overlap(summary: dict) -> float:
    """Lower bound on the share of the training window in which engine and trainer were both busy."""
    return 1.0 - summary["engine_idle_frac"] - summary["trainer_idle_frac"]


def run(folder, *overrides: str) -> dict:
    return train(load_config(TrainConfig, default_config_path(), [*RUN, *overrides]), folder)


def test_async_k1_overlaps_generation_and_training(tmp_path):
    s = run(tmp_path / "async", "--rollout.max_staleness", "1")
    # Measured (12 steps, 2-core machine): 0.2–0.3. Below 0.1 the trainer no longer hides its
    # steps under generation (the engine idles through them).
    assert overlap(s) >= 0.1, (s["engine_idle_frac"], s["trainer_idle_frac"])


def test_the_measure_reads_no_overlap_when_the_two_take_turns(tmp_path):
    s = run(tmp_path / "sync", "--rollout.max_staleness", "0")
    assert overlap(s) < 0.05, (s["engine_idle_frac"], s["trainer_idle_frac"])
