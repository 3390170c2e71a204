"""Worker processes: spawning them, and making their failures reach the orchestrator at once.

A worker's entry point runs inside :func:`worker_main`, which turns any exception into a
``WorkerFailed`` message (with the traceback) on the shared result queue before exiting. A
worker that dies without a word (SIGKILL, a segfault, out of memory) is caught by
:meth:`WorkerHandle.check`, which the orchestrator calls on every turn of its loop.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import traceback

from tokenflow.runtime.messages import Envelope, WorkerFailed

log = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    pass


def worker_main(name: str, out_q, body) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        body()
    except KeyboardInterrupt:
        pass
    except BaseException as e:  # noqa: BLE001 - everything must reach the orchestrator
        out_q.put(Envelope(name, WorkerFailed(name, f"{type(e).__name__}: {e}", traceback.format_exc())))
        raise SystemExit(1) from None


class ParentWatch:
    """Lets a worker notice that the orchestrator is gone (killed), so it exits instead of lingering."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def orphaned(self) -> bool:
        return os.getppid() != self.parent


class WorkerHandle:
    """A spawned worker process and its command queue."""

    def __init__(self, name: str, target, args: tuple, ctx=None, cmd_q=None) -> None:
        ctx = ctx or mp.get_context("spawn")
        self.name = name
        self.cmd_q = cmd_q if cmd_q is not None else ctx.Queue()
        self.process = ctx.Process(target=target, args=args, name=f"tokenflow-{name}", daemon=True)

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
        if code is not None and code != 0:
            raise WorkerDied(f"the {self.name} process (pid {self.process.pid}) died with exit code {code}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.is_alive():
            self.process.join(timeout)
        if self.process.is_alive():
            log.warning("%s did not stop within %gs; killing it", self.name, timeout)
            self.process.kill()
            self.process.join(5)
