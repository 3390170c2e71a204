"""Parked KV caches: the keys/values of finished sequences, kept for their next model turn.

::

    turn k finishes (stop/length, park_kv) ──► Park op ──► ParkedKV.park(copy of the slot's rows)
                                                                 │   (LRU, at most `capacity`)
    add_request(resume=r.append_environment(ids)) ──► admission: match(key, prompt + completion)
        hit:  copy the rows back into a fresh slot, prefill only the tokens after them
        miss: prefill everything (always correct)

An entry is keyed by (request id, sample index) and holds the exact token ids its rows cover
(prompt + completion without the last sampled token, which is never fed back), so it is used
only when the continuation's tokens start with those ids. Entries are dropped when their
continuation is admitted (hit or miss), when the request is aborted, when weights change with a
KV recompute requested (their keys are stale), and least recently parked first when full.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

ParkKey = tuple[str, int]
"""(request id, sample index) of the sequence that was parked."""


@dataclass
class ParkedEntry:
    token_ids: list[int]
    """The tokens whose keys/values are held, positions 0 .. len - 1."""
    keys: torch.Tensor
    """[layers, kv_heads, len, head_dim]."""
    values: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class ParkedKV:
    """A bounded store of parked KV caches; least recently parked evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[ParkKey, ParkedEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: ParkKey) -> bool:
        return key in self._entries

    def park(self, key: ParkKey, entry: ParkedEntry) -> None:
        if self.capacity <= 0:
            return
        self._entries.pop(key, None)
        self._entries[key] = entry
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def match(self, key: ParkKey, token_ids: list[int]) -> int:
        """How many leading positions of ``token_ids`` the entry under ``key`` covers: its
        length if ``token_ids`` starts with its tokens and goes past them, else 0."""
        entry = self._entries.get(key)
        if entry is None or entry.num_tokens >= len(token_ids):
            return 0
        return entry.num_tokens if token_ids[: entry.num_tokens] == entry.token_ids else 0

    def take(self, key: ParkKey) -> ParkedEntry | None:
        return self._entries.pop(key, None)

    def drop_request(self, request_id: str) -> int:
        """Drop every entry of ``request_id``; returns how many."""
        keys = [k for k in self._entries if k[0] == request_id]
        for k in keys:
            del self._entries[k]
        return len(keys)

    def clear(self) -> None:
        self._entries.clear()

    def nbytes(self) -> int:
        return sum(e.nbytes() for e in self._entries.values())
