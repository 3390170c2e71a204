"""Worker processes: spawning them, and making their failures reach the orchestrator at once.

A worker's entry point runs inside :func:`worker_main`, which turns any exception into a
``WorkerFailed`` message (with the traceback) on the shared result queue before exiting. A
worker that dies without a word (SIGKILL, a segfault, out of memory) is caught by
:meth:`WorkerHandle.check`, which the orchestrator calls on every turn of its loop; it also keeps
the worker's peak resident memory, and says whether the kernel's out-of-memory killer ended it
(`tokenflow.runtime.workers.memory_watch`).

A worker's log records do not go to its own stderr, where they would tear the parent's live
progress bar: a ``QueueHandler`` sends them to the parent, where :class:`LogForwarder` hands each
to the parent's logging (and so to the console handler that prints above the bar). What the
worker writes to its stdout and stderr directly travels the same way, as records
(`tokenflow.runtime.workers.output_capture`).
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing as mp
import os
import threading
import traceback

from tokenflow.errors import CheckpointError, WorkerDied
from tokenflow.runtime.workers.memory_watch import OomCounters, RssPeak, describe_death
from tokenflow.runtime.workers.messages import Envelope, WorkerFailed

log = logging.getLogger(__name__)


def quiet_third_party_progress() -> None:
    """Silence transformers' and huggingface_hub's tqdm bars ("Loading weights", "Writing model
    shards"): in a worker they would print through the parent's progress view."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import huggingface_hub.utils
    import transformers.utils.logging

    huggingface_hub.utils.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def worker_main(name: str, out_q, body) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")  # no-op under a LogForwarder (the root logger has its handler)
    quiet_third_party_progress()
    try:
        body()
    except KeyboardInterrupt:
        pass
    except BaseException as e:  # noqa: BLE001 - everything must reach the orchestrator
        out_q.put(Envelope(name, WorkerFailed(name, f"{type(e).__name__}: {e}", traceback.format_exc(),
                                              user_error=isinstance(e, CheckpointError))))
        raise SystemExit(1) from None


def _forwarded_entry(log_q, level: int, target, args: tuple, env: dict | None = None) -> None:
    """A started worker's first code: take on the parent's environment (a fork server's child
    has the server's), route every log record to the parent, then run ``target``."""
    from tokenflow.runtime.workers.os_environ import apply_environment

    apply_environment(env)
    if log_q is None:
        target(*args)
        return
    from tokenflow.runtime.workers.output_capture import capture_worker_output

    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(log_q)]
    root.setLevel(level)
    capture = capture_worker_output()  # what the worker prints directly becomes records too
    try:
        target(*args)
    finally:
        capture.close()


class LogForwarder:
    """Receives the workers' log records in the parent and hands each to the parent's logging,
    so they print through whatever handler the parent has (the rich console above the live bar,
    or plain lines). The level is the parent's: workers filter at it before sending."""

    def __init__(self, ctx) -> None:
        self.queue = ctx.Queue()
        self.level = logging.getLogger().getEffectiveLevel()
        self._thread = threading.Thread(target=self._pump, name="tokenflow-log-forwarder", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                record = self.queue.get()
            except (EOFError, OSError):
                return
            if record is None:
                return
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)

    def stop(self) -> None:
        """After the workers have exited: print what they sent last, then stop."""
        self.queue.put(None)
        self._thread.join(timeout=5)


class ParentWatch:
    """Lets a worker notice that the orchestrator is gone (killed), so it exits instead of lingering."""

    def __init__(self) -> None:
        from tokenflow.runtime.workers.os_environ import ORCHESTRATOR_PID

        self.parent = os.getppid()
        pid = os.environ.get(ORCHESTRATOR_PID)
        # A worker forked from the fork server: its parent is the server, so watch the
        # orchestrator itself.
        self.orchestrator = int(pid) if pid and int(pid) != self.parent else None

    def orphaned(self) -> bool:
        if os.getppid() != self.parent:
            return True
        if self.orchestrator is not None:
            try:
                os.kill(self.orchestrator, 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # alive, under another user (a reused pid, at worst)
                pass
        return False


class WorkerHandle:
    """A spawned worker process and its command queue."""

    load = 0  # samples in flight on this engine, kept by the orchestrator for routing
    accepting = True  # the local backend has no joining engines

    def __init__(self, name: str, target, args: tuple, ctx=None, cmd_q=None,
                 logs: LogForwarder | None = None, env: dict | None = None,
                 oom: OomCounters | None = None, cfg=None) -> None:
        self._ctx = ctx or mp.get_context("spawn")
        self.name = name
        # Its peak resident memory (sampled by check), and what a death by SIGKILL is told by:
        # the kernel's out-of-memory counters, and the run's config (the settings that bound it).
        self.rss, self.oom, self.cfg = RssPeak(), oom, cfg
        self.cmd_q = cmd_q if cmd_q is not None else self._ctx.Queue()
        self._target, self._logs, self._env = target, logs, env
        self.retired: list = []  # queues of the processes this handle replaced (see renew)
        self.process = self._process(args)

    def _process(self, args: tuple):
        target = self._target
        if self._logs is not None or self._env is not None:
            logs = self._logs
            target, args = _forwarded_entry, (logs.queue if logs else None, logs.level if logs else 0, target,
                                              args, self._env)
        return self._ctx.Process(target=target, args=args, name=f"tokenflow-{self.name}", daemon=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> "WorkerHandle":
        self.process.start()
        log.debug("started %s (pid %s)", self.name, self.process.pid)
        return self

    def send(self, msg) -> None:
        self.cmd_q.put(msg)

    def check(self) -> None:
        """Raise ``WorkerDied`` if the process has exited unexpectedly."""
        code = self.process.exitcode
        if code is None:
            self.rss.sample(self.process.pid)
        elif code != 0:
            message, cause = describe_death(self.name, self.process.pid, code, self.rss.process_peak, self.oom,
                                            self.cfg)
            raise WorkerDied(message, worker=self.name, cause=cause, peak_rss_gb=RssPeak.gb(self.rss.process_peak))

    def renew(self, args: tuple, cmd_q) -> "WorkerHandle":
        """The same worker in a new process (not started), reading ``cmd_q``: the process it
        replaces is dead or is killed here first. Its old queue is dropped unjoined (what a dead
        reader never took stays with it; it may have died holding the queue's lock). The old
        queue is kept, not collected: collecting it unlinks its semaphores, and a worker still
        starting (a trainer unpickling the engines' queues) would fail to open them."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        old, self.cmd_q = self.cmd_q, cmd_q
        if old is not cmd_q:
            old.cancel_join_thread()
            old.close()
            self.retired.append(old)
        self.process = self._process(args)
        self.rss.new_process()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.is_alive():
            self.rss.sample(self.process.pid, force=True)
            self.process.join(timeout)
        if self.process.is_alive():
            log.warning("%s did not stop within %gs; killing it", self.name, timeout)
            self.process.kill()
            self.process.join(5)
