"""The futures table is bounded: a result read once goes after ``keep_read_s``, an unread one
after ``keep_s``, and never more than ``max_kept`` finished results are held."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future

from tokenflow.tinker.futures import Futures


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def test_read_results_go_after_their_window_and_the_table_is_capped():
    table = Futures(keep_s=60.0, keep_read_s=0.05, max_kept=3)
    read, unread = table.add(_done(1)), table.add(_done(2))
    assert asyncio.run(table.wait(read, 1.0)).result() == 1
    assert asyncio.run(table.wait(read, 1.0)).result() == 1  # a retried read gets the same answer
    time.sleep(0.1)
    table.add(_done(3))  # adding sweeps
    assert table.get(read) is None and table.get(unread) is not None
    running: Future = Future()
    pending = table.add(running)
    for i in range(5):
        table.add(_done(i))
    assert sum(1 for r in list(table._items) if table.get(r).done()) == 3  # the newest three finished
    assert table.get(unread) is None and table.get(pending) is running  # a call still running stays
    assert asyncio.run(table.wait(pending, 0.05)) is None  # and a wait on it times out without cancelling it
    assert not running.cancelled()
