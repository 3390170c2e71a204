"""The local backend: engine and trainer as spawned processes on this machine, no services.

The orchestrator talks to workers only through this small surface (``engines``, ``trainer``,
``recv``, ``broadcast``, ``check``, ``shutdown``), which the Ray backend implements too.
"""

from __future__ import annotations

import logging
import queue

from tokenflow.runtime.backends.local import start as worker_start
from tokenflow.runtime.workers.engine_worker import run_engine_worker
from tokenflow.runtime.workers.messages import SetThreads, Shutdown
from tokenflow.runtime.workers.trainer_worker import run_trainer_worker
from tokenflow.runtime.workers.environment import environment as worker_environment
from tokenflow.runtime.workers.process import LogForwarder, WorkerHandle

log = logging.getLogger(__name__)


class LocalBackend:
    def __init__(self, cfg, engine_model_path: str, trainer_model_path: str, *, engine_version: int = 0,
                 resume_dir: str | None = None, trace_dir: str | None = None, num_engines: int | None = None) -> None:
        # forkserver (default): forked from a server that has imported torch and the worker code
        # (started before the run's checks, see worker_start); spawn: fresh interpreters.
        ctx = worker_start.context(cfg.runtime.start_method)
        env = worker_environment() if ctx.get_start_method() == "forkserver" else None
        self.restarts_engines = False  # a dead process stops the run
        # An engine process starts once per run, with the run's starting weights: it generates
        # before the trainer is up (EngineWorker.attach_first).
        self.engines_start_unattached = True
        num_engines = num_engines or cfg.runtime.num_engines
        self._lent_threads = _threads_after_training(cfg, num_engines)
        self.inbox = ctx.Queue()
        self.logs = LogForwarder(ctx)
        engine_cfg = cfg.engine.model_copy(update={"version": engine_version})
        engine_qs = [ctx.Queue() for _ in range(num_engines)]
        self.engines = []
        for i, q in enumerate(engine_qs):
            name = "engine" if num_engines == 1 else f"engine{i}"
            args = (engine_model_path, engine_cfg, self.inbox, q, name, trace_dir, False)  # attach_first
            h = WorkerHandle(name, run_engine_worker, args, ctx, cmd_q=q, logs=self.logs, env=env)
            h.load = 0  # samples in flight on this engine, for routing
            self.engines.append(h)
        trainer_q = ctx.Queue()
        world = cfg.trainer.world_size
        rdv = None
        if world > 1:
            from tokenflow.sync.broadcast import free_port
            from tokenflow.trainer.distributed import Rendezvous

            rdv = Rendezvous("127.0.0.1", free_port(), world, cfg.trainer.collective_timeout_s)
        self.trainer_ranks = []
        for rank in range(world):
            name = "trainer" if rank == 0 else f"trainer{rank}"
            self.trainer_ranks.append(WorkerHandle(
                name, run_trainer_worker, (trainer_model_path, cfg, self.inbox, trainer_q if rank == 0 else None,
                                           engine_qs if rank == 0 else [], resume_dir, name, trace_dir, rank, rdv),
                ctx, cmd_q=trainer_q if rank == 0 else None, logs=self.logs, env=env))
        self.trainer = self.trainer_ranks[0]

    @property
    def all_workers(self) -> list[WorkerHandle]:
        """The workers the orchestrator hears from (ranks > 0 only talk to rank 0)."""
        return [*self.engines, self.trainer]

    def start(self) -> "LocalBackend":
        for w in [*self.engines, *self.trainer_ranks]:
            w.start()
        return self

    def recv(self, timeout: float):
        try:
            return self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return None

    def broadcast(self, msg) -> None:
        for e in self.engines:
            e.send(msg)

    def lend_trainer_threads(self) -> None:
        """After the last step: the engines take the trainer's CPU threads for the final
        evaluation (one machine; see :func:`_threads_after_training`)."""
        if self._lent_threads is not None:
            self.broadcast(SetThreads(self._lent_threads))

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
        self.logs.stop()


def _threads_after_training(cfg, num_engines: int) -> int | None:
    """Each engine's torch threads once the trainer is done, or None to leave them: only when
    both sides are pinned to CPU threads and the engine is the built-in one (the default run's
    final evaluation: 0.54-0.61 s with one engine thread, 0.42-0.47 s with two)."""
    e, t = cfg.engine, cfg.trainer
    if not e.threads or not t.threads or e.backend != "builtin" or "cuda" in (e.device, t.device):
        return None
    extra = t.threads * t.world_size // num_engines
    return e.threads + extra if extra else None
