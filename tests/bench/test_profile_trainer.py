"""benchmarks/profile_trainer.py runs on the default workload and names every phase of a step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_profile_prints_the_phases_of_a_step():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_trainer.py"), "--steps", "1", "--rows", "5"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "steps 1:" in out and "sequences/step" in out and "skipped" in out
    for phase in ("1 sequences", "3 advantages", "4 pack micro-batches", "5a forward", "5b loss terms", "6 optimizer"):
        assert phase in out, phase
    assert "aten::mm" in out  # the operator table
    assert "first/later" in out and "of the floor" in out  # issue 38's two trainer figures
