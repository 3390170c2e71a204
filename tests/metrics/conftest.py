"""Short real runs shared by the tests of this folder: one with JSONL, TensorBoard and the trace,
one with offline W&B."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.runtime_testlib import SMALL

STEPS, PROMPTS, GROUP, EVAL = 4, 4, 4, 24  # as in tests.runtime.runtime_testlib.SMALL


def _without(args: list[str], key: str) -> list[str]:
    i = args.index(key)
    return args[:i] + args[i + 2:]


def _run(root: Path, sinks: str, *extra: str, env: dict | None = None) -> Path:
    run_dir = root / "run"
    args = [*_without(SMALL, "--metrics.sinks"), "--metrics.sinks", sinks, *extra]
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", "--output-dir", str(run_dir),
                           *args], capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


@pytest.fixture(scope="session")
def traced_run(tmp_path_factory) -> Path:
    """`tokenflow train` (in its own process) with JSONL, TensorBoard and the trace: no W&B, so
    nothing here depends on it."""
    return _run(tmp_path_factory.mktemp("traced"), '["jsonl", "tensorboard"]', "--metrics.trace", "true",
                "--run.save_rollouts", "true")


@pytest.fixture(scope="session")
def wandb_run(tmp_path_factory) -> Path:
    """`tokenflow train` with JSONL and offline W&B (a declared test dependency: no skip)."""
    root = tmp_path_factory.mktemp("wandb")
    return _run(root, '["jsonl", "wandb"]', "--metrics.wandb_mode", "offline",
                env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(root / ".wandb-config"),
                     "WANDB_CACHE_DIR": str(root / ".wandb-cache")})
