"""Engine actors added to and taken from a running `RayBackend` (what ``runtime/orchestrator/elastic``
drives; the decisions are made there).

    spawn ──► a new actor (not an engine yet) ──started──► its loop runs, the model loads (WorkerBooted)
          ──join──► backend.engines (routing, probes, restarts, shutdown as any engine)
    detach ──► out of backend.engines (no routing, no probes) ──retire──► Shutdown, killed after a grace

A new engine is built like the first ones (the same model folder, engine config and inbox) and
asks for the same resources, but outside the run's placement group, which has bundles only for
the engines the run started with. Under ``sync.transport = "shared_memory"`` it is pinned to the
trainer's node (shared memory does not cross machines). Names are never reused, so the per-engine
counters of a removed engine stay apart from a new one's.
"""

from __future__ import annotations

import logging
import time

from tokenflow.runtime.backends.ray.actors import ActorInbox, WorkerActor, engine_body
from tokenflow.runtime.backends.ray.backend import RayWorker
from tokenflow.runtime.backends.ray.placement import actor_options
from tokenflow.runtime.workers.messages import Shutdown

log = logging.getLogger(__name__)

RETIRE_GRACE_S = 5.0
"""How long a removed engine has to send its last counters before its actor is killed."""


def _index(name: str) -> int:
    return int(name[len("engine"):] or 0)


class RayEngineScaler:
    def __init__(self, backend) -> None:
        self.backend = backend
        self.ray = backend.ray
        self._actor_cls = self.ray.remote(WorkerActor)
        self._next = max(_index(e.name) for e in backend.engines) + 1
        first = backend.engines[0]
        self._args = first.args  # (model path, engine config, inbox, trace dir)
        self._restarts = first.max_restarts  # as the run's own engines (whatever the config key)
        self.joining: list[RayWorker] = []
        self.retiring: list[tuple[float, RayWorker]] = []

    def spawn(self) -> RayWorker:
        """A new engine actor, not yet routed to; `started` says when its loop runs."""
        rt = self.backend.cfg.runtime
        name = f"engine{self._next}"
        self._next += 1
        opts = actor_options(rt, "engine", None, 0, self._restarts)
        if self.backend.cfg.sync.transport == "shared_memory":
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.backend.trainer.node, soft=False)
        actor = self._actor_cls.options(**opts).remote(name)
        w = RayWorker(name, actor, engine_body, self._args, self._restarts)
        w.accepting = False  # no work before it holds the current weights
        w.joined_since = time.monotonic()
        self.joining.append(w)
        return w

    def started(self, w: RayWorker) -> bool:
        """Probe without blocking; True once the actor is placed and its loop started. Raises
        `WorkerDied` (naming the free resources) when Ray cannot place it in
        ``runtime.worker_timeout_s``."""
        timeout = self.backend.cfg.runtime.worker_timeout_s
        if w.pid is None and time.monotonic() - w.joined_since > timeout:
            raise RuntimeError(f"Ray could not start the {w.name} actor within {timeout:g}s "
                               f"(runtime.worker_timeout_s); free now: {self.ray.available_resources()}")
        w.not_down_before(w.joined_since)  # not "down" before it was ever up
        return w.check(self.ray, timeout) or w.pid is not None

    def join(self, w: RayWorker) -> None:
        self.joining.remove(w)
        self.backend.engines.append(w)

    def discard(self, w: RayWorker) -> None:
        """An engine that never joined (not placed, failed to load, or the run ended first)."""
        if w in self.joining:
            self.joining.remove(w)
        self._kill(w)

    def detach(self, w: RayWorker) -> None:
        """No more routing or probes; it keeps its sync attachment until `retire`."""
        self.backend.engines.remove(w)

    def retire(self, w: RayWorker) -> None:
        w.send(Shutdown())
        self.retiring.append((time.monotonic() + RETIRE_GRACE_S, w))

    def inboxes(self) -> tuple[ActorInbox, ...]:
        """The engines' command queues for the trainer's notices, in receiver order."""
        return tuple(ActorInbox(e.actor) for e in self.backend.engines)

    def node_of(self, w: RayWorker) -> str | None:
        return w.node

    def tick(self) -> None:
        now = time.monotonic()
        due = [w for t, w in self.retiring if t <= now]
        self.retiring = [(t, w) for t, w in self.retiring if t > now]
        for w in due:
            self._kill(w)

    def close(self) -> None:
        for w in [*self.joining, *(w for _, w in self.retiring)]:
            self._kill(w)
        self.joining, self.retiring = [], []

    def _kill(self, w: RayWorker) -> None:
        try:
            self.ray.kill(w.actor, no_restart=True)
        except Exception as e:  # noqa: BLE001 - gone already; nothing else to do
            log.debug("killing %s: %s", w.name, e)
