"""A short real run with every sink and the trace on, shared by the tests of this folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.helpers import SMALL

STEPS, PROMPTS, GROUP, EVAL = 4, 4, 4, 24  # as in tests.runtime.helpers.SMALL


def _without(args: list[str], key: str) -> list[str]:
    i = args.index(key)
    return args[:i] + args[i + 2:]


@pytest.fixture(scope="session")
def traced_run(tmp_path_factory) -> Path:
    """`tokenflow train` (in its own process) with JSONL, TensorBoard, offline W&B and the trace."""
    pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("traced")
    run_dir = root / "run"
    args = [*_without(SMALL, "--metrics.sinks"), "--metrics.sinks", '["jsonl", "tensorboard", "wandb"]',
            "--metrics.wandb_mode", "offline", "--metrics.trace", "true", "--run.save_rollouts", "true"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_CONFIG_DIR": str(root / ".wandb-config"), "WANDB_CACHE_DIR": str(root / ".wandb-cache")}
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", "--output-dir", str(run_dir),
                           *args], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir
