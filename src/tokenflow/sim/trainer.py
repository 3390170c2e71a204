"""The simulated trainer: take a batch, run the optimizer step, send the new weights.

Sending blocks the trainer for ``S_t`` (it owns the weights being sent), as in
``tokenflow.sync``: over shared memory it first waits for a free slot of the two (every engine
must have swapped in the version written two updates ago), over a broadcast for every engine
to join the collective (their next decode step boundary). When the transfer ends each engine
holds the weights and swaps them in at its own swap point; the buffer's budget grows once all
have.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import simpy

from tokenflow.config.sync import sync_due
from tokenflow.sim.buffer import SimBuffer
from tokenflow.sim.costs import Costs
from tokenflow.sim.recorder import Recorder, StepRecord
from tokenflow.sim.rollouts import SimGroup


@dataclass
class TrainerState:
    """What engines can see of the trainer."""

    training: bool = False
    """Computing an optimizer step (for contention)."""
    active: bool = False
    """Training or syncing weights (blocking mode pauses engines meanwhile)."""


def consume(groups: list[SimGroup], version: int, max_token_age: int | None) -> tuple[Counter, int]:
    """Token ages at trainer version ``version`` and how many tokens version rejection drops."""
    ages: Counter = Counter()
    for g in groups:
        for r in g.rollouts:
            for v, n in r.segments:
                ages[version - v] += n
    rejected = 0
    if max_token_age is not None:
        rejected = sum(n for age, n in ages.items() if age > max_token_age)
    return ages, rejected


class SimTrainer:
    def __init__(self, env: simpy.Environment, *, costs: Costs, buffer: SimBuffer, engines: list,
                 state: TrainerState, recorder: Recorder, steps: int, prompts_per_step: int,
                 sync_every: int, max_token_age: int | None, transport: str,
                 notify_engines: bool) -> None:
        self.env = env
        self.costs = costs
        self.buffer = buffer
        self.engines = engines
        self.state = state
        self.rec = recorder
        self.steps = steps
        self.prompts_per_step = prompts_per_step
        self.sync_every = sync_every
        self.max_token_age = max_token_age
        self.transport = transport
        # Engines only need waking on trainer state changes when those change their plan.
        self.notify_engines = notify_engines
        self.version = 0
        self.process = env.process(self._run())

    def _set(self, *, training: bool, active: bool) -> None:
        self.state.training, self.state.active = training, active
        if self.notify_engines:
            for e in self.engines:
                e.wake()

    def _run(self):
        env = self.env
        for index in range(self.steps):
            start = env.now
            groups = yield self.buffer.take(self.prompts_per_step)
            data = env.now
            ages, rejected = consume(groups, self.version, self.max_token_age)
            completion = sum(g.completion_tokens for g in groups)
            prompt = sum(g.prompt_tokens for g in groups)
            busy = any(e.running for e in self.engines)
            self._set(training=True, active=True)
            yield env.timeout(self.costs.train_step(completion + prompt, engines_busy=busy))
            self.version += 1
            self._set(training=False, active=True)
            train_end = sync_start = env.now
            # The runtime's rule, less its push after the run's last step (the simulation ends there).
            if sync_due(self.version, self.sync_every):
                sync_start = yield from self._sync()
            self._set(training=False, active=False)
            self.rec.step(StepRecord(index=index, start_s=start, data_s=data, train_end_s=train_end,
                                     sync_start_s=sync_start, end_s=env.now,
                                     completion_tokens=completion, prompt_tokens=prompt,
                                     rejected_tokens=rejected, ages=ages))

    def _sync(self):
        """Send the current version; returns when the transfer started (after any wait)."""
        env = self.env
        if self.transport == "broadcast":
            yield env.all_of([e.join() for e in self.engines])
        else:
            # Double buffering: the slot of version v last held v - 2.
            while min(e.version for e in self.engines) < self.version - 2:
                yield env.any_of([e.swapped_event() for e in self.engines])
        start = env.now
        yield env.timeout(self.costs.sync_s)
        for e in self.engines:
            e.deliver(self.version)
        return start
