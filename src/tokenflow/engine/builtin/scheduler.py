"""Continuous batching: which requests prefill, which sequences decode, and who finishes.

Plain Python, no tensors: the scheduler decides; the model runner executes. Each engine step is
either one prefill of newly admitted requests (FIFO, as many as fit the free slots and the token
budget) or one decode step of every running sequence. Sequences leave the batch the step they
finish and their slot is refilled at the next admission, so requests join and leave at every
step. ``running[i]`` is the sequence in cache slot ``i`` (the allocator keeps slots packed); a
finished sequence's slot is filled by moving the last one, and the scheduler records that move
for the runner to copy the cache rows before the next forward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from tokenflow.engine.builtin.cache.kv_cache import SlotAllocator
from tokenflow.engine.builtin.sequence import Sequence, SequenceGroup, SequenceStatus


class Move(NamedTuple):
    """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""

    src: int
    dst: int
    length: int


class Park(NamedTuple):
    """Copy the first ``length`` cached positions of ``slot`` out into the parked store."""

    slot: int
    length: int
    key: tuple[str, int]
    token_ids: list[int]


@dataclass
class ScheduledBatch:
    kind: Literal["prefill", "decode"]
    seqs: list[Sequence]
    """Rows of the batch: for a prefill, the n samples of each group in group order; for a
    decode, the running sequences in slot order (row i is slot i)."""
    groups: list[SequenceGroup] = field(default_factory=list)


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 detokenize: Callable[[list[int]], str] | None = None,
                 reusable: Callable[[SequenceGroup], int] | None = None) -> None:
        self.allocator = SlotAllocator(max_num_seqs)
        self.reusable = reusable
        """Positions of a waiting group's prefix that parked KV would serve (0: none)."""
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.detokenize = detokenize
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[Sequence] = []
        self.admitting = True
        """False while draining for a weight update: running sequences finish, none start."""
        self.moves: list[Move | Park] = []
        """Pending cache ops in the order they must happen."""

    @property
    def num_waiting(self) -> int:
        return sum(g.n for g in self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, group: SequenceGroup) -> None:
        if group.n > self.allocator.num_slots:
            raise ValueError(f"a request with n={group.n} can never fit {self.allocator.num_slots} slots")
        self.waiting.append(group)

    def schedule(self) -> ScheduledBatch | None:
        """Admit waiting requests if any fit (a prefill step), else decode the running batch."""
        if self.admitting and self.waiting:
            groups = self._admit()
            if groups:
                return ScheduledBatch("prefill", [s for g in groups for s in g.seqs], groups)
        if self.running:
            return ScheduledBatch("decode", list(self.running))
        return None

    def _admit(self) -> list[SequenceGroup]:
        groups: list[SequenceGroup] = []
        free = self.allocator.num_free
        longest = 0
        while self.waiting:
            group = self.waiting[0]
            if group.n > free:
                break  # FIFO: a big group is not overtaken, so it cannot starve
            reused = self.reusable(group) if self.reusable is not None else 0
            if groups and (reused > 0) != (groups[0].reused > 0):
                break  # continuations from parked KV prefill apart (see the module docstring)
            longest_after = max(longest, group.num_prefill_tokens - reused)
            if groups and longest_after * (len(groups) + 1) > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            group.reused = reused
            groups.append(group)
            free -= group.n
            longest = longest_after
        for group in groups:
            for seq, slot in zip(group.seqs, self.allocator.allocate(group.n)):
                seq.slot = slot
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
        return groups

    def postprocess(self, seqs: list[Sequence], tokens: list[int], logprobs: list[float],
                    logmass: list[float], support: list[np.ndarray | None] | None,
                    version: int, top: list | None = None) -> list[Sequence]:
        """Append each row's new token, and finish the sequences that stop. Returns the finished."""
        finished = []
        for i, seq in enumerate(seqs):
            token = tokens[i]
            seq.append(token, logprobs[i], version, logmass[i], support[i] if support else None,
                       top[i] if top else None)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.stop_ids:
            return "stop"
        if seq.params.stop and self.detokenize is not None and self._hit_stop_string(seq):
            return "stop"
        if seq.num_completion_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _hit_stop_string(self, seq: Sequence) -> bool:
        # A stop string of c characters spans at most c tokens (plus a few that decode to nothing),
        # so decoding a short tail is enough.
        window = max(len(s) for s in seq.params.stop) + 8
        completion = seq.token_ids[seq.turn_start:]  # this model turn's text only
        text = self.detokenize(completion[-window:])
        return any(s in text for s in seq.params.stop)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark ``seq`` finished and free its slot (recording the move that keeps slots packed)."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if seq.slot < 0:
            return
        # A sequence at the context limit can never be continued: nothing to park.
        if seq.params.park_kv and reason in ("stop", "length") and seq.num_tokens < self.max_model_len:
            cached = seq.num_tokens - 1  # the last sampled token was never fed back
            self.moves.append(Park(seq.slot, cached, (seq.request_id, seq.sample_index),
                                   seq.token_ids[:cached]))
        move = self.allocator.free(seq.slot)
        if move is not None:
            src, dst = move
            moved = self.running[src]
            self.running[dst] = moved
            moved.slot = dst
            # num_tokens bounds the cached positions whether or not `moved` has appended this
            # step's token yet (the cache never holds the last token).
            self.moves.append(Move(src, dst, moved.num_tokens))
        self.running.pop()
        seq.slot = -1

    def take_moves(self) -> list[Move | Park]:
        moves, self.moves = self.moves, []
        return moves

    def abort_request(self, request_id: str) -> list[Sequence]:
        """Finish every sample of ``request_id`` (waiting or running) with reason "abort"."""
        aborted = []
        for group in [g for g in self.waiting if g.request_id == request_id]:
            self.waiting.remove(group)
            for seq in group.seqs:
                self.finish(seq, "abort")
                aborted.append(seq)
        for seq in [s for s in reversed(self.running) if s.request_id == request_id]:
            self.finish(seq, "abort")
            aborted.append(seq)
        return aborted

    def abort_running(self) -> list[Sequence]:
        """Finish every running sequence with reason "abort" (waiting requests stay queued)."""
        aborted = list(reversed(self.running))  # last slot first: no moves needed
        for seq in aborted:
            self.finish(seq, "abort")
        return aborted
