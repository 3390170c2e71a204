"""The scorer pool as Ray actors: the same ``ScorerPool`` (group tasks, per-sample retry after a
timeout, failures kept per sample), with ``runtime.scorer_workers`` Ray actors in place of
local processes.

Only the pool underneath changes: ``_RayActorPool`` offers the part of pebble's
``ProcessPool`` that ``ScorerPool`` uses (``schedule`` with a timeout, futures with
``done``/``exception``/``result``, ``stop``/``join``). Like pebble it runs one task per worker
at a time and queues the rest, so a task's timeout counts from its start, and a task past its
timeout kills only its own worker: the actor is killed and Ray restarts it (reloading the
reward function), while the other actors keep scoring. Actors rather than tasks keep the number
of scorer processes fixed (Ray starts a process per concurrent task otherwise).
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout

from tokenflow.scoring import pool as local_pool
from tokenflow.scoring.pool import ScorerPool


class ScorerActor:
    """Wrapped with ``ray.remote`` by the pool; loads the reward function once."""

    def __init__(self, reward_spec: str) -> None:
        local_pool._init_worker(reward_spec)

    def run(self, fn, args: tuple):
        return fn(*args)


class _Future:
    def __init__(self, pool, fn, args: tuple, timeout_s: float) -> None:
        self.pool, self.fn, self.args, self.timeout_s = pool, fn, args, timeout_s
        self.ref = self.actor = None
        self.deadline = 0.0
        self.timed_out = False

    def done(self) -> bool:
        self.pool.pump()
        return self.ref is not None and self.actor is None

    def exception(self):
        if self.timed_out:
            return FutureTimeout()
        try:
            self.pool.ray.get(self.ref)
        except Exception as e:  # noqa: BLE001 - reported, not raised, like a future's exception()
            return e
        return None

    def result(self):
        if self.timed_out:
            raise FutureTimeout()
        return self.pool.ray.get(self.ref)


class _RayActorPool:
    active = True  # Ray restarts a dead reward actor itself; the pool never breaks

    def __init__(self, ray, reward_spec: str, workers: int, cpus: float) -> None:
        self.ray = ray
        cls = ray.remote(ScorerActor).options(num_cpus=cpus, max_restarts=-1, max_task_retries=0)
        self.idle = deque(cls.remote(reward_spec) for _ in range(workers))
        self.queued: deque[_Future] = deque()
        self.running: list[_Future] = []

    def schedule(self, fn, args: tuple, timeout: float) -> _Future:
        f = _Future(self, fn, args, timeout)
        self.queued.append(f)
        self.pump()
        return f

    def pump(self) -> None:
        """Retire finished and overdue tasks, then start queued ones on idle actors."""
        now = time.monotonic()
        for f in list(self.running):
            finished = bool(self.ray.wait([f.ref], timeout=0)[0])
            if not finished and now <= f.deadline:
                continue
            if not finished:
                self.ray.kill(f.actor, no_restart=False)  # Ray brings it back, reward function reloaded
                f.timed_out = True
            self.running.remove(f)
            self.idle.append(f.actor)
            f.actor = None
        while self.idle and self.queued:
            f = self.queued.popleft()
            f.actor = self.idle.popleft()
            f.ref = f.actor.run.remote(f.fn, f.args)
            f.deadline = now + f.timeout_s
            self.running.append(f)

    def stop(self) -> None:
        if self.ray.is_initialized():
            for actor in [*self.idle, *(f.actor for f in self.running)]:
                self.ray.kill(actor, no_restart=True)
        self.idle.clear()
        self.running, self.queued = [], deque()

    def join(self, timeout: float | None = None) -> None:
        """Killed actors need no joining."""


class RayScorerPool(ScorerPool):
    def __init__(self, reward_spec: str, cfg) -> None:
        from tokenflow.runtime.backends.ray.backend import connect

        from tokenflow.scoring.scorer_shapes import shape_of
        from tokenflow.tasks.reward_loading import load_reward_fn

        rt = cfg.runtime
        self.shape = shape_of(load_reward_fn(reward_spec))
        self.timeout_s = rt.score_timeout_s
        self._pool = _RayActorPool(connect(cfg), reward_spec, rt.scorer_workers, rt.ray_scorer_cpus)
        self._pending = []
        self._pids = {}
        self.failed = 0
        self.timeouts = 0
        self.scored = 0
