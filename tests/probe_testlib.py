"""A probe script in a fresh Python process (for settings that are process-wide, such as glibc's
malloc tuning, or what a process prints at exit): run from the repository root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def run_script(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The finished process (text stdout and stderr), which must have exited 0."""
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_probe(script: str, *args: str, timeout: float = 300) -> dict:
    """The script's last stdout line, read as JSON."""
    return json.loads(run_script(script, *args, timeout=timeout).stdout.strip().splitlines()[-1])
