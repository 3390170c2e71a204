"""The suite runs on two pytest-xdist workers (pyproject's addopts). Most tests own everything
they touch (a tmp_path, a run folder, their own processes), but a few check the whole machine:
the sandbox attacks list every sandbox process, /tmp work dir, cgroup, mount and /dev/shm entry
that appeared while they ran, and a run on the other worker makes all of those. A test marked
``exclusive`` therefore runs while no other test does.

The lock is a readers-writer lock over two files shared by the run's workers: every test holds
the main lock shared, an exclusive test holds it alone. Both first pass a turnstile, which an
exclusive test keeps while it waits, so the other worker cannot take the shared lock again and
again between its tests and starve it. Without xdist (``-n 0``) nothing is locked."""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from pathlib import Path

import pytest

# Two tests at once on a two-core machine, each with an engine and a trainer process of their
# own, put more torch (OpenMP) threads on the cores than there are cores. OpenMP's threads then
# spin at each parallel region's barrier for a partner the scheduler has parked, and a tiny run's
# thousands of small kernels each wait out a time slice: a test that takes 34 s alone took 213 s
# beside a copy of itself, and 34-44 s with passive waiting (docs/performance.md, "Beside other
# CPU work"). Set before torch loads here, and inherited by every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One thread where a test leaves torch's default (a test's own model in the worker's process):
# the other core runs the other worker's test. tests/trainer and tests/engine took 144 s with
# torch's default (two threads), 125 s with one. A run's processes set their own threads
# (engine.threads, trainer.threads), so what a test configures still holds.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _lock_files(run: str | None = None) -> tuple[Path, Path] | None:
    run = run or os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id shared by the workers of one run
    if run is None:
        return None
    base = Path(tempfile.gettempdir()) / f"tokenflow-tests-{run}"
    return base.with_suffix(".turnstile"), base.with_suffix(".lock")


def pytest_configure(config):
    # The controller names the run itself (xdist would make up an id it keeps to itself), so
    # that it can remove the lock files once every worker has finished.
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        config.option.testrunuid = config.option.testrunuid or uuid.uuid4().hex


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", None):
        for path in _lock_files(config.option.testrunuid):
            path.unlink(missing_ok=True)


def _exclusive(item) -> bool:
    return item is not None and item.get_closest_marker("exclusive") is not None


def _take(files: tuple[Path, Path], exclusive: bool):
    turnstile, lock = open(files[0], "a"), open(files[1], "a")
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    finally:
        turnstile.close()  # closing releases the turnstile
    return lock


_held: dict = {}  # this worker's exclusive lock, while the next test is exclusive too


# tryfirst: the outermost wrapper, so that waiting for the lock is not counted by pytest-timeout
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    files = _lock_files()
    if files is None:
        yield
        return
    exclusive = _exclusive(item)
    # setup, call and teardown (module fixtures' too) all run under the lock
    lock = _held.pop("lock") if exclusive and _held else _take(files, exclusive)
    try:
        yield
    finally:
        # A run of exclusive tests (the attack module) keeps the lock from its first test to its
        # last: released between them, each would wait for one of the other worker's tests.
        if exclusive and _exclusive(nextitem):
            _held["lock"] = lock
        else:
            lock.close()  # closing releases the lock
