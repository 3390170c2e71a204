"""Asynchronous training overlaps generation and training, read from measured idle fractions.

Over a training window W the engine is busy (1 − engine_idle)·W and the trainer
(1 − trainer_idle)·W, so both are busy at once for at least
(1 − engine_idle − trainer_idle)·W: that lower bound is the overlap measured here, not a wall
time (which moves with the machine's load). Synchronous training alternates the two, so the bound
is ≤ 0 there; at K = 2 on the default workload (generation the bottleneck) the trainer's whole
step hides under generation.
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


def test_async_k2_overlaps_generation_and_training(tmp_path):
    s = run(tmp_path / "async", "--rollout.max_staleness", "2")
    # Measured (12 steps, the 2-core AVX2 machine, session 35): K = 2 read 0.175, 0.227 and 0.19
    # in three runs alone; K = 1 (once 0.2–0.3) read 0.047–0.147 in five runs alone and 0.069,
    # 0.096 in two whole suites: one step of slack no longer hides the trainer's step reliably,
    # two do. Below 0.1 the trainer no longer hides its steps under generation (the engine idles
    # through them); taking turns reads < 0.05 (the test below).
    assert overlap(s) >= 0.1, (s["engine_idle_frac"], s["trainer_idle_frac"])


def test_the_measure_reads_no_overlap_when_the_two_take_turns(tmp_path):
    s = run(tmp_path / "sync", "--rollout.max_staleness", "0")
    assert overlap(s) < 0.05, (s["engine_idle_frac"], s["trainer_idle_frac"])
