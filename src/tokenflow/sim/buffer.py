"""Simulated rollout buffer: admission control in front of the engines, complete groups behind.

Backpressure comes from here, with the rule of ``tokenflow.buffer`` (its
:func:`~tokenflow.buffer.admission_capacity`, imported, not copied): a prompt group (G rollouts)
is admitted only while

    rollouts admitted so far + G <= (engine version + max_staleness + 1) * rollouts_per_step

where the engine version is the oldest version any engine has loaded. That is "at most
(K + 1) * rollouts_per_step admitted and not yet consumed", with a slot freed once the trainer
has consumed its rollout and the weights of that step are live in the engines; so with
``max_staleness = 0`` the next batch is generated with the new weights: the synchronous loop.
The trainer takes ``prompts_per_step`` complete groups, oldest admission first; with
``batch_order = "admission"`` it takes the oldest admitted groups and waits until all of them are
complete.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import simpy

from tokenflow.buffer import admission_capacity
from tokenflow.sim.rollouts import SimGroup
from tokenflow.sim.workload import LengthSampler


class SimBuffer:
    def __init__(self, env: simpy.Environment, *, rollouts_per_step: int, max_staleness: int,
                 group_size: int, max_groups: int, sampler: LengthSampler,
                 dispatch: Callable[[SimGroup], None], batch_order: str = "ready") -> None:
        self.env = env
        self.batch_order = batch_order
        self.taken = 0  # groups handed to the trainer (admission order: the next gid to take)
        self.rollouts_per_step = rollouts_per_step
        self.max_staleness = max_staleness
        self.group_size = group_size
        # The run never needs more prompts than it will consume (plus slack); admitting past
        # that only adds work nobody trains on, and makes a huge budget expensive to simulate.
        self.max_groups = max_groups
        self.sampler = sampler
        self.dispatch = dispatch
        self.engine_version = 0
        self.admitted = 0
        self.complete: list[tuple[int, SimGroup]] = []  # heap by admission order
        self._want: tuple[int, simpy.Event] | None = None

    def admit(self) -> None:
        """Admit prompt groups while the staleness budget allows."""
        while self.capacity() >= self.group_size and self.admitted < self.max_groups:
            group = SimGroup.create(self.admitted, self.sampler.prompt(),
                                    self.sampler.completions(self.group_size), self.env.now)
            self.admitted += 1
            self.dispatch(group)

    def capacity(self) -> int:
        """Rollouts that may be admitted now (``tokenflow.buffer.admission_capacity``); the
        simulator has no dynamic sampling, so no admitted rollout ever leaves the count."""
        return admission_capacity(self.engine_version, self.max_staleness, self.rollouts_per_step,
                                  self.admitted * self.group_size)

    def group_done(self, group: SimGroup) -> None:
        """Called by an engine when the last rollout of ``group`` finishes."""
        group.completed_s = self.env.now
        heapq.heappush(self.complete, (group.gid, group))
        self._serve()

    def take(self, n: int) -> simpy.Event:
        """Event whose value is the first ``n`` complete groups, once there are ``n``."""
        ev = self.env.event()
        self._want = (n, ev)
        self._serve()
        return ev

    def set_engine_version(self, version: int) -> None:
        """Every engine has loaded ``version``: the budget grows, admit more work."""
        if version > self.engine_version:
            self.engine_version = version
            self.admit()

    def _serve(self) -> None:
        if self._want is None or len(self.complete) < self._want[0]:
            return
        n, ev = self._want
        if self.batch_order == "admission":
            oldest = heapq.nsmallest(n, self.complete)
            if [gid for gid, _ in oldest] != list(range(self.taken, self.taken + n)):
                return  # an older group is still generating
        self._want = None
        self.taken += n
        ev.succeed([heapq.heappop(self.complete)[1] for _ in range(n)])
