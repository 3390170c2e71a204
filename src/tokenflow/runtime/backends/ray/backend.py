"""The Ray backend: engines and trainer ranks as Ray actors, on one machine or a cluster.

It offers the orchestrator the local backend's surface (``engines``, ``trainer``,
``all_workers``, ``recv``, ``broadcast``, ``check``, ``shutdown``) and runs the same worker loops
(see ``ray_actors``). What Ray adds:

* placement: each actor asks for ``runtime.ray_engine_cpus/gpus`` or ``ray_trainer_cpus/gpus``
  (per rank), optionally inside one placement group (``runtime.ray_placement_strategy``);
* a cluster: ``runtime.ray_address`` joins an existing one, otherwise a local one is started
  (unless the caller already called ``ray.init``, whose cluster is then used and left running);
* restarts: an engine actor that dies is restarted by Ray (``runtime.max_worker_restarts``).
  ``check`` notices it (a liveness probe fails, or comes back from a new process), starts the
  loop again in the new process and hands the orchestrator a ``WorkerRestarted``; the
  orchestrator re-sends the engine's in-flight groups and the sync spec, and the engine loads
  the newest weights before it generates. Messages sent while it is down are dropped here: the
  re-send covers them. A trainer rank is not restarted by Ray (its optimizer state died with
  it): the orchestrator replaces every rank from the last checkpoint while the engines go on
  (``replace_trainer``, called by ``orchestrator/healing.py`` as for the local backend).

Ray is imported only here and in ``ray_scoring``; ``import tokenflow`` and the local backend
never import it.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from tokenflow.runtime.workers.messages import Envelope, Shutdown, WorkerRestarted
from tokenflow.runtime.backends import trainer_start
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.backends.ray.actors import WorkerActor, engine_body, trainer_body
from tokenflow.errors import WorkerDied

log = logging.getLogger(__name__)

PROBE_EVERY_S = 0.5
_started_here = False  # whether this process called ray.init (and so shuts Ray down at the end)


def connect(cfg):
    """Ray, initialised: the caller's cluster, ``runtime.ray_address``, or a new local one."""
    global _started_here
    try:
        import ray
    except ModuleNotFoundError:
        raise ModuleNotFoundError('runtime.backend = "ray" needs Ray: pip install "tokenflow-rl[ray]"') from None
    if not ray.is_initialized():
        address = cfg.runtime.ray_address
        ray.init(**({"address": address} if address else {}), include_dashboard=False, log_to_driver=True)
        _started_here = True
    return ray


class RayWorker:
    """The orchestrator's handle on one worker actor: send, liveness probes, restarts."""

    def __init__(self, name: str, actor, body, args: tuple, max_restarts: int) -> None:
        self.name, self.actor, self.body, self.args = name, actor, body, args
        self.max_restarts, self.restarts = max_restarts, 0
        # The name the orchestrator may replace this worker under (`RayBackend.replace_trainer`):
        # trainer ranks; Ray itself restarts engines (``max_restarts``), so theirs stays None.
        self.replaceable: str | None = None
        self.load = 0  # samples in flight on this engine, for routing
        self.accepting = True  # False while a joining engine loads the current weights (elastic.py)
        self.pid: int | None = None
        self.node: str | None = None
        self.up = False
        self._probe = None
        self._probe_at = 0.0
        self._down_since = 0.0

    def not_down_before(self, since: float) -> None:
        """Count no time before ``since`` as down (an engine that joins was never up before it joined)."""
        self._down_since = max(self._down_since, since)

    def send(self, msg) -> None:
        if self.up:
            self.actor.deliver.remote(msg)
        else:
            log.debug("%s is restarting; dropped %s", self.name, type(msg).__name__)

    def start(self) -> None:
        self.actor.start.remote(self.body, *self.args)
        self.up = True

    def check(self, ray, timeout_s: float) -> bool:
        """Probe liveness without blocking; True when a restarted process has just been started."""
        now = time.monotonic()
        if self._probe is None:
            if now - self._probe_at >= PROBE_EVERY_S:
                self._probe, self._probe_at = self.actor.info.remote(), now
            return False
        if not ray.wait([self._probe], timeout=0)[0]:
            if not self.up and now - self._down_since > timeout_s:
                raise WorkerDied(f"the {self.name} actor died and did not come back within {timeout_s:g}s "
                                 "(runtime.worker_timeout_s)", worker=self.replaceable)
            return False
        probe, self._probe = self._probe, None
        try:
            info = ray.get(probe)
        except ray.exceptions.RayActorError as e:
            self._died(str(e).splitlines()[0])
            return False
        if info["pid"] == self.pid:
            if info["exit_code"]:  # the loop failed; its WorkerFailed message is on the way
                raise WorkerDied(f"the {self.name} actor's loop exited with code {info['exit_code']}",
                                 worker=self.replaceable)
            if self.up:
                return False
            # A probe failed but the process lived on (lost contact): its loop still runs, but
            # messages were dropped meanwhile, so the orchestrator re-sends as after a restart.
            self.up = True
            return True
        if self.pid is not None and self.up:  # a new process answered before a probe failed
            self._died("its process was replaced")
        self.pid, self.node = info["pid"], info["node"]
        self.start()
        return True

    def _died(self, why: str) -> None:
        if not self.up:
            # Still down from a death already counted: a probe that fails while Ray restarts the
            # actor (slow under load) is the same death, not another one.
            log.debug("the %s actor is still restarting (%s)", self.name, why)
            return
        if self.restarts >= self.max_restarts:
            raise WorkerDied(f"the {self.name} actor (pid {self.pid}) died: {why}"
                             + (f" (after {self.restarts} restarts)" if self.max_restarts else ""),
                             worker=self.replaceable)
        self.restarts += 1
        self.up = False
        self._down_since = time.monotonic()
        log.warning("the %s actor (pid %s) died (%s); Ray restarts it (%d of %d)",
                    self.name, self.pid, why, self.restarts, self.max_restarts)


class RayBackend(Backend):
    def __init__(self, cfg, engine_model_path: str, trainer_model_path: str, *, engine_version: int = 0,
                 resume_dir: str | None = None, trace_dir: str | None = None) -> None:
        from ray.util.queue import Queue

        from tokenflow.runtime.backends.ray.placement import actor_options, reserve

        self.ray = ray = connect(cfg)
        self.cfg = cfg
        rt, world, n_eng = cfg.runtime, cfg.trainer.world_size, cfg.runtime.num_engines
        self.inbox = Queue(actor_options={"num_cpus": 0})
        self._pending: deque = deque()
        self.placement = reserve(ray, rt, n_eng, world)
        actor_cls = ray.remote(WorkerActor)
        engine_cfg = cfg.engine.model_copy(update={"version": engine_version})
        restarts = rt.max_worker_restarts
        # Under broadcast the trainer re-forms the weight-sync group around a restarted engine.
        self.restarts_engines = restarts > 0
        self.engines_start_unattached = False  # the engines attach to the trainer's sync first
        self.engines = []
        for i in range(n_eng):
            name = "engine" if n_eng == 1 else f"engine{i}"
            actor = actor_cls.options(**actor_options(rt, "engine", self.placement, i, restarts)).remote(name)
            self.engines.append(RayWorker(name, actor, engine_body,
                                          (engine_model_path, engine_cfg, self.inbox, trace_dir), restarts))
        self._actor_cls = actor_cls
        self.trainer_start_step = engine_version  # where this run's trainer started (a resume's step)
        self._trainer_start = (trainer_model_path, resume_dir)
        self._trace_dir = trace_dir
        self._new_trainer_ranks()

    @property
    def all_workers(self) -> list[RayWorker]:
        """The workers the orchestrator hears from (ranks > 0 only talk to rank 0)."""
        return [*self.engines, self.trainer]

    @property
    def _everyone(self) -> list[RayWorker]:
        return [*self.engines, *self.trainer_ranks]

    def _new_trainer_ranks(self) -> None:
        """Actors for every trainer rank (not started), in the trainer's placement bundles."""
        from tokenflow.runtime.backends.ray.placement import actor_options

        rt, n_eng = self.cfg.runtime, self.cfg.runtime.num_engines
        self.trainer_ranks = []
        for rank in range(self.cfg.trainer.world_size):
            name = "trainer" if rank == 0 else f"trainer{rank}"
            actor = self._actor_cls.options(**actor_options(rt, "trainer", self.placement, n_eng + rank)).remote(name)
            worker = RayWorker(name, actor, trainer_body, (), 0)
            worker.replaceable = name
            self.trainer_ranks.append(worker)
        self.trainer = self.trainer_ranks[0]

    def _start_trainer_ranks(self, model: str, resume_dir: str | None) -> None:
        rdv = None
        if len(self.trainer_ranks) > 1:
            from tokenflow.trainer.distributed import Rendezvous

            host = self.ray.get(self.trainer.actor.info.remote())["ip"]
            port = self.ray.get(self.trainer.actor.free_port.remote())
            rdv = Rendezvous(host, port, len(self.trainer_ranks), self.cfg.trainer.collective_timeout_s)
        engine_actors = [e.actor for e in self.engines]
        for rank, w in enumerate(self.trainer_ranks):
            w.args = (model, self.cfg, self.inbox, engine_actors if rank == 0 else [], resume_dir, self._trace_dir,
                      rank, rdv)
            w.start()

    def start(self) -> RayBackend:
        self._wait_placed(self._everyone)
        self._check_transport()
        for w in self.engines:
            w.start()
        self._start_trainer_ranks(*self._trainer_start)
        return self

    def replace_trainer(self, checkpoint=None) -> None:
        """Kill every trainer rank (one died; the others cannot go on without it) and start new
        actors in their placement from ``checkpoint`` (a checkpoint folder; None: where this
        run's trainer started), as the local backend does (``orchestrator/healing.py``)."""
        for w in self.trainer_ranks:  # the dead one too: killing a dead actor is a no-op
            self.ray.kill(w.actor, no_restart=True)
        self._new_trainer_ranks()
        self._wait_placed(self.trainer_ranks)
        self._start_trainer_ranks(*trainer_start(self.cfg, self._trainer_start, checkpoint))

    def replace_engine(self, name: str) -> int:
        """Ray restarts a dead engine actor itself (``WorkerRestarted``, up to the actor's
        restarts); one that is dead past those is not replaced here."""
        raise WorkerDied(f"the {name} actor died past its restarts (runtime.max_worker_restarts); the Ray backend "
                         "does not replace it a second way", worker=None)

    def locked_engines(self) -> list[str]:
        """None: Ray's queues hold no lock a dead trainer could leave taken."""
        return []

    def _wait_placed(self, workers: list[RayWorker]) -> None:
        """Every actor process is up, or the error names the ones Ray could not place."""
        timeout = self.cfg.runtime.worker_timeout_s
        refs = {w.actor.info.remote(): w for w in workers}
        ready, waiting = self.ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        if waiting:
            names = [refs[r].name for r in waiting]
            raise WorkerDied(f"Ray could not start the {names} actor(s) within {timeout:g}s: not enough free "
                             f"resources for runtime.ray_*_cpus/gpus? Available now: "
                             f"{self.ray.available_resources()}")
        for ref in ready:
            info = self.ray.get(ref)
            refs[ref].pid, refs[ref].node = info["pid"], info["node"]

    def _check_transport(self) -> None:
        if self.cfg.sync.transport != "shared_memory":
            return
        away = [e.name for e in self.engines if e.node != self.trainer.node]
        if away:
            raise ValueError(f"sync.transport = \"shared_memory\" needs every engine on the trainer's machine, "
                             f"but Ray placed {away} elsewhere; use sync.transport = \"broadcast\" or "
                             "runtime.ray_placement_strategy = \"STRICT_PACK\"")

    # ---- the orchestrator's surface --------------------------------------------------------
    def recv(self, timeout: float):
        from ray.util.queue import Empty

        if self._pending:
            return self._pending.popleft()
        try:
            return self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except Empty:
            return None

    def broadcast(self, msg) -> None:
        for e in self.engines:
            e.send(msg)

    def lend_trainer_threads(self, lend: bool = True) -> None:
        """Nothing to lend: Ray places the trainer and the engines as separate actors with their
        own CPUs, often on different nodes."""

    def check(self) -> None:
        for w in self._everyone:
            if w.check(self.ray, self.cfg.runtime.worker_timeout_s):
                self._pending.append(Envelope(w.name, WorkerRestarted(w.name, w.restarts)))

    def shutdown(self) -> None:
        ray = self.ray
        for w in self.all_workers:  # rank 0 passes Shutdown on to the other ranks
            w.send(Shutdown())
        deadline = time.monotonic() + 20
        for w in self._everyone:
            try:
                while ray.get(w.actor.poll.remote(), timeout=5) is None and time.monotonic() < deadline:
                    time.sleep(0.1)
            except (ray.exceptions.RayError, TimeoutError):
                pass  # dead already, or stuck: killed below
            ray.kill(w.actor, no_restart=True)
        self.inbox.shutdown()
        if self.placement is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement)
        global _started_here
        if _started_here:
            ray.shutdown()
            _started_here = False
