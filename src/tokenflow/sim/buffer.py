"""Simulated rollout buffer: admission control in front of the engines, complete groups behind.

Backpressure comes from here. A prompt group (G rollouts) is admitted only while the rollouts
admitted and not yet consumed stay within ``(max_staleness + 1) * rollouts_per_step``. A slot
frees when the optimizer step that consumed its rollout has finished (and, on a sync step, its
weights have reached the engines), so with ``max_staleness = 0`` the next batch is generated
with the new weights: the synchronous loop. Complete groups queue in completion order and the
trainer takes the first ``prompts_per_step`` of them.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import simpy

from tokenflow.sim.rollouts import SimGroup
from tokenflow.sim.workload import LengthSampler


class SimBuffer:
    def __init__(self, env: simpy.Environment, *, capacity_rollouts: int, group_size: int,
                 max_groups: int, sampler: LengthSampler,
                 dispatch: Callable[[SimGroup], None]) -> None:
        self.env = env
        self.capacity = capacity_rollouts
        self.group_size = group_size
        # The run never needs more prompts than it will consume (plus slack); admitting past
        # that only adds work nobody trains on, and makes a huge budget expensive to simulate.
        self.max_groups = max_groups
        self.sampler = sampler
        self.dispatch = dispatch
        self.outstanding = 0
        self.admitted = 0
        self.complete: deque[SimGroup] = deque()
        self._want: tuple[int, simpy.Event] | None = None

    def admit(self) -> None:
        """Admit prompt groups while the staleness budget allows; call after every release."""
        g = self.group_size
        while self.outstanding + g <= self.capacity and self.admitted < self.max_groups:
            group = SimGroup.create(self.admitted, self.sampler.prompt(),
                                    self.sampler.completions(g), self.env.now)
            self.admitted += 1
            self.outstanding += g
            self.dispatch(group)

    def group_done(self, group: SimGroup) -> None:
        """Called by an engine when the last rollout of ``group`` finishes."""
        group.completed_s = self.env.now
        self.complete.append(group)
        self._serve()

    def take(self, n: int) -> simpy.Event:
        """Event whose value is the first ``n`` complete groups, once there are ``n``."""
        ev = self.env.event()
        self._want = (n, ev)
        self._serve()
        return ev

    def release(self, rollouts: int) -> None:
        """Free ``rollouts`` slots (their optimizer step is done) and admit more work."""
        self.outstanding -= rollouts
        self.admit()

    def _serve(self) -> None:
        if self._want is not None and len(self.complete) >= self._want[0]:
            n, ev = self._want
            self._want = None
            ev.succeed([self.complete.popleft() for _ in range(n)])
