"""Futures: every Tinker call returns a request id at once; ``retrieve_future`` long-polls it.

A finished result is kept for ``keep_read_s`` after its first read (a retried read gets the same
answer) or ``keep_s`` if it is never read, and at most ``max_kept`` finished results are kept at
all, oldest dropped first, so clients that never read cannot grow the service without bound.
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
    def __init__(self, *, keep_s: float = 3600.0, keep_read_s: float = 120.0, max_kept: int = 2_000) -> None:
        self._items: OrderedDict[str, tuple[Future, str, float]] = OrderedDict()
        self._added: dict[str, float] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.keep_s, self.keep_read_s, self.max_kept = keep_s, keep_read_s, max_kept

    def add(self, future: Future, owner: str) -> str:
        """Register ``future`` (a session's call) and return its request id."""
        rid = f"req-{next(self._ids)}"
        with self._lock:
            self._items[rid] = (future, owner, 0.0)  # (future, owner, when first read; 0: not yet)
            self._added[rid] = time.monotonic()
            self._evict()
        return rid

    def failed(self, error: TinkerError, owner: str) -> str:
        f: Future = Future()
        f.set_exception(error)
        return self.add(f, owner)

    def _evict(self) -> None:
        now = time.monotonic()
        old = [k for k, (f, _, read) in self._items.items() if f.done() and (
            (read and now - read > self.keep_read_s) or now - self._added[k] > self.keep_s)]
        gone = set(old)
        finished = [k for k, (f, _, _) in self._items.items() if f.done() and k not in gone]
        for k in old + finished[: max(0, len(finished) - self.max_kept)]:
            del self._items[k]
            del self._added[k]

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
            # shield: a timed-out wait must not cancel the call itself (wrap_future would).
            waiter = asyncio.shield(asyncio.wrap_future(f))
            done, _ = await asyncio.wait([waiter], timeout=timeout_s)
            if not done:
                return None
            if not waiter.cancelled():
                waiter.exception()  # mark it read (the caller reads the call's own future)
        with self._lock:
            item = self._items.get(rid)
            if item is not None and item[2] == 0.0:
                self._items[rid] = (item[0], item[1], time.monotonic())  # read: kept keep_read_s more
        return f

    def pending(self) -> int:
        with self._lock:
            return sum(1 for f, _, _ in self._items.values() if not f.done())
