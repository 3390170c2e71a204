"""Helpers for runtime tests: small runs of the real runtime on the shipped default model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tokenflow.config.loading import load_config
from tokenflow.config.root import TrainConfig
from tokenflow.metrics.sinks import read_jsonl

SMALL = [
    "--run.steps", "4", "--rollout.prompts_per_step", "4", "--rollout.group_size", "4",
    "--run.eval_limit", "24", "--metrics.progress", "false", "--metrics.sinks", '["jsonl"]',
    "--engine.threads", "1", "--trainer.threads", "1", "--engine.device", "cpu", "--trainer.device", "cpu",
    "--sampling.max_tokens", "64", "--trainer.lr", "3e-4",
]


def small_config(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, [*SMALL, *overrides])


def step_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss/total" in r]


def ledger(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "prompts.jsonl")


def start_cli(args: list[str], log: Path) -> subprocess.Popen:
    """`tokenflow train ...` in its own process group (so a test can kill the whole tree)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "tokenflow.cli.main", "train", *args],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def wait_until(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def workers(run_dir: Path) -> dict[str, int]:
    return json.loads((run_dir / "workers.json").read_text())


def kill_after_steps(run_dir: Path, worker: str, steps: int, killed: dict, timeout: float = 120) -> threading.Thread:
    """A started thread that SIGKILLs ``worker`` (its pid from workers.json) once ``steps`` steps
    are logged; ``killed`` gets its "pid" and "after_step" (the steps logged when it struck)."""

    def kill() -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if (run_dir / "metrics.jsonl").exists() and len(step_rows(run_dir)) >= steps:
                killed["pid"], killed["after_step"] = workers(run_dir)[worker], len(step_rows(run_dir))
                os.kill(killed["pid"], signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def first_checkpoint(run_dir: Path, steps: int, holds) -> Path | None:
    """The first whole checkpoint before the run's last step (``steps``) for which ``holds(ckpt)``."""
    from tokenflow.runtime.run.run_dir import RunDir, verify_checkpoint

    for ckpt in RunDir(run_dir).complete_checkpoints():
        if int(ckpt.name.split("_")[-1]) < steps and verify_checkpoint(ckpt) is None and holds(ckpt):
            return ckpt
    return None
