"""One simulated inference engine (continuous batching) as a SimPy process.

The engine is simulated between events, not token by token: while the set of running
sequences is fixed every decode step has the same length ``t(n)`` and advances every sequence
by one token, so the engine sleeps straight to the next completion. Anything that changes the
plan (new prompts, a weight update, the trainer starting or stopping) wakes it; it then
finishes the decode step in progress, because updates and admissions happen between steps.

Weights arrive as finished transfers (``deliver``); the engine swaps them in at its swap point,
pausing ``S_e``: the next step boundary for inflight / abort, once the running sequences have
finished for drain (admitting nothing new meanwhile), at once in blocking mode (it is paused
anyway). A broadcast is a collective, so the trainer first asks every engine to ``join``: the
engine answers at its next step boundary and keeps decoding while it receives.

Token versions are kept lazily: the engine logs ``(decode-step counter, version)`` at every
weight swap and a rollout splits its tokens at those counters when it finishes or is aborted.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_right
from collections import deque
from typing import TYPE_CHECKING

import simpy

from tokenflow.sim.costs import Costs
from tokenflow.sim.recorder import Recorder
from tokenflow.sim.rollouts import SimGroup, SimRollout

if TYPE_CHECKING:
    from tokenflow.sim.trainer import TrainerState

_EPS_STEPS = 1e-6  # float slack when converting elapsed seconds into whole decode steps


class SimEngine:
    def __init__(self, env: simpy.Environment, idx: int, *, costs: Costs, update_mode: str,
                 max_running: int, prefix_sharing: bool, trainer: TrainerState,
                 recorder: Recorder, on_group_done, on_swapped) -> None:
        self.env = env
        self.idx = idx
        self.costs = costs
        self.mode = update_mode
        self.max_running = max_running
        self.prefix_sharing = prefix_sharing
        self.trainer = trainer
        self.rec = recorder
        self.on_group_done = on_group_done
        self.on_swapped = on_swapped
        self.counter = 0
        self.version = 0
        self.running: list[tuple[int, int, SimRollout]] = []  # heap of (finish counter, seq, rollout)
        self.waiting: deque[SimRollout] = deque()
        self.pending: deque[int] = deque()  # versions received, not yet swapped in
        self.joins: list[simpy.Event] = []  # broadcast rendezvous requests
        self._swaps = ([0], [0])  # decode-step counters, version in effect from that step on
        self._seq = itertools.count()
        self._wake: simpy.Event | None = None
        self._swapped: simpy.Event | None = None
        self.process = env.process(self._run())

    # -- called by other processes ------------------------------------------------------------
    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, group: SimGroup) -> None:
        self.waiting.extend(group.rollouts)
        self.wake()

    def deliver(self, version: int) -> None:
        """The weights of ``version`` have arrived; swap them in at the next swap point."""
        self.pending.append(version)
        self.wake()

    def join(self) -> simpy.Event:
        """Event that fires when this engine takes part in a broadcast (next step boundary)."""
        ev = self.env.event()
        self.joins.append(ev)
        self.wake()
        return ev

    def swapped_event(self) -> simpy.Event:
        """Event that fires at this engine's next weight swap."""
        if self._swapped is None or self._swapped.triggered:
            self._swapped = self.env.event()
        return self._swapped

    def wake(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # -- the process ----------------------------------------------------------------------------
    def _run(self):
        while True:
            for ev in self.joins:
                ev.succeed()
            self.joins.clear()
            if self.pending and self._swap_ready():
                yield from self._swap()
            elif self.mode == "blocking" and self.trainer.active:
                yield from self._sleep("paused")
            elif self.waiting and len(self.running) < self.max_running and self._may_start():
                yield from self._prefill()
            elif self.running:
                yield from self._decode()
            else:
                yield from self._sleep("paused" if self.waiting else "idle")

    def _swap_ready(self) -> bool:
        # inflight / abort / blocking swap at the next step boundary, which the loop top is;
        # drain swaps once the running sequences have finished.
        return self.mode != "drain" or not self.running

    def _may_start(self) -> bool:
        return not (self.mode == "drain" and self.pending)

    def _sleep(self, state: str):
        t0 = self.env.now
        self._wake = self.env.event()
        yield self._wake
        self.rec.engine(self.idx, state, t0, self.env.now)

    def _prefill(self):
        free = self.max_running - len(self.running)
        batch = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        if self.prefix_sharing:
            prompt = sum({id(r.group): r.group.prompt_len for r in batch}.values())
        else:
            prompt = sum(r.group.prompt_len for r in batch)
        tokens = prompt + sum(r.done_tokens for r in batch)
        t0 = self.env.now
        yield self.env.timeout(self.costs.prefill(tokens))
        self.rec.engine(self.idx, "prefill", t0, self.env.now, tokens=tokens)
        for r in batch:
            r.start_counter = self.counter
            heapq.heappush(self.running, (self.counter + r.remaining, next(self._seq), r))

    def _decode(self):
        n = len(self.running)
        dt = self.costs.decode_step(n, trainer_busy=self.trainer.training)
        k = self.running[0][0] - self.counter
        t0 = self.env.now
        self._wake = self.env.event()
        yield self.env.timeout(k * dt) | self._wake
        # Woken mid-step: the step in progress still completes before anything changes.
        steps = min(k, math.ceil((self.env.now - t0) / dt - _EPS_STEPS)) if dt > 0 else k
        steps = max(steps, 0)
        end = t0 + steps * dt
        if end > self.env.now:
            yield self.env.timeout(end - self.env.now)
        self.counter += steps
        self.rec.engine(self.idx, "decode", t0, end, tokens=steps * n, steps=steps)
        while self.running and self.running[0][0] <= self.counter:
            _, _, r = heapq.heappop(self.running)
            self._close_segments(r, self.counter)
            r.done_tokens = r.length
            group = r.group
            group.finished += 1
            if group.finished == len(group.rollouts):
                self.on_group_done(group)

    def _swap(self):
        version = self.pending.popleft()
        if self.mode == "abort" and self.running:
            # Running requests return their partial completions and are resubmitted in front
            # of the queue; resuming re-prefills prompt + partial under the new weights.
            aborted = [r for _, _, r in sorted(self.running)]
            self.running.clear()
            for r in aborted:
                self._close_segments(r, self.counter)
                r.done_tokens += self.counter - r.start_counter
            self.rec.reprefill.append((self.env.now, sum(r.done_tokens for r in aborted)))
            self.waiting.extendleft(reversed(aborted))
        t0 = self.env.now
        yield self.env.timeout(self.costs.swap_s)
        self.rec.engine(self.idx, "swap", t0, self.env.now)
        self.version = version
        self._swaps[0].append(self.counter)
        self._swaps[1].append(version)
        if self._swapped is not None and not self._swapped.triggered:
            self._swapped.succeed()
        self.on_swapped()

    def _close_segments(self, r: SimRollout, end: int) -> None:
        """Append r's tokens of decode steps [r.start_counter, end) split by version."""
        counters, versions = self._swaps
        i = bisect_right(counters, r.start_counter) - 1
        cur = r.start_counter
        while i + 1 < len(counters) and counters[i + 1] < end:
            nxt = counters[i + 1]
            if nxt > cur:
                r.segments.append((versions[i], nxt - cur))
                cur = nxt
            i += 1
        if end > cur:
            r.segments.append((versions[i], end - cur))
