"""Agent tasks: any code that talks to an OpenAI endpoint, played and recorded as rollouts.

    Generate(episode.agent) ─► open n sessions ─► agent(base_url, example) on a thread ─┐
                                                                                         │ HTTP
    engine worker loop: pump() ─► engine.step() ─► dispatch() ◄── /sessions/{id}/v1 ◄───┘
                                                                                         │
    poll(): agent returned ─► session calls → rows ─► Generated (scored by the rubric) ◄┘

The engine worker serves ``/sessions/{id}/v1`` on a loopback port (`SessionService`, on the
same engine as training, stepped by the worker's own loop), and calls the task's agent function
once per sample with that session's base URL and the task example. The agent uses the plain
``openai`` client; every call is recorded (`tokenflow.serve.sessions`). When the agent returns,
the session's calls become rows: a call whose prompt ids extend the row so far (the previous
calls' prompt and sampled ids, then what the agent added) continues it, the ids in between
entering as environment tokens (loss mask 0); any other call starts a new row. The group goes
back when every sample's agent has returned, failed or run past ``episode.agent_timeout_s``;
the task's rubric scores it (`tokenflow.scoring.episodes`), with the agent's return value in
``state["result"]``.

Session traffic is the traffic of admitted groups, so admission control, staleness bounds and
in-flight weight updates apply to it as to any other: each token carries the version that
sampled it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from tokenflow.rollout import Rollout

log = logging.getLogger(__name__)

MAX_AGENT_THREADS = 512
"""Agent functions run on a thread each (they wait on HTTP most of the time)."""


def load_agent(spec: str):
    """The agent function ``spec`` names ("module:function" or "path/file.py:function")."""
    from tokenflow.tasks.reward_loading import load_attribute

    if ":" not in spec:
        raise ValueError(f"task.agent = {spec!r} must be 'module:function' or 'path/to/file.py:function'")
    fn = load_attribute(spec, what="agent", key="task.agent", noun="function", error=ValueError)
    if not callable(fn):
        raise ValueError(f"task.agent = {spec!r} is not a function; it must take (base_url, example)")
    try:
        inspect.signature(fn).bind("http://127.0.0.1/v1", {})
    except TypeError:
        raise ValueError(f"task.agent = {spec!r} must take two arguments, (base_url, example); "
                         f"its signature is {inspect.signature(fn)}") from None
    return fn


@dataclass
class _Sample:
    request_id: str
    index: int
    group_id: int
    prompt_id: int
    session_id: str
    future: Future | None = None
    deadline: float = 0.0
    result: object = None
    error: str | None = None
    done: bool = False


@dataclass
class _Request:
    params: object
    spec: object
    samples: list[_Sample] = field(default_factory=list)


class AgentDriver:
    """Runs the samples of agent tasks on ``engine`` (see the module docstring). Every method
    is called from the engine's thread."""

    def __init__(self, engine) -> None:
        from fastapi import FastAPI

        from tokenflow.serve import errors
        from tokenflow.serve.app import openai_router
        from tokenflow.serve.driver import EngineDriver
        from tokenflow.serve.server import BackgroundServer
        from tokenflow.serve.sessions import SessionService

        if engine.tokenizer is None:
            raise ValueError("agent tasks need the model's tokenizer (with a chat template) in the model folder")
        # Agents' HTTP clients log one line per call at INFO: that would bury the run's log.
        for name in ("httpx", "httpx2"):  # openai 3 sends through httpx2
            logging.getLogger(name).setLevel(logging.WARNING)
        self.engine = engine
        self.gateway = EngineDriver(engine)
        self.service = SessionService(self.gateway)
        gateway = self.gateway

        async def lifespan(app):
            gateway.attach(asyncio.get_running_loop())
            yield

        from contextlib import asynccontextmanager

        app = FastAPI(title="tokenflow sessions", lifespan=asynccontextmanager(lifespan))
        app.state.service = self.service
        errors.install(app)
        app.include_router(openai_router(self.service, prefix="/sessions/{session_id}/v1", tags=["sessions"]))
        self.server = BackgroundServer(app).__enter__()
        self.base_url = self.server.url
        self._pool = ThreadPoolExecutor(max_workers=MAX_AGENT_THREADS, thread_name_prefix="agent")
        self._loop = None  # an EnvLoop, for agents written as ``async def``
        self._functions: dict[str, object] = {}
        self._requests: dict[str, _Request] = {}

    # ---- requests ----------------------------------------------------------------------------
    def owns(self, request_id: str) -> bool:
        return request_id in self._requests

    def start(self, request_id: str, spec, params, group_id: int, prompt_id: int) -> None:
        """Open the ``params.n`` sessions of one request and start its agents."""
        from tokenflow.runtime.drivers.drive import seed_of

        fn = self._functions.get(spec.agent)
        if fn is None:
            fn = self._functions[spec.agent] = load_agent(spec.agent)
        req = _Request(params, spec)
        for i in range(params.n):
            sid = f"{request_id}.{i}.{secrets.token_hex(4)}"
            self.service.open(sid, params, seed_of(params, i))
            sample = _Sample(request_id, i, group_id, prompt_id, sid)
            sample.deadline = time.monotonic() + spec.agent_timeout_s
            url = f"{self.base_url}/sessions/{sid}/v1"
            if inspect.iscoroutinefunction(fn):
                if self._loop is None:
                    from tokenflow.runtime.drivers.env_loop import EnvLoop

                    self._loop = EnvLoop()
                sample.future = self._loop.submit(lambda url=url: fn(url, dict(spec.example)), spec.agent_timeout_s)
            else:
                sample.future = self._pool.submit(fn, url, dict(spec.example))
            req.samples.append(sample)
        self._requests[request_id] = req

    def abort(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        for s in req.samples:
            self._end(s)

    @property
    def active(self) -> bool:
        """Whether some agent is running (the worker then polls for its calls often)."""
        return bool(self._requests)

    # ---- engine side -------------------------------------------------------------------------
    def pump(self) -> None:
        """Admit the calls agents made since the last engine step."""
        self.gateway.pump()

    def dispatch(self, finished: list[Rollout]) -> list[Rollout]:
        """Deliver the session calls' results; returns the rollouts that are not theirs."""
        return self.gateway.dispatch(finished)

    def poll(self) -> list[tuple[str, list[Rollout]]]:
        """``(request id, rows)`` of every request whose agents have all ended."""
        now = time.monotonic()
        out = []
        for rid, req in list(self._requests.items()):
            for s in req.samples:
                if s.done:
                    continue
                if s.future.done():
                    try:
                        s.result = s.future.result()
                    except (asyncio.TimeoutError, TimeoutError):
                        s.error = f"the agent did not return within {req.spec.agent_timeout_s:g}s (episode.agent_timeout_s)"
                    except Exception as e:  # noqa: BLE001 - an agent may raise anything
                        s.error = f"the agent raised {type(e).__name__}: {e}"
                elif now > s.deadline:
                    s.error = f"the agent did not return within {req.spec.agent_timeout_s:g}s (episode.agent_timeout_s)"
                else:
                    continue
                s.done = True
                if s.error is not None:
                    log.warning("agent sample %s/%d failed: %s", rid, s.index, s.error)
            if all(s.done for s in req.samples):
                rows = []
                for s in req.samples:
                    session = self._end(s)
                    rows.extend(session_rows(session.calls if session else [], s, req.spec, s.result, s.error))
                del self._requests[rid]
                out.append((rid, rows))
        return out

    def _end(self, s: _Sample):
        """Close a sample's session; what it still runs in the engine stops."""
        if s.future is not None and not s.future.done():
            if self._loop is not None and hasattr(s.future, "task"):
                self._loop.cancel(s.future)
            else:
                s.future.cancel()  # a thread that runs cannot be stopped: its next call gets a 404
        return self.service.close(s.session_id)

    def close(self) -> None:
        for rid in list(self._requests):
            self.abort(rid)
        self.server.stop(timeout_s=5.0)
        self.gateway.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None:
            self._loop.close()


def session_rows(calls, sample: _Sample, spec, result, error: str | None) -> list[Rollout]:
    """A finished session's training rows (see the module docstring), each carrying the
    summary the rubric scores (``info["episode"]``)."""
    from tokenflow.envs import Episode
    from tokenflow.runtime.drivers.drive import picklable

    calls = sorted(calls, key=lambda c: c.index)
    rows: list[Rollout] = []
    cur: Rollout | None = None
    for c in calls:
        r = dataclasses.replace(c.rollout, turns=None)
        if cur is not None:
            full = [*cur.prompt_ids.tolist(), *cur.completion_ids.tolist()]
            if len(c.prompt_ids) > len(full) and c.prompt_ids[:len(full)] == full:
                cur = cur.append_environment(c.prompt_ids[len(full):])
                nxt = dataclasses.replace(r, turns=np.full(r.num_tokens, cur.last_turn + 1, dtype=np.int16))
                cur = cur.extend(nxt)
                continue
            rows.append(cur)
        cur = dataclasses.replace(r, turns=np.zeros(r.num_tokens, dtype=np.int16))
    if cur is not None:
        rows.append(cur)
    if not rows:  # the agent made no call (or failed first): an empty row keeps the group whole
        rows = [Rollout(prompt_ids=[0], completion_ids=[], logprobs=[], versions=[])]
        if error is None:
            error = "the agent returned without calling its session"
    chats = [c for c in calls if c.messages is not None]
    record = Episode(dict(spec.example))
    if chats:
        record.messages = [*chats[-1].messages, chats[-1].reply]
    elif calls:
        record.messages = [{"role": "assistant", "content": calls[-1].rollout.text or ""}]
    record.turns = len(calls)
    record.truncated = bool(calls) and calls[-1].rollout.finish_reason == "length"
    record.info = {"calls": float(len(calls)), "session_rows": float(len(rows)),
                   "calls_from_sampled_ids": float(sum(c.extended for c in calls))}
    record.state = picklable({"result": result})
    finish = "error" if error is not None else rows[-1].finish_reason
    summary = {"env": spec.env, "agent": spec.agent, "episode": record, "turns": len(calls), "finish": finish,
               "info": record.info, "error": error, "rows": len(rows)}
    for k, row in enumerate(rows):
        row.request_id, row.sample_index = sample.request_id, sample.index
        row.group_id, row.prompt_id = sample.group_id, sample.prompt_id
        row.info = {**row.info, "episode": summary, "row": k}
        if error is not None:
            row.failed = True
            row.info["env_error"] = error
    return rows


def run_agents(engine, specs: list, params, on_progress=None) -> list[list[Rollout]]:
    """Blocking: one request of ``params.n`` agent samples per spec on ``engine``; each
    request's rows (for `tokenflow eval`, tests and scripts; the runtime drives agents from
    the engine worker's loop instead)."""
    from tokenflow.runtime.drivers.drive import drive

    return drive(AgentDriver(engine), engine, specs, params, on_progress)
