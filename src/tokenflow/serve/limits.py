"""The limits a request meets before the service runs it (`ServeConfig`; docs/serve.md, "Limits").

::

    request ─► body (max_body_bytes, else 413; the body bytes of all requests,
        max_body_bytes_in_flight, else 429; body_timeout_s, else 408) ─► slot (max_requests,
        else 429) ─► JSON depth (max_json_depth, else 400) ─► JSON ─►
        prompt bound and prompts x n (400, before validation and tokenizing) ─► FastAPI's
        validation ─► service: tokenize (a thread) ─► tokens (max_tokens_in_flight, else 429)

`limited_route` puts the first four on every POST route of `openai_router`, so training
sessions' servers (which build their own app) get them too. The body is parsed here, once, and
handed to FastAPI (``request._json``), so the cheap structural checks run before pydantic walks
a body of millions of token ids.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import threading

from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from tokenflow.config.serve import ServeConfig
from tokenflow.serve.errors import APIError, bad_request, rate_limited, too_large, unavailable

logger = logging.getLogger(__name__)

DRAIN_FACTOR = 8
"""A refused body that announced at most this many times the body limit is read to its end
and dropped, so that its client, still sending, reads the answer; past it, or chunked, the
connection closes after the answer (the client may then see the connection reset instead)."""


class Ticket:
    """What one request holds of the admission budget; `release` is idempotent."""

    __slots__ = ("admission", "requests", "tokens", "body")

    def __init__(self, admission: Admission, requests: int = 0, tokens: int = 0) -> None:
        self.admission, self.requests, self.tokens, self.body = admission, requests, tokens, 0

    def release(self) -> None:
        admission, self.admission = self.admission, None
        if admission is not None:
            admission.give_back(self.requests, self.tokens, self.body)


class Admission:
    """Requests and tokens in flight, against ``max_requests`` and the token budget."""

    def __init__(self, config: ServeConfig, max_num_seqs: int, max_model_len: int) -> None:
        self.max_requests = config.max_requests
        self.max_tokens = config.tokens_in_flight(max_num_seqs, max_model_len)
        self.max_body = config.body_bytes_in_flight(max_model_len)
        self.retry_after_s = config.retry_after_s
        self.requests = 0
        self.tokens = 0
        self.body = 0
        """Body bytes held (or announced) by the requests in flight."""
        self.refused = 0
        """429s answered so far."""
        self._lock = threading.Lock()

    def enter(self, ticket: Ticket | None = None) -> Ticket:
        """A request slot (for ``ticket``, or a new one), or a 429."""
        ticket = ticket if ticket is not None else Ticket(self)
        with self._lock:
            if self.max_requests and self.requests >= self.max_requests:
                self.refused += 1
                raise rate_limited(f"This server is at its limit of {self.max_requests} requests in flight "
                                   "(serve.max_requests).", "requests", self.retry_after_s)
            self.requests += 1
            ticket.requests += 1
        return ticket

    def take_body(self, ticket: Ticket, size: int, *, close: bool) -> None:
        """``size`` more body bytes for the request of ``ticket``, or a 429 (``close``: the
        connection closes after it, the rest of the body unread)."""
        with self._lock:
            if self.max_body and self.body + size > self.max_body:
                self.refused += 1
                raise rate_limited(f"This server holds {self.body} bytes of request bodies, its limit is "
                                   f"{self.max_body} (serve.max_body_bytes_in_flight).", "requests",
                                   self.retry_after_s, close=close)
            self.body += size
            ticket.body += size

    def reserve(self, tokens: int, param: str) -> Ticket:
        """``tokens`` of the budget for one call, a 429 while they are not free, or a 400 when
        they never will be."""
        with self._lock:
            if self.max_tokens and tokens > self.max_tokens:
                raise bad_request(
                    f"This request needs {tokens} tokens in flight (prompt tokens + max_tokens x n), more than "
                    f"this server admits at once ({self.max_tokens}, serve.max_tokens_in_flight); lower "
                    "max_tokens, n or the number of prompts.", param, "tokens_exceed_limit")
            if self.max_tokens and self.tokens + tokens > self.max_tokens:
                self.refused += 1
                raise rate_limited(f"This server has {self.tokens} of its {self.max_tokens} tokens in flight "
                                   f"(serve.max_tokens_in_flight) taken, and this request needs {tokens}.",
                                   "tokens", self.retry_after_s)
            self.tokens += tokens
        return Ticket(self, tokens=tokens)

    def give_back(self, requests: int, tokens: int, body: int) -> None:
        """What a `Ticket` held, returned to the budget (`Ticket.release`)."""
        with self._lock:
            self.requests -= requests
            self.tokens -= tokens
            self.body -= body


class Turns:
    """Hands the event loop out in turns. A coroutine awaits `take` before a synchronous
    stretch of work (starting a request, building an answer, a stream's next event); while
    another stretch has run in this loop iteration, it waits, and the waiters are let go one an
    iteration, in order. A burst (the 256 calls one engine step finished, 250 requests that
    arrived at once) then runs one piece an iteration, and the loop polls its sockets between
    them: /health, and every other socket, are answered within a few pieces, not after the
    burst. Nothing is held: a turn is only when a stretch starts. Uncontended, a turn costs one
    ``call_soon``."""

    def __init__(self) -> None:
        self._waiters: collections.deque = collections.deque()
        self._busy = False

    async def take(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._busy:
            self._busy = True
            loop.call_soon(self._next)
            return
        waiter = loop.create_future()
        self._waiters.append(waiter)
        await waiter

    def _next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter (a client gone) is passed over
                waiter.set_result(None)
                asyncio.get_running_loop().call_soon(self._next)
                return
        self._busy = False


class PromptBound:
    """The checks that need no tokenizer: prompts x n, and each prompt's length in characters
    (text) or tokens (ids), on the request's JSON before it is validated. What has an unexpected
    type is left for validation to refuse."""

    def __init__(self, config: ServeConfig, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.max_choices = config.max_choices
        self.chars_per_token = config.prompt_chars_per_token
        self.max_chars = config.prompt_chars(max_model_len)

    def completion(self, data) -> None:
        if not isinstance(data, dict):
            return
        prompt = data.get("prompt")
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompts = [prompt]
        elif isinstance(prompt, list):
            prompts = prompt
        else:
            return
        self._choices(len(prompts), data)
        for p in prompts:
            if isinstance(p, str) and len(p) > self.max_chars:
                raise self._too_long_text(len(p), "prompt")
            if isinstance(p, list) and len(p) >= self.max_model_len:
                raise bad_request(
                    f"This model's maximum context length is {self.max_model_len} tokens, and the prompt is "
                    f"{len(p)} tokens, leaving no room for a completion. Please shorten the prompt.",
                    "prompt", "context_length_exceeded")

    def chat(self, data) -> None:
        if not isinstance(data, dict):
            return
        self._choices(1, data)
        messages = data.get("messages")
        if not isinstance(messages, list):
            return
        if len(messages) >= self.max_model_len:  # every message renders to a token at least
            raise bad_request(f"This model's maximum context length is {self.max_model_len} tokens, and the "
                              f"messages are {len(messages)} messages. Please shorten the messages.",
                              "messages", "context_length_exceeded")
        chars = sum(_message_chars(m) for m in messages)
        tools = data.get("tools")
        if isinstance(tools, list) and tools:
            try:
                chars += len(json.dumps(tools, ensure_ascii=False))
            except (TypeError, ValueError):
                pass
        if chars > self.max_chars:
            raise self._too_long_text(chars, "messages")

    def _choices(self, prompts: int, data: dict) -> None:
        n = data.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            n = 1
        if prompts * n > self.max_choices:
            what = f"{prompts} prompts x n = {n}" if prompts > 1 else f"n = {n}"
            raise bad_request(f"This request asks for {prompts * n} completions ({what}); this server takes at most "
                              f"{self.max_choices} per request (serve.max_choices). Split it into several requests.",
                              "prompt" if prompts > 1 else "n", "too_many_choices")

    def _too_long_text(self, chars: int, param: str) -> APIError:
        return bad_request(
            f"This model's maximum context length is {self.max_model_len} tokens, and the {param} "
            f"{'is' if param == 'prompt' else 'are'} {chars} characters: more than {self.max_model_len} tokens "
            f"can hold here ({self.max_chars} characters, {self.chars_per_token:g} a token; "
            f"serve.prompt_chars_per_token). Please shorten the {param}.", param, "context_length_exceeded")


def _message_chars(m) -> int:
    if not isinstance(m, dict):
        return 0
    n = 0
    content = m.get("content")
    if isinstance(content, str):
        n += len(content)
    elif isinstance(content, list):
        n += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    for key in ("name", "tool_call_id"):
        if isinstance(m.get(key), str):
            n += len(m[key])
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        for c in calls:
            f = c.get("function") if isinstance(c, dict) else None
            if isinstance(f, dict):
                n += sum(len(f[k]) for k in ("name", "arguments") if isinstance(f.get(k), str))
    return n


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(body: bytes, limit: int) -> bool:
    """Whether JSON ``body`` nests arrays and objects more than ``limit`` deep, from its bytes
    (C-speed passes, no parse): strings dropped, brackets kept, and innermost pairs removed
    ``limit`` times. Unbalanced brackets are left for the parser to refuse."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    s = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        t = s.replace(b"[]", b"").replace(b"{}", b"")
        if not t or t == s:
            return False
        s = t
    return True


def parse_json(body: bytes, limit: int):
    """The body's JSON, None when it does not parse (FastAPI then says what is wrong), or a 400
    when it nests deeper than ``limit``."""
    message = (f"The request body's JSON nests arrays and objects more than {limit} levels deep "
               "(serve.max_json_depth).")
    if too_deep(body, limit):
        raise bad_request(message, code="json_too_deep")
    try:
        return json.loads(body)
    except RecursionError:
        raise bad_request(message, code="json_too_deep") from None
    except ValueError:
        return None


async def read_body(request: Request, limit: int, admission: Admission, ticket: Ticket,
                    timeout_s: float | None = None) -> bytes:
    """The whole body, or a 413 as soon as it is known to be over ``limit``: from its
    ``Content-Length`` before reading any of it, or while reading a chunked one. Its bytes are
    taken from the body budget first (a 429 when they do not fit). A chunked body, or one that
    announced more than `DRAIN_FACTOR` times the limit, has its connection closed after the
    answer, so the rest is never read. A body not read within ``timeout_s`` is a 408 (the
    connection closes after it)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit, admission, ticket)
    except TimeoutError:
        raise APIError(408, f"The request body did not arrive within {timeout_s:g} s (serve.body_timeout_s).",
                       code="request_timeout", headers={"Connection": "close"}) from None


async def _read_body(request: Request, limit: int, admission: Admission, ticket: Ticket) -> bytes:
    declared = _declared(request)
    if declared is not None and declared > limit:
        raise too_large(limit, close=declared > DRAIN_FACTOR * limit)
    if declared is not None:
        admission.take_body(ticket, declared, close=False)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        if declared is None:
            admission.take_body(ticket, len(chunk), close=True)
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # noqa: SLF001 - what FastAPI reads (Starlette's `Request.body` caches it there)
    return body


def _declared(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else None


def _is_json(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind.startswith("application/") and (kind.endswith("/json") or kind.endswith("+json"))


class EventStream(StreamingResponse):
    """A streamed response that runs its ``on_close`` callbacks once it ends, however it ends
    (a client gone before the first event included, when the body generator never starts)."""

    def __init__(self, content, *, closing=lambda: False, **kw) -> None:
        super().__init__(content, **kw)
        self.on_close: list = []
        self.closing = closing

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            if not self.closing():
                raise
            # A stop that ran past its time cancelled the stream: it ends here, quietly.
        finally:
            for callback in self.on_close:
                callback()


def limited_route(service) -> type[APIRoute]:
    """The route class of `openai_router`: every POST reads its body within the limit and its
    deadline, then takes a request slot, and checks its JSON's depth and its prompts' size
    before FastAPI parses it."""

    class LimitedRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()
            if "POST" not in self.methods:
                return handler
            check = service.prompt_bound.chat if self.name == "chat_completions" else service.prompt_bound.completion

            async def limited(request: Request) -> Response:
                await service.turns.take()  # requests that arrive together start one a loop turn
                declared, limit = _declared(request), service.max_body_bytes
                if declared is not None and declared > limit:  # from its headers: no slot needed
                    raise too_large(limit, close=declared > DRAIN_FACTOR * limit)
                ticket = Ticket(service.admission)
                try:
                    body = await read_body(request, service.max_body_bytes, service.admission, ticket,
                                           service.config.body_timeout_s)
                    service.admission.enter(ticket)  # a slot only once the body is here
                    if body and _is_json(request):
                        data = parse_json(body, service.config.max_json_depth)
                        if data is not None:  # else FastAPI parses it again and says what is wrong
                            request._json = data  # noqa: SLF001 - Starlette's `Request.json` cache
                            check(data)
                    response = await handler(request)
                except ClientDisconnect:  # gone while sending its body: nobody reads an answer
                    ticket.release()
                    return Response(status_code=499)
                except asyncio.CancelledError:
                    ticket.release()
                    if not service.closing:
                        raise
                    return unavailable("the server is shutting down").response()  # a stop past its time
                except BaseException:
                    ticket.release()
                    raise
                if isinstance(response, EventStream):
                    response.on_close.append(ticket.release)
                else:
                    ticket.release()
                return response

            return limited

    return LimitedRoute
