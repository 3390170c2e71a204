"""How the local backend's engine and trainer processes start (``runtime.start_method``).

"spawn" starts each worker as a fresh interpreter, which then imports torch, transformers and
the engine or trainer code itself: a second or more per worker, all of it before the worker can
load its model. "forkserver" (the default) starts multiprocessing's fork server at the very
beginning of a run, before its input checks (``launch.train`` calls :func:`warm`), and the
server imports all of that once (``tokenflow.runtime.backends.local.preload``) while the checks run in the
parent; each worker is then forked from it, already holding the modules, and only loads its
model. The server is a clean process: it never ran a model nor started a thread, so forking it
is safe where forking the orchestrator (which has torch threads) is not.

Two things a fork server changes, and how they are kept as with spawn:

* A forked worker inherits the server's environment, taken when the server started, not the
  orchestrator's when the worker starts (the run's tag, ``TOKENFLOW_RUN_TAG``, is set later,
  for one). :func:`environment` snapshots the orchestrator's, and the worker's entry puts it in
  place before anything else (``tokenflow.runtime.workers.os_environ``).
* A worker's parent is the server, not the orchestrator, and the server does not exit while
  its children live (each inherits the write end of the pipe it watches). So a worker watches
  the orchestrator's pid, which it gets in its environment (``ORCHESTRATOR_PID``,
  ``workers.ParentWatch``); once the workers have exited, the server sees its pipe close and
  exits too.

A forked worker also ends with ``os._exit`` once its queues are flushed, skipping the seconds a
torch process spends tearing down its interpreter.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal

log = logging.getLogger(__name__)

PRELOAD = "tokenflow.runtime.backends.local.preload"


def available(method: str) -> bool:
    return method in mp.get_all_start_methods()


def context(method: str = "spawn"):
    """The multiprocessing context workers start in (spawn where a fork server is unavailable)."""
    if method == "forkserver" and available("forkserver"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([PRELOAD])
        return ctx
    return mp.get_context("spawn")


def warm(method: str) -> None:
    """Start the fork server now, so that its imports overlap whatever this process does next.
    Returns at once; the first worker's start waits for the imports to finish. A no-op for
    spawn, and when the server already runs (a second run in the same process)."""
    if method != "forkserver" or not available("forkserver"):
        return
    from multiprocessing import forkserver

    context(method)  # sets the preload list
    try:
        forkserver.ensure_running()
    except Exception as e:  # noqa: BLE001 - the workers' start will try again and report
        log.debug("could not start the fork server early: %s", e)


def stop() -> None:
    """Stop a fork server :func:`warm` started for nothing (the run turned out to use spawn or
    Ray), rather than leave its memory held until this process exits."""
    if not available("forkserver"):
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver  # noqa: SLF001 - the module's one server
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        server._stop()  # noqa: SLF001 - closes its pipe, reaps it, removes its socket
    except Exception as e:  # noqa: BLE001 - another Python's internals: leave it to exit with us
        log.debug("could not stop the fork server: %s", e)
