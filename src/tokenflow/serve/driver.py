"""`EngineDriver`: one thread steps the engine for every HTTP request at once.

::

    event loop (HTTP handlers)                  engine thread
    ──────────────────────────                  ─────────────
    submit(prompt, params) ──── commands ─────► engine.add_request (InvalidRequest → the caller)
                 ▲                              engine.step()                 ─► finished rollouts
                 │ one asyncio.Queue            engine.new_tokens(streamed)   ─► token deltas
                 └──── per request ◄── call_soon_threadsafe, once per step
    cancel(request) ─── commands ─────────────► engine.abort(request_id)

Requests join and leave the engine's batch at every step (continuous batching across
connections). A training engine worker, which steps its engine itself, drives the same object
from its own loop instead of a thread (`attach`, `pump`, `dispatch`): session traffic and
training groups then share one engine and one batch. Past ``max_num_seqs`` running samples, new
requests wait in the engine's queue; the service bounds what it admits there (requests and
tokens in flight, `tokenflow.serve.limits`). Handlers never touch the engine, so a slow step
never blocks the event loop, and the engine is only ever called from this thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import queue
import threading
from dataclasses import dataclass

from tokenflow.engine.base import TokenDelta
from tokenflow.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class DriverClosed(RuntimeError):
    """The server is shutting down (or its engine failed): no new requests."""


class EngineFailed(RuntimeError):
    """The engine raised while this request ran; the message is for the log, not the client."""


@dataclass(eq=False)
class Submission:
    """One engine request (a prompt and its n samples) and the queue its events arrive on:
    `TokenDelta` (streamed requests), `Rollout` (a sample finished), `EngineFailed` / `DriverClosed`."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    events: asyncio.Queue
    pending: int
    """Samples not finished yet."""


class EngineDriver:
    """Owns a `RolloutEngine` for a server: `start` it on the server's event loop, `submit`
    requests from handlers, `close` it when the server stops (the caller closes the engine)."""

    def __init__(self, engine, *, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, Submission] = {}
        self._streamed: set[str] = set()
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._external = False
        """Stepped by its owner (`attach`) rather than by a thread of its own."""
        self._stopping = threading.Event()
        self._gate = threading.Lock()
        """Held while a command is queued and while stopping: no request is queued after the
        engine thread's last look at the queue."""
        self.failure: BaseException | None = None
        """What broke the engine thread, if anything (the server then answers 503)."""

    # -- event-loop side ----------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="tokenflow-serve-engine", daemon=True)
        self._thread.start()

    def attach(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Serve without a thread: the engine's owner calls `pump` before and `dispatch` after
        each of its own ``engine.step()`` calls, from the one thread that uses the engine."""
        self._loop = loop or asyncio.get_running_loop()
        self._external = True

    @property
    def running(self) -> bool:
        if self._external:
            return not self._stopping.is_set()
        return self._thread is not None and self._thread.is_alive() and not self._stopping.is_set()

    async def submit(self, requests: list[tuple[list[int], SamplingParams]], *, stream: bool = False,
                     events: asyncio.Queue | None = None) -> list[Submission]:
        """Queue one call's requests (prompt ids, params) together, so that they are admitted
        in one step; returns once the engine has accepted all of them. Their events go to
        ``events`` (one queue for the call). Raises the engine's `InvalidRequest` for a bad
        request (none of the call's then runs), `DriverClosed` when the server is stopping."""
        events = events if events is not None else asyncio.Queue()
        subs = [Submission(f"srv-{next(self._ids)}", list(prompt), params, stream, events, params.n)
                for prompt, params in requests]
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        with self._gate:
            if not self.running:
                raise DriverClosed("the server is shutting down" if self.failure is None else "the engine failed")
            self._commands.put(("add", subs, accepted))
        try:
            await asyncio.wrap_future(accepted)
        except asyncio.CancelledError:  # the caller went away: whatever was added stops
            self.cancel(subs)
            raise
        return subs

    def cancel(self, subs: list[Submission]) -> None:
        """Stop requests nobody waits for any more (a client went away); thread-safe."""
        running = [sub for sub in subs if sub.pending]
        if running:
            self._commands.put(("abort", running, None))

    def abort_all(self, reason: str = "the server is shutting down") -> None:
        """Abort every request running for a client; their callers get `DriverClosed` (a stop
        whose time is nearly up). Thread-safe; new requests are still taken."""
        self._commands.put(("abort_all", reason, None))

    @property
    def in_flight(self) -> int:
        """Requests (prompts) running in the engine for clients."""
        return len(self._live)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the engine thread; requests still running get `DriverClosed`. Attached: call it
        from the engine's thread (it aborts what is still running)."""
        with self._gate:
            self._stopping.set()
            self._commands.put(("stop", None, None))
        if self._external:
            for sub in list(self._live.values()):
                self.engine.abort(sub.request_id)
            self._fail_all(DriverClosed("the server is shutting down"))
            self._refuse_waiting_commands()
            return
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("serve: the engine thread did not stop within %.0f s", timeout_s)

    # -- engine thread ------------------------------------------------------------------------

    def pump(self) -> None:
        """Attached: admit the requests handlers queued since the last call (never blocks)."""
        self._take_commands(block=False)

    @property
    def busy(self) -> bool:
        """Whether some request runs in the engine for a client."""
        return bool(self._live)

    def dispatch(self, finished: list) -> list:
        """Attached: after ``engine.step()``, hand the driver's rollouts and streamed tokens to
        their callers; returns the finished rollouts that are not the driver's. A sample an
        abort-mode weight swap stopped continues from its prefix, as training samples do."""
        mine, others = [], []
        for r in finished:
            sub = self._live.get(r.request_id)
            if sub is None:
                others.append(r)
            elif r.finish_reason == "abort":
                self.engine.add_request(sub.prompt_ids, dataclasses.replace(sub.params, n=1),
                                        request_id=sub.request_id, resume=r)
            else:
                mine.append(r)
        self._deliver_step(mine)
        return others

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._take_commands(block=not self.engine.has_unfinished())
                if self._stopping.is_set():
                    break
                if self.engine.has_unfinished():
                    self._step()
        except BaseException as e:  # noqa: BLE001 - whatever broke the engine reaches every waiter
            logger.exception("serve: the engine failed; no more requests will be served")
            self.failure = e
            with self._gate:
                self._stopping.set()
            self._fail_all(EngineFailed(f"{type(e).__name__}: {e}"))
            self._refuse_waiting_commands()
            return
        self._fail_all(DriverClosed("the server is shutting down"))
        self._refuse_waiting_commands()

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=self.idle_wait_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, kind: str, subs: list[Submission] | None, accepted) -> None:
        if kind == "add":
            added = []
            try:
                for sub in subs:
                    self.engine.add_request(sub.prompt_ids, sub.params, request_id=sub.request_id)
                    added.append(sub)
            except Exception as e:  # noqa: BLE001 - InvalidRequest and the like go back to the caller
                for sub in added:
                    self.engine.abort(sub.request_id)  # its partials come back from step() and are dropped
                accepted.set_exception(e)
                return
            for sub in subs:
                self._live[sub.request_id] = sub
                if sub.stream:
                    self._streamed.add(sub.request_id)
            accepted.set_result(None)
        elif kind == "abort":
            for sub in subs:
                if sub.request_id in self._live:
                    self._forget(sub)
                    self.engine.abort(sub.request_id)
        elif kind == "abort_all":
            for sub in list(self._live.values()):
                self.engine.abort(sub.request_id)
            self._fail_all(DriverClosed(subs))

    def _step(self) -> None:
        self._deliver_step(self.engine.step())

    def _deliver_step(self, finished: list) -> None:
        deltas: list[TokenDelta] = self.engine.new_tokens(self._streamed) if self._streamed else []
        events: list[tuple[Submission, object]] = []
        for d in deltas:
            sub = self._live.get(d.request_id)
            if sub is not None:
                events.append((sub, d))
        for rollout in finished:
            sub = self._live.get(rollout.request_id)
            if sub is None:
                continue  # aborted for a client that went away
            events.append((sub, rollout))
            sub.pending -= 1
            if sub.pending == 0:
                self._forget(sub)
        if events:
            self._deliver(events)

    def _forget(self, sub: Submission) -> None:
        self._live.pop(sub.request_id, None)
        self._streamed.discard(sub.request_id)

    def _deliver(self, events: list[tuple[Submission, object]]) -> None:
        def put_all() -> None:
            for sub, event in events:
                sub.events.put_nowait(event)

        try:
            self._loop.call_soon_threadsafe(put_all)
        except RuntimeError:  # the event loop is closed: nobody is waiting
            pass

    def _fail_all(self, error: BaseException) -> None:
        live = list(self._live.values())
        self._live.clear()
        self._streamed.clear()
        if live:
            self._deliver([(sub, error) for sub in live])

    def _refuse_waiting_commands(self) -> None:
        while True:
            try:
                kind, _, accepted = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                accepted.set_exception(DriverClosed("the server is shutting down"))

