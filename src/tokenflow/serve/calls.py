"""What one call is while the service runs it (`Call`), what a `CallHook` sees of it once it has
finished (`ServedCall`), and the small helpers every endpoint shares."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Request

from tokenflow.rollout import Rollout
from tokenflow.serve.errors import APIError, bad_request, internal_error
from tokenflow.serve.limits import EventStream, Ticket
from tokenflow.serve.output import ChoiceOutput
from tokenflow.serve.protocol import ChatCompletionRequest, CompletionRequest, Usage

logger = logging.getLogger(__name__)


@dataclass
class ServedCall:
    """One finished call, as a `CallHook` sees it."""

    endpoint: Literal["chat.completions", "completions"]
    request: ChatCompletionRequest | CompletionRequest
    prompt_ids: list[list[int]]
    """One list per prompt (a chat call has one)."""
    rollouts: list[list[Rollout]]
    """Per prompt, its n samples by sample index: completion ids, behaviour log-probs,
    versions (the policy version of each token), finish reasons."""
    response: dict | None
    """The body returned (None for a streamed call)."""


CallHook = Callable[[Request, ServedCall], Awaitable[None] | None]
"""Called with the HTTP request (its path parameters, headers) once a call has finished,
before its response (or a stream's ``[DONE]``) is sent."""


@dataclass
class Call:
    """What one call is running: its prompts, their submissions and choices."""

    prompts: list[list[int]]
    n: int
    queue: asyncio.Queue
    subs: list
    choices: list[ChoiceOutput]
    tokens: Ticket | None = field(default=None)
    """Its share of the token budget, given back when the call ends."""

    def choice_of(self, request_id: str, sample_index: int) -> ChoiceOutput:
        p = next(i for i, s in enumerate(self.subs) if s.request_id == request_id)
        return self.choices[p * self.n + sample_index]

    @property
    def rollouts(self) -> list[list[Rollout]]:
        return [[c.rollout for c in self.choices[p * self.n:(p + 1) * self.n]] for p in range(len(self.prompts))]

    @property
    def usage(self) -> Usage:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(c.ids) for c in self.choices)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


async def disconnected(request: Request) -> None:
    """Returns when the client of ``request`` (whose body has been read) disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def refuse_unsupported(body) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise bad_request(f"{name} is not supported (only 0)", name)
    if body.logit_bias:
        raise bad_request("logit_bias is not supported", "logit_bias")


async def notify(on_call: CallHook | None, request: Request, call: ServedCall) -> None:
    if on_call is None:
        return
    result = on_call(request, call)
    if inspect.isawaitable(result):
        await result


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def sse_event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_stream(events: AsyncIterator[str], end: Callable[[], None], closing: Callable[[], bool]) -> EventStream:
    """A streamed call's response: its events, an error event if it fails, ``[DONE]``; ``end``
    runs however the stream stops (a client gone: its samples stop)."""
    async def body() -> AsyncIterator[str]:
        try:
            try:
                async for event in events:
                    yield event
                    # Let the loop run between events: a client gone is noticed before more is
                    # written to it, and a burst of events does not hold up other requests.
                    await asyncio.sleep(0)
            except APIError as e:  # the status line is sent: the error goes in the stream
                yield sse_event(e.body())
            except Exception as e:  # noqa: BLE001 - a bug: logged, reported without internals
                logger.error("serve: a stream failed", exc_info=e)
                yield sse_event(internal_error().body())
            yield "data: [DONE]\n\n"
        finally:
            end()

    stream = EventStream(body(), closing=closing, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    stream.on_close.append(end)  # also when body() never started
    return stream
