"""The processes `tokenflow bench chaos` starts, watches and kills (both modes: resume, ``--heal``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

TOLERANCE = 1e-6
"""Final weights against an unkilled run: about one float32 ulp apart (see bench/chaos.py)."""


def start_train(args: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "a") as f:
        f.write(f"\n==== tokenflow train {' '.join(args)}\n")
    return subprocess.Popen([sys.executable, "-m", "tokenflow.cli.main", "train", *args], env=env,
                            stdout=open(log_path, "a"), stderr=subprocess.STDOUT, start_new_session=True)


def children(pid: int) -> list[int]:
    """Spawned children of ``pid`` (from /proc): the scorer workers among them."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"spawn_main" in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def steps_done(run_dir: Path) -> int:
    try:
        return sum(1 for line in open(run_dir / "prompts.jsonl") if line.strip())
    except OSError:
        return 0


def wait_until(pred, timeout: float, proc: subprocess.Popen) -> bool:
    """True once ``pred()``; False if the process exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


