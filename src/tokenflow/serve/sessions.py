"""Training sessions: OpenAI endpoints whose every call is recorded for training.

``/sessions/{session_id}/v1/...`` serves the policy being trained to one sample's agent. Each
finished call is kept as a `SessionCall` (prompt ids, the engine's `Rollout`: completion ids,
behaviour log-probs, policy versions). What differs from the plain server, and why:

* **Token in.** An agent re-sends its whole history on every call. When a chat call repeats
  the session's previous conversation and the reply it got, unchanged, the prompt is the
  previous call's exact ids, its sampled ids, then the chat template's ids for the new messages
  (`ChatBridge.environment_ids`): nothing the model sampled is decoded and encoded again, so
  the calls join into one multi-turn training row. Anything else (an edited history, other
  tools, a template that rewrites earlier turns) is rendered afresh and starts a new row.
* **The run samples.** Temperature, top-p and top-k are the run's (the trainer's corrections
  assume them), ``max_tokens`` is capped by the run's per-turn budget and the seed comes from
  the sample's, whatever the agent asks; ``n`` must be 1; any model name is the policy.

Sessions are bounded (`ServeConfig`): at most ``max_sessions`` open (`open` raises
`SessionLimitError` past it), ``max_calls_per_session`` calls each (a 400 past it), and a session
idle for ``session_idle_s`` (no call running, none started) is closed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from dataclasses import dataclass, field

from fastapi import Request

from tokenflow.config.serve import SESSION_DEFAULTS, ServeConfig
from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.envs.bridge import BridgeError, ChatBridge
from tokenflow.rollout import Rollout
from tokenflow.serve.chat import parse_output, template_messages
from tokenflow.serve.errors import APIError, bad_request
from tokenflow.serve.limits import EventStream
from tokenflow.serve.service import OpenAIService, ServedCall

log = logging.getLogger(__name__)


@dataclass
class SessionCall:
    """One finished call of a session."""

    index: int
    """Order in which the session's calls started."""
    prompt_ids: list[int]
    rollout: Rollout
    messages: list[dict] | None = None
    """The chat call's messages, as the template reads them (None: a completions call)."""
    schemas: list[dict] | None = None
    """The tools it offered."""
    reply: dict | None = None
    """The assistant message the client got, as the template reads it."""
    extended: bool = False
    """Its prompt is the previous call's ids, sampled ids and the new messages' ids."""


@dataclass
class Session:
    """One sample's session: the run's sampling for it, and its calls so far."""

    id: str
    params: SamplingParams
    """The group's sampling parameters (temperature, top-p, top-k, per-turn max_tokens, stops)."""
    seed: int
    calls: list[SessionCall] = field(default_factory=list)
    started: int = 0
    """Calls started (their seeds and order)."""
    closed: bool = False
    begun: int = 0
    """Calls accepted (the ``max_calls_per_session`` count)."""
    running: int = 0
    """Calls accepted and not finished."""
    # looked up when a session opens (not bound here), so a test can move the clock
    last_active: float = field(default_factory=lambda: time.monotonic())
    """When a call last began or ended (or the session opened)."""


class SessionLimitError(RuntimeError):
    """``max_sessions`` sessions are open already."""


class SessionService(OpenAIService):
    """`OpenAIService` for training sessions (see the module docstring). Sessions are opened
    and closed from the engine's thread; calls arrive on the server's event loop."""

    def __init__(self, driver, model_name: str = "policy", config: ServeConfig | None = None) -> None:
        super().__init__(driver, model_name, config or SESSION_DEFAULTS)
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._bridges: dict[str, tuple[ChatBridge, bool]] = {}
        self._next_sweep = 0.0

    # -- sessions ----------------------------------------------------------------------------

    def open(self, session_id: str, params: SamplingParams, seed: int) -> Session:
        """A new session; raises `SessionLimitError` when ``max_sessions`` are open (after
        closing the expired ones)."""
        s = Session(session_id, params, seed)
        with self._lock:
            if len(self.sessions) >= self.config.max_sessions:
                self._expire(time.monotonic())
            if len(self.sessions) >= self.config.max_sessions:
                raise SessionLimitError(f"{len(self.sessions)} sessions are open, the most this server keeps "
                                        "(serve.max_sessions); close some first")
            self.sessions[session_id] = s
        return s

    def expire(self) -> list[Session]:
        """Close the sessions idle for ``session_idle_s`` (done on its own as calls arrive)."""
        with self._lock:
            return self._expire(time.monotonic())

    def _expire(self, now: float) -> list[Session]:
        self._next_sweep = now + min(1.0, self.config.session_idle_s / 10)
        idle = [s for s in self.sessions.values()
                if s.running == 0 and now - s.last_active > self.config.session_idle_s]
        for s in idle:
            del self.sessions[s.id]
            s.closed = True
        if idle:
            log.warning("sessions: closed %d session(s) idle for more than %gs (serve.session_idle_s)",
                        len(idle), self.config.session_idle_s)
        return idle

    def close(self, session_id: str) -> Session | None:
        """End a session: later calls get a 404, and calls still running are not recorded."""
        with self._lock:
            s = self.sessions.pop(session_id, None)
        if s is not None:
            s.closed = True
        return s

    def session(self, request: Request) -> Session:
        sid = request.path_params.get("session_id", "")
        now = time.monotonic()
        if now >= self._next_sweep:
            with self._lock:
                self._expire(now)
        s = self.sessions.get(sid)
        if s is None or s.closed:
            raise APIError(404, f"There is no open session `{sid}`: it has ended (its sample was scored or "
                                "timed out) or never existed. Use the base URL the agent function was given.",
                           param="session_id", code="session_not_found")
        return s

    # -- calls -------------------------------------------------------------------------------

    def _check_model(self, name: str | None) -> None:
        """Any model name: a session serves the policy being trained, whatever the agent names."""

    async def chat(self, body, request: Request, on_call=None):
        s = self._check_call(body, request)
        return await self._running(s, super().chat(body, request, on_call or self.record))

    async def completions(self, body, request: Request, on_call=None):
        s = self._check_call(body, request)
        return await self._running(s, super().completions(body, request, on_call or self.record))

    async def _running(self, s: Session, call):
        """The call's response; the session counts it as running until it ends (a stream: its
        last event)."""
        try:
            response = await call
        except BaseException:
            self._call_ended(s)
            raise
        if isinstance(response, EventStream):
            response.on_close.append(lambda: self._call_ended(s))
        else:
            self._call_ended(s)
        return response

    def _call_ended(self, s: Session) -> None:
        with self._lock:
            s.running -= 1
            s.last_active = time.monotonic()

    def _check_call(self, body, request: Request) -> Session:
        s = self.session(request)
        if body.n != 1:
            raise bad_request("a training session samples one completion per call (n = 1); the run's "
                              "group_size sets how many samples each prompt gets", "n")
        prompt = getattr(body, "prompt", None)
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > 1:
            raise bad_request("a training session takes one prompt per call", "prompt")
        with self._lock:
            if s.begun >= self.config.max_calls_per_session:
                raise bad_request(f"this session has made {s.begun} calls, the most one session may make "
                                  "(serve.max_calls_per_session)", code="session_call_limit_exceeded")
            s.begun += 1
            s.running += 1
            s.last_active = time.monotonic()
        return s

    def chat_prompt(self, body, request: Request) -> list[int]:
        s = self.session(request)
        messages = template_messages(body.messages)
        schemas = [t.model_dump(mode="json", exclude_none=True) for t in body.tools] if body.tools else None
        request.state.session_chat = (messages, schemas, False)
        prompt = self._extended_prompt(s, messages, schemas)
        if prompt is not None:
            request.state.session_chat = (messages, schemas, True)
            return prompt
        return super().chat_prompt(body, request)

    def sampling(self, body, request: Request, params: SamplingParams) -> SamplingParams:
        from tokenflow.engine.request import derive_seed

        s = self.session(request)
        with self._lock:
            index, s.started = s.started, s.started + 1
        request.state.session_call_index = index
        run = s.params
        return dataclasses.replace(
            params, temperature=run.temperature, top_p=run.top_p, top_k=run.top_k, n=1,
            max_tokens=max(1, min(params.max_tokens, run.max_tokens)), seed=derive_seed(s.seed, index),
            stop_token_ids=tuple(dict.fromkeys([*params.stop_token_ids, *run.stop_token_ids])),
            stop=tuple(dict.fromkeys([*params.stop, *run.stop])))

    def record(self, request: Request, call: ServedCall) -> None:
        """The `CallHook`: keep a finished call in its session."""
        s = self.sessions.get(request.path_params.get("session_id", ""))
        if s is None or s.closed:
            return
        rollout = call.rollouts[0][0]
        index = getattr(request.state, "session_call_index", len(s.calls))
        entry = SessionCall(index, list(call.prompt_ids[0]), rollout)
        chat = getattr(request.state, "session_chat", None)
        if chat is not None:
            entry.messages, entry.schemas, entry.extended = chat
            entry.reply = self._reply(call, rollout, entry.schemas)
        s.calls.append(entry)

    # -- token in ----------------------------------------------------------------------------

    def _bridge(self, schemas: list[dict] | None) -> tuple[ChatBridge, bool] | None:
        """The template with these tools offered, and whether it preserves prefixes (checked once
        per set of tools)."""
        if self.chat_format.bridge is None:
            return None
        key = json.dumps(schemas, sort_keys=True)
        if key not in self._bridges:
            bridge = ChatBridge(self.tokenizer, schemas=schemas)
            check = bridge.prefix_check()
            if not check.ok:
                log.warning("sessions: the chat template does not preserve prefixes (%s); every call starts "
                            "a new training row", check.reason)
            self._bridges[key] = (bridge, check.ok)
        return self._bridges[key]

    def _extended_prompt(self, s: Session, messages: list[dict], schemas) -> list[int] | None:
        """The previous call's ids + its sampled ids + the new messages' ids, when ``messages``
        replays the previous conversation and reply exactly; else None."""
        if not s.calls:
            return None
        prev = max(s.calls, key=lambda c: c.index)
        if prev.messages is None or prev.reply is None or prev.schemas != schemas:
            return None
        k = len(prev.messages)
        if len(messages) <= k + 1 or messages[:k] != prev.messages or not _same_reply(messages[k], prev.reply):
            return None
        if self.chat_format.has_markers(messages[k + 1:], schemas):
            return None  # rendered whole, with the typed markers as text (`ChatFormat.prompt_ids`)
        bridged = self._bridge(schemas)
        completion = prev.rollout.completion_ids.tolist()
        if bridged is None or not bridged[1] or not bridged[0].ends_turn(completion):
            return None
        try:
            new_ids = bridged[0].environment_ids(messages[k + 1:], assistant=messages[k])
        except BridgeError:
            return None
        return [*prev.prompt_ids, *completion, *new_ids]

    def _reply(self, call: ServedCall, rollout: Rollout, schemas) -> dict:
        """The assistant message the client got, as the template reads it (a streamed call's
        is assembled again from its tokens)."""
        if call.response is not None:
            message = call.response["choices"][0]["message"]
            content, calls = message.get("content"), message.get("tool_calls") or []
        else:
            body = call.request
            ids = rollout.completion_ids.tolist()
            if ids and ids[-1] in self.chat_format.turn_end_ids:
                ids = ids[:-1]
            content, calls = self.tokenizer.decode(ids, skip_special_tokens=True), []
            if body.tools and body.tool_choice != "none":
                content, parsed = parse_output(content, body.tools, body.tool_format)
                calls = [c.model_dump(mode="json") for c in parsed]
        reply: dict = {"role": "assistant", "content": content or ""}
        if calls:
            reply["tool_calls"] = [{"name": c["function"]["name"], "arguments": _json(c["function"]["arguments"])}
                                   for c in calls]
        return reply


def _json(text: str):
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return text


def _same_reply(message: dict, reply: dict) -> bool:
    """Whether the agent re-sent the assistant message it got (tool-call ids aside)."""
    if message.get("role") != "assistant" or (message.get("content") or "") != reply["content"]:
        return False
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in message.get("tool_calls") or []]
    return calls == reply.get("tool_calls", [])
