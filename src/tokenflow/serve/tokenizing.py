"""`TokenizerThread`: the one thread that renders chat templates and tokenizes prompts, with a
time bound that fails the request, not the server.

A model folder's chat template is code (Jinja): one that loops (nested ``range`` loops, a
recursive macro) would hold a plain worker thread forever, and every later chat call would wait
behind it. Here each job has ``timeout_s`` from the moment the thread starts it. Past it:

* the call fails (`render_timeout`: a 400, ``chat_template_timeout``);
* the thread is retired: `RenderTimeout` is raised inside it (``PyThreadState_SetAsyncExc``),
  which stops it at its next bytecode — a Jinja template is compiled Python, so a looping one
  stops within the interpreter's switch interval;
* a new thread takes over at once, with the jobs that were queued behind the stuck one.

Why a thread and not a process: the tokenizer and its template stay in the server's process (no
second copy, no start-up, no pickling per call: a chat render costs ~1 ms), and a looping
template can be stopped from outside because it runs Python bytecode. What cannot be stopped is
a thread stuck in C (a tokenizer's Rust code, a huge string built in one operation): it is
abandoned, and while `max_stuck` of those are still alive, calls get a 503 instead of piling up.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import queue
import threading
import time

from tokenflow.serve.errors import APIError, bad_request, unavailable

logger = logging.getLogger(__name__)


class RenderTimeout(BaseException):
    """Raised inside a tokenizer thread whose job ran past its time (a BaseException, so that
    templates' and tokenizers' ``except Exception`` blocks let it through)."""


def render_timeout(timeout_s: float) -> APIError:
    return bad_request(f"Rendering the chat template and tokenizing this request took longer than {timeout_s:g} s "
                       "(serve.render_timeout_s); it was stopped. The model's chat template may loop on this "
                       "conversation.", "messages", "chat_template_timeout")


class _Job:
    __slots__ = ("fn", "args", "future", "loop", "started", "worker")

    def __init__(self, fn, args, future, loop) -> None:
        self.fn, self.args, self.future, self.loop = fn, args, future, loop
        self.started: float | None = None
        self.worker: _Worker | None = None


class _Worker:
    """One thread and its queue; ``retired`` once it has been given up on."""

    def __init__(self, name: str, handoff) -> None:
        self.handoff = handoff
        """Where a job this thread took after it was retired goes (the current worker)."""
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.retired = threading.Event()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while not self.retired.is_set():
                job = self.queue.get()
                if job is None or self.retired.is_set():
                    if job is not None:
                        self.handoff(job)
                    return
                if job.future.cancelled():  # its client went away while it waited
                    continue
                job.worker = self
                job.started = time.monotonic()
                try:
                    result, error = job.fn(*job.args), None
                except RenderTimeout:
                    return
                except BaseException as e:  # noqa: BLE001 - handed to the awaiting call
                    result, error = None, e
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)
        except RenderTimeout:  # arrived late, between jobs: this thread was retired anyway
            return


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class TokenizerThread:
    """``await tokenizing.run(fn, *args)``: ``fn(*args)`` in the tokenizer thread, within
    ``timeout_s`` of its start (else a 400, and the thread is replaced). One thread at a time
    runs jobs: one tokenizer is not called from two threads at once."""

    def __init__(self, timeout_s: float, *, max_stuck: int = 4, name: str = "tokenflow-serve-tokenize") -> None:
        self.timeout_s = timeout_s
        self.max_stuck = max_stuck
        self.name = name
        self.timeouts = 0
        """Jobs stopped at their deadline so far."""
        self.stuck: list[threading.Thread] = []
        """Retired threads that may still be running."""
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    async def run(self, fn, *args):
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop.create_future(), loop)
        with self._lock:
            self.stuck = [t for t in self.stuck if t.is_alive()]
            if len(self.stuck) >= self.max_stuck:
                raise unavailable(f"{len(self.stuck)} tokenizer threads are stuck past their time "
                                  "(serve.render_timeout_s) and cannot be stopped; restart the server")
            if self._worker is None:
                self._worker = _Worker(self.name, self._handoff)
            self._worker.queue.put(job)
        wait = self.timeout_s
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(job.future), wait)
            except TimeoutError:
                started = job.started
                if started is None:  # still queued behind another job, which has its own deadline
                    wait = self.timeout_s
                    continue
                left = started + self.timeout_s - time.monotonic()
                if left > 0:
                    wait = left
                    continue
                if job.future.done():
                    return job.future.result()
                job.future.cancel()
                self._retire(job.worker)
                raise render_timeout(self.timeout_s) from None
            except asyncio.CancelledError:
                job.future.cancel()
                raise

    def _retire(self, worker: _Worker) -> None:
        """Stop ``worker``'s thread (its job ran past its time) and hand its queue to a new one."""
        self.timeouts += 1
        with self._lock:
            if self._worker is not worker:
                return
            worker.retired.set()
            stopped = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.thread.ident),
                                                                 ctypes.py_object(RenderTimeout))
            self._worker = fresh = _Worker(self.name, self._handoff)
            while True:  # the jobs queued behind the stuck one go on in the new thread
                try:
                    job = worker.queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    fresh.queue.put(job)
            worker.queue.put(None)  # wakes the old thread if it got out and waits for work
            self.stuck.append(worker.thread)
        logger.warning("serve: a chat template render or tokenization ran past %g s (serve.render_timeout_s); "
                       "its request failed and its thread was %s", self.timeout_s,
                       "stopped" if stopped == 1 else "abandoned")

    def _handoff(self, job: _Job) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = _Worker(self.name, self._handoff)
            self._worker.queue.put(job)

    def close(self) -> None:
        """Let the thread go (the server has stopped)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.retired.set()
            worker.queue.put(None)
