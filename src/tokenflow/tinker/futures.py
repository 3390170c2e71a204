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
from dataclasses import dataclass

from tokenflow.tinker.errors import TinkerError


@dataclass
class _Held:
    future: Future
    added: float
    read: float | None = None
    """When the result was first read (``wait``); None until then."""


class Futures:
    def __init__(self, *, keep_s: float = 3600.0, keep_read_s: float = 120.0, max_kept: int = 2_000) -> None:
        self._items: OrderedDict[str, _Held] = OrderedDict()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.keep_s, self.keep_read_s, self.max_kept = keep_s, keep_read_s, max_kept

    def add(self, future: Future) -> str:
        """Register ``future`` (a call) and return its request id."""
        rid = f"req-{next(self._ids)}"
        with self._lock:
            self._items[rid] = _Held(future, time.monotonic())
            self._evict()
        return rid

    def failed(self, error: TinkerError) -> str:
        f: Future = Future()
        f.set_exception(error)
        return self.add(f)

    def _evict(self) -> None:
        now = time.monotonic()
        old = [k for k, h in self._items.items() if h.future.done() and (
            (h.read is not None and now - h.read > self.keep_read_s) or now - h.added > self.keep_s)]
        gone = set(old)
        finished = [k for k, h in self._items.items() if h.future.done() and k not in gone]
        for k in old + finished[: max(0, len(finished) - self.max_kept)]:
            del self._items[k]

    def get(self, rid: str) -> Future | None:
        with self._lock:
            held = self._items.get(rid)
        return held.future if held else None

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
            held = self._items.get(rid)
            if held is not None and held.read is None:
                held.read = time.monotonic()  # read: kept keep_read_s more
        return f

    def pending(self) -> int:
        with self._lock:
            return sum(1 for h in self._items.values() if not h.future.done())
