"""A probe script in a fresh Python process (for settings that are process-wide, such as glibc's
malloc tuning): run from the repository root, its last stdout line read as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def run_probe(script: str, *args: str, timeout: float = 300) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
