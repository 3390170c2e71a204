"""The embedded default run learns: held-out greedy accuracy rises well above the warm start."""

from __future__ import annotations

import pytest

from tokenflow.config.loading import load_config
from tokenflow.config.root import TrainConfig
from tokenflow.runtime.launch import train
from tokenflow.config.presets import default_config_path

pytestmark = pytest.mark.slow  # a real run (or several processes) per test


def test_default_run_learns_to_carry(tmp_path):
    cfg = load_config(TrainConfig, default_config_path(),
                      ["--run.steps", "20", "--run.checkpoint_every", "0", "--metrics.progress", "false",
                       "--metrics.sinks", '["jsonl"]'])
    summary = train(cfg, tmp_path / "run")
    assert 0.2 <= summary["baseline_accuracy"] <= 0.6  # the shipped warm start leaves room to learn
    assert summary["final_accuracy"] >= summary["baseline_accuracy"] + 0.2
