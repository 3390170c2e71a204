"""Waiting for a scorer pool in tests."""

from __future__ import annotations

import time


def wait_scored(pool, timeout_s: float = 60.0) -> list:
    """Poll ``pool`` until it returns scored groups (or ``timeout_s`` passes); returns them."""
    deadline = time.time() + timeout_s
    done = []
    while not done and time.time() < deadline:
        done = pool.poll()
        time.sleep(0.01)
    return done
