"""Futures: every Tinker call returns a request id at once; ``retrieve_future`` long-polls it.

A result is kept until it is read and for ``keep_s`` after it finished (a retried read gets the
same answer), and at most ``max_kept`` finished results are kept at all, oldest dropped first,
so clients that never read cannot grow the service without bound.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

from tokenflow.tinker.errors import TinkerError


class Futures:
    def __init__(self, *, keep_s: float = 3600.0, max_kept: int = 10_000) -> None:
        self._items: OrderedDict[str, tuple[Future, str, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.keep_s, self.max_kept = keep_s, max_kept

    def add(self, future: Future, owner: str) -> str:
        """Register ``future`` (a session's call) and return its request id."""
        rid = f"req-{next(self._ids)}"
        with self._lock:
            self._items[rid] = (future, owner, time.monotonic())
            self._evict()
        return rid

    def failed(self, error: TinkerError, owner: str) -> str:
        f: Future = Future()
        f.set_exception(error)
        return self.add(f, owner)

    def _evict(self) -> None:
        now = time.monotonic()
        done = [k for k, (f, _, t) in self._items.items() if f.done() and now - t > self.keep_s]
        for k in done:
            del self._items[k]
        finished = [k for k, (f, _, _) in self._items.items() if f.done()]
        for k in finished[: max(0, len(finished) - self.max_kept)]:
            del self._items[k]

    def get(self, rid: str) -> Future | None:
        with self._lock:
            item = self._items.get(rid)
        return item[0] if item else None

    async def wait(self, rid: str, timeout_s: float) -> Future | None:
        """The future once done, or None if it is still running after ``timeout_s``."""
        f = self.get(rid)
        if f is None:
            raise TinkerError(f"unknown request_id {rid!r} (it never existed, or its result expired)",
                              category="user", status=404)
        if not f.done():
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(f)), timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                return None
            except Exception:  # noqa: BLE001 - the future's own error is read below
                pass
        return f

    def pending(self) -> int:
        with self._lock:
            return sum(1 for f, _, _ in self._items.values() if not f.done())
