"""The simulated trainer: take a batch, run the optimizer step, sync weights, free the slots.

A weight update is a rendezvous: the transfer starts once the trainer has published the new
version and every engine has reached its swap point (the next decode step boundary for
inflight / abort / blocking, an empty batch for drain), and both sides are busy for the
transfer time S. The trainer does not start its next step meanwhile, because it is the owner
of the weights being sent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import simpy

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


class WeightUpdate:
    """One weight update, shared by the trainer and every engine."""

    def __init__(self, env: simpy.Environment, version: int, engines: int) -> None:
        self.version = version
        self.ready = [env.event() for _ in range(engines)]
        self.done = env.event()
        self.transfer_start_s = env.now


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
                 sync_every: int, max_token_age: int | None, notify_engines: bool,
                 on_step: Callable[[StepRecord], None] | None = None) -> None:
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
            if self.version % self.sync_every == 0:
                sync_start = yield from self._sync()
            self._set(training=False, active=False)
            self.rec.step(StepRecord(index=index, start_s=start, data_s=data, train_end_s=train_end,
                                     sync_start_s=sync_start, end_s=env.now,
                                     completion_tokens=completion, prompt_tokens=prompt,
                                     rejected_tokens=rejected, ages=ages))
            self.buffer.release(sum(len(g.rollouts) for g in groups))

    def _sync(self):
        update = WeightUpdate(self.env, self.version, len(self.engines))
        for e in self.engines:
            e.request_update(update)
        yield self.env.all_of(update.ready)
        update.transfer_start_s = self.env.now
        yield self.env.timeout(self.costs.sync_s)
        update.done.succeed()
        return update.transfer_start_s
