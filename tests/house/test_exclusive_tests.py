"""The suite's lock for tests that check the whole machine (tests/conftest.py): on two xdist
workers, a test marked ``exclusive`` never runs beside another test, while the others do run two
at a time. Checked on a small generated suite whose tests log when they ran."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SUITE = textwrap.dedent("""
    import os, time
    import pytest

    def _log(name):
        start = time.time()
        time.sleep(0.4)
        with open(os.environ["LOCK_LOG"], "a") as f:
            f.write(f"{name} {start} {time.time()}\\n")

    @pytest.mark.parametrize("i", range(8))
    def test_before(i):
        _log(f"shared-a{i}")

    @pytest.mark.exclusive
    @pytest.mark.parametrize("i", range(4))
    def test_alone(i):
        _log(f"exclusive{i}")

    @pytest.mark.parametrize("i", range(8))
    def test_after(i):
        _log(f"shared-b{i}")
""")


@pytest.mark.slow  # a pytest run on two workers
def test_an_exclusive_test_runs_alone_and_the_others_two_at_a_time(tmp_path):
    (tmp_path / "test_generated.py").write_text(_SUITE)
    log = tmp_path / "ran.log"
    env = {**os.environ, "LOCK_LOG": str(log), "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_TESTRUNUID", None)  # the inner run gets its own lock files
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "worksteal",
                           "-p", "tests.conftest", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                           str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [(name, float(a), float(b)) for name, a, b in (line.split() for line in log.read_text().splitlines())]
    assert len(ran) == 20

    def overlap(x, y):
        return x is not y and x[1] < y[2] and y[1] < x[2]

    beside = [(x[0], y[0]) for x in ran for y in ran if x[0].startswith("exclusive") and overlap(x, y)]
    assert beside == [], beside
    shared = [x for x in ran if x[0].startswith("shared")]
    assert any(overlap(x, y) for x in shared for y in shared), "the shared tests never ran two at a time"
