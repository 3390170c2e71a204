"""A small real `tokenflow bench pipeline` (sync and async, traced), shared by the report tests."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runtime.runtime_testlib import SMALL


@dataclass
class Bench:
    root: Path
    stdout: str

    @property
    def sync(self) -> Path:
        return self.root / "sync"

    @property
    def async_(self) -> Path:
        return self.root / "async"


def tokenflow(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def bench(tmp_path_factory) -> Bench:
    root = tmp_path_factory.mktemp("bench") / "pipeline"
    proc = tokenflow("bench", "pipeline", "--output-dir", str(root), *SMALL, "--metrics.trace", "true",
                     timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Bench(root, proc.stdout)
