"""`tokenflow tinker` refuses to listen beyond this machine without a key, and serves with one."""

from __future__ import annotations

import os
import subprocess
import sys


def _tinker(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "tinker", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_binding_beyond_loopback_needs_a_key(tmp_path):
    run = _tinker("--host", "0.0.0.0", "--port", "0", "--root", str(tmp_path),
                  env={"TOKENFLOW_TINKER_API_KEY": ""})
    assert run.returncode == 2
    assert "--api-key" in run.stderr and "0.0.0.0" in run.stderr
    bad = _tinker("--max-models", "0", "--root", str(tmp_path))
    assert bad.returncode == 2 and "--max-models" in bad.stderr
