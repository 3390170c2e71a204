"""The Ray side of a worker: an actor that runs the same worker loop the local backend spawns.

    orchestrator ──deliver(msg)──► WorkerActor ──queue.Queue──► EngineWorker / TrainerWorker loop
         ▲                           (Ray actor)                 (a thread of the actor process)
         └──────────── ray.util.queue.Queue ◄──── out_q.put(Envelope) ─────────┘

The loops (``EngineWorker``, ``TrainerWorker``) read commands with ``get(timeout)`` /
``get_nowait`` and write envelopes with ``put``; here the command queue is a plain
``queue.Queue`` inside the actor, filled by ``deliver`` calls, so the loop polls it for free
between decode steps. ``WorkerActor`` is a synchronous single-threaded actor on purpose: Ray runs
such an actor's calls from one sender in the order they were sent (threaded and async actors
give no such guarantee), and the engine relies on that order (``Generate`` before ``AbortKind``,
``WeightsReady`` v before v + 1). The loop itself runs in a thread the actor starts, so
``deliver`` is never stuck behind it.

Messages travel as pickled dataclasses; their NumPy arrays (``Rollout`` records) go out of band,
so a large ``Train`` batch lands in the object store and the trainer reads it zero-copy.
"""

from __future__ import annotations

import os
import queue
import threading

from tokenflow.runtime.workers.process import worker_main


class WorkerActor:
    """Wrapped with ``ray.remote`` by the backend (this module does not import Ray)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cmd_q: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None
        self.exit_code: int | None = None

    def info(self) -> dict:
        """Where this actor runs and whether its loop still runs (``exit_code`` None while it
        does); answering at all proves the process is up."""
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "exit_code": self.poll()}

    def free_port(self) -> int:
        from tokenflow.sync.broadcast import free_port

        return free_port()

    def start(self, body, *args) -> None:
        """Run ``body(name, cmd_q, *args)`` in a thread; its exit code is kept for ``poll``."""
        def target() -> None:
            try:
                body(self.name, self.cmd_q, *args)
                self.exit_code = 0
            except SystemExit as e:  # worker_main's way of saying the body failed
                self.exit_code = e.code if isinstance(e.code, int) else 1

        self.exit_code = None
        self.thread = threading.Thread(target=target, name=f"tokenflow-{self.name}", daemon=True)
        self.thread.start()

    def deliver(self, msg) -> None:
        self.cmd_q.put(msg)

    def poll(self) -> int | None:
        """None while the loop runs; its exit code once it has returned (0: a clean Shutdown)."""
        if self.thread is not None and self.thread.is_alive():
            return None
        return self.exit_code if self.thread is not None else None


class ActorInbox:
    """A worker's command queue as seen from another process: ``put`` is a ``deliver`` call.
    Fire-and-forget: a message to an engine that is restarting may be lost, which is safe
    (the orchestrator re-sends what matters when the replacement is up)."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def put(self, msg) -> None:
        self.actor.deliver.remote(msg)


def engine_body(name, cmd_q, model_path, engine_cfg, out_q, trace_dir) -> None:
    from tokenflow.runtime.workers.engine_worker import EngineWorker

    worker_main(name, out_q, lambda: EngineWorker(model_path, engine_cfg, out_q, cmd_q, name, trace_dir).loop())


def trainer_body(name, cmd_q, model_path, cfg, out_q, engine_actors, resume_dir, trace_dir, rank, rdv) -> None:
    from tokenflow.runtime.workers.trainer_worker import TrainerWorker

    engine_qs = [ActorInbox(a) for a in engine_actors]
    worker_main(name, out_q, lambda: TrainerWorker(model_path, cfg, out_q, cmd_q, engine_qs, resume_dir,
                                                   name, trace_dir, rank, rdv).loop())
