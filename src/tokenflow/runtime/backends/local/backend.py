"""The local backend: engine and trainer as spawned processes on this machine, no services.

The orchestrator talks to workers only through this small surface (``engines``, ``trainer``,
``recv``, ``broadcast``, ``check``, ``shutdown``), which the Ray backend implements too.
"""

from __future__ import annotations

import logging
import multiprocessing.connection as mp_connection
import queue
import time

from tokenflow.metrics import trace
from tokenflow.runtime.backends import trainer_start
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.backends.local import start as worker_start
from tokenflow.runtime.workers.engine_worker import run_engine_worker
from tokenflow.runtime.workers.messages import SetThreads, Shutdown
from tokenflow.runtime.workers.trainer_worker import run_trainer_worker
from tokenflow.runtime.workers.memory_watch import OomCounters
from tokenflow.runtime.workers.os_environ import environment as worker_environment
from tokenflow.runtime.workers.process import LogForwarder, WorkerHandle

log = logging.getLogger(__name__)


class LocalBackend(Backend):
    def __init__(self, cfg, engine_model_path: str, trainer_model_path: str, *, engine_version: int = 0,
                 resume_dir: str | None = None, trace_dir: str | None = None, num_engines: int | None = None) -> None:
        # forkserver (default): forked from a server that has imported torch and the worker code
        # (started before the run's checks, see worker_start); spawn: fresh interpreters.
        self._ctx = ctx = worker_start.context(cfg.runtime.start_method)
        env = worker_environment() if ctx.get_start_method() == "forkserver" else None
        self.cfg, self._trace_dir = cfg, trace_dir
        # A dead worker is replaced by the orchestrator (runtime.max_worker_restarts; see
        # replace_engine / replace_trainer); under broadcast a replaced engine re-forms the group.
        self.restarts_engines = cfg.runtime.max_worker_restarts > 0
        # An engine process starts once per run, with the run's starting weights: it generates
        # before the trainer is up (EngineWorker.attach_first).
        self.engines_start_unattached = True
        num_engines = num_engines or cfg.runtime.num_engines
        self._lent_threads = _threads_after_training(cfg, num_engines)
        self._lending = False  # the engines run on _lent_threads now
        # One result queue per worker: a worker killed while writing would leave a shared
        # queue's lock held (every other writer blocked) or half a message in its pipe.
        self._out: dict[str, object] = {}
        self._retired: list = []
        self.logs = LogForwarder(ctx)
        oom = OomCounters()  # the kernel's out-of-memory counters now: a SIGKILL later is told by them
        self._engine_args = (engine_model_path, cfg.engine.model_copy(update={"version": engine_version}))
        self.engines = []
        for i in range(num_engines):
            name = "engine" if num_engines == 1 else f"engine{i}"
            q = ctx.Queue()
            h = WorkerHandle(name, run_engine_worker, self._engine_argv(name, q, attach_first=False), ctx, cmd_q=q,
                             logs=self.logs, env=env, oom=oom, cfg=cfg)
            self.engines.append(h)
        trainer_q = ctx.Queue()
        # Where the trainer started (the base model, or the checkpoint resumed from), for a
        # replacement when no newer checkpoint exists.
        self.trainer_start_step, self._trainer_start = engine_version, (trainer_model_path, resume_dir)
        self.trainer_ranks = []
        rdv = self._rendezvous()
        for rank in range(cfg.trainer.world_size):
            name = "trainer" if rank == 0 else f"trainer{rank}"
            self.trainer_ranks.append(WorkerHandle(
                name, run_trainer_worker, self._trainer_argv(rank, trainer_model_path, resume_dir, rdv, trainer_q),
                ctx, cmd_q=trainer_q if rank == 0 else None, logs=self.logs, env=env, oom=oom, cfg=cfg))
        self.trainer = self.trainer_ranks[0]

    def _result_queue(self, name: str):
        q = self._out.pop(name, None)
        if q is not None:  # a dead worker's messages not read yet are dropped with it
            q.close()
            self._retired.append(q)  # kept: collecting it would unlink its semaphores (WorkerHandle.renew)
        self._out[name] = self._ctx.Queue()
        return self._out[name]

    def _engine_argv(self, name: str, cmd_q, attach_first: bool) -> tuple:
        model, engine_cfg = self._engine_args
        return (model, engine_cfg, self._result_queue(name), cmd_q, name, self._trace_dir, attach_first)

    def _trainer_argv(self, rank: int, model: str, resume_dir: str | None, rdv, trainer_q) -> tuple:
        name = "trainer" if rank == 0 else f"trainer{rank}"
        engine_qs = [e.cmd_q for e in self.engines] if rank == 0 else []
        return (model, self.cfg, self._result_queue(name), trainer_q if rank == 0 else None, engine_qs,
                resume_dir, name, self._trace_dir, rank, rdv)

    def _rendezvous(self):
        t = self.cfg.trainer
        if t.world_size == 1:
            return None
        from tokenflow.sync.broadcast import free_port
        from tokenflow.trainer.distributed import Rendezvous

        return Rendezvous("127.0.0.1", free_port(), t.world_size, t.collective_timeout_s)

    # ---- replacing a dead worker (the orchestrator's healing) ----------------------------------
    def replace_engine(self, name: str) -> int:
        """Start a new process for the dead engine ``name`` (new queues): it attaches to the weight
        sync and loads the newest weights before it generates. Returns its index."""
        index, h = next((i, e) for i, e in enumerate(self.engines) if e.name == name)
        q = self._ctx.Queue()
        h.renew(self._engine_argv(name, q, attach_first=True), q).start()
        h.load = 0
        if self._lending:  # it starts on engine.threads, the others run on the trainer's too
            h.send(SetThreads(self._lent_threads))
        return index

    def locked_engines(self) -> list[str]:
        """Engines whose command queue a dead writer left locked: the trainer writes weight
        notices there, and one killed mid-write holds the queue's lock for ever (nothing more
        would reach the engine). Such an engine is replaced too (new queues)."""
        return [e.name for e in self.engines if not _lock_free(e.cmd_q)]

    def replace_trainer(self, checkpoint=None) -> None:
        """Stop every trainer rank (one died; the others cannot go on without it) and start them
        again from ``checkpoint`` (a checkpoint folder; None: where this run's trainer started)."""
        model, resume_dir = trainer_start(self.cfg, self._trainer_start, checkpoint)
        rdv, q = self._rendezvous(), self._ctx.Queue()
        for rank, h in enumerate(self.trainer_ranks):
            h.renew(self._trainer_argv(rank, model, resume_dir, rdv, q), q if rank == 0 else self._ctx.Queue())
        for h in self.trainer_ranks:
            h.start()

    @property
    def all_workers(self) -> list[WorkerHandle]:
        """The workers the orchestrator hears from (ranks > 0 only talk to rank 0)."""
        return [*self.engines, self.trainer]

    def start(self) -> "LocalBackend":
        for w in [*self.engines, *self.trainer_ranks]:
            w.start()
        return self

    def recv(self, timeout: float):
        """The next message from any worker (None after ``timeout`` seconds without one)."""
        queues = list(self._out.values())
        readers = {q._reader: q for q in queues}  # noqa: SLF001 - a Queue's pipe, to wait on them all
        for reader in mp_connection.wait(list(readers), timeout=max(timeout, 0.0)):
            try:
                return readers[reader].get_nowait()
            except queue.Empty:
                continue  # another message's bytes, still arriving
        return None

    def broadcast(self, msg) -> None:
        for e in self.engines:
            e.send(msg)

    def lend_trainer_threads(self, lend: bool = True) -> None:
        """The engines take the trainer's CPU threads (``lend``) or give them back: while the
        trainer waits for a batch (``runtime.lend_trainer_threads``) and after the last step, for
        the final evaluation (one machine; see :func:`_threads_after_training`). A message only
        when that changes."""
        if self._lent_threads is None or lend == self._lending:
            return
        self._lending = lend
        threads = self._lent_threads if lend else self.cfg.engine.threads
        trace.record("orchestrator/engine_threads", time.time(), 0.0, threads=threads)
        self.broadcast(SetThreads(threads))

    def check(self) -> None:
        for w in [*self.engines, *self.trainer_ranks]:
            w.check()

    def shutdown(self) -> None:
        for w in self.all_workers:  # rank 0 passes Shutdown on to the other ranks
            if w.process.is_alive():
                w.send(Shutdown())
        for w in [*self.engines, *self.trainer_ranks]:
            w.stop(timeout=20)
        # Every worker is gone now. A queue's feeder thread may still be blocked writing into
        # the pipe of one that died (a batch for a killed trainer); the interpreter would join
        # it at exit and hang for ever. What it holds has no reader left: drop it.
        for q in {id(w.cmd_q): w.cmd_q for w in [*self.engines, *self.trainer_ranks]}.values():
            q.cancel_join_thread()
            q.close()
        for q in self._out.values():
            q.close()
        self.logs.stop()


def _lock_free(q, timeout_s: float = 1.0) -> bool:
    """Whether ``q``'s write lock can be taken (our own feeder thread holds it only to write)."""
    lock = getattr(q, "_wlock", None)
    if lock is None or lock.acquire(timeout=timeout_s):
        if lock is not None:
            lock.release()
        return True
    return False


def _threads_after_training(cfg, num_engines: int) -> int | None:
    """Each engine's torch threads once the trainer is done, or None to leave them: only when
    both sides are pinned to CPU threads and the engine's backend retunes its threads
    (`EngineCapabilities.retunes_threads`; the default run's final evaluation: 0.54-0.61 s with
    one engine thread, 0.42-0.47 s with two)."""
    from tokenflow.engine.backends import capabilities_of

    e, t = cfg.engine, cfg.trainer
    if not e.threads or not t.threads or "cuda" in (e.device, t.device):
        return None
    if not capabilities_of(e.backend).retunes_threads:
        return None
    extra = t.threads * t.world_size // num_engines
    return e.threads + extra if extra else None
