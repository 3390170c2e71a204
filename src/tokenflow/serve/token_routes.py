"""Token in, token out: the two routes RL clients call with prompt ids they rendered themselves.

* ``POST /inference/v1/generate`` — vLLM's token generate endpoint, as verifiers' train client
  (``verifiers.v1.TrainClientConfig``, through ``renderers.client.generate``) calls it: the
  client renders the conversation with its own renderer, bridges later turns onto the ids the
  model sampled, and sends ``{"model", "token_ids", "sampling_params": {...}}``; the answer is
  ``{"request_id", "choices": [{"index", "token_ids", "logprobs": {"content": [{"token":
  "token_id:ID", "logprob"}]}, "finish_reason"}], "prompt_token_ids", "usage"}``. It is mounted
  beside ``/v1`` (at the root of ``tokenflow serve``, at ``/sessions/{id}`` in a training run),
  where the client looks for it: its base URL with the trailing ``/v1`` removed.
* ``POST /v1/chat/completions/tokens`` — prime-rl's vLLM extension (older verifiers clients,
  teacher log-prob requests): a chat completion request whose prompt is ``tokens`` (the ids,
  used as they are) instead of the rendered ``messages``; the answer is a chat completion, tool
  calls read from the text as ``/v1/chat/completions`` reads them.

Both run as a completions call of the same service on the prompt ids, so everything a
completions call gets applies: the limits, the token budget and, in a training session, the run's
sampling and the recording of ids, behaviour log-probs and versions (`SessionService`). A call
whose prompt extends the previous call's prompt and sampled ids continues that call's training
row; the ids in between are environment tokens.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenflow.serve.chat import parse_output
from tokenflow.serve.errors import bad_request
from tokenflow.serve.limits import limited_route
from tokenflow.serve.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
    CompletionRequest,
    ErrorResponse,
    TokenLogprob,
    Usage,
)

TokenList = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class TokenPromptRequest(CompletionRequest):
    """A completions call on prompt ids whose generation also stops at ``stop_token_ids``."""

    stop_token_ids: list[int] = Field(default_factory=list)


class GenerateSampling(BaseModel):
    """vLLM's ``SamplingParams`` fields this server honours; others are ignored, except the
    ones that would change the distribution sampled from (refused with a 400)."""

    model_config = ConfigDict(extra="allow")
    n: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    """vLLM's "off" is -1 (or 0)."""
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    """The sampled token's log-prob is always returned; top alternatives are not."""


NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "min_tokens": 0, "prompt_logprobs": None, "logit_bias": None, "bad_words": None,
           "allowed_token_ids": None, "best_of": None}
"""Fields that change what is sampled: accepted only at their neutral value."""


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    token_ids: TokenList
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    stream: bool = False
    request_id: str | None = None


class ChatTokensRequest(ChatCompletionRequest):
    tokens: TokenList
    """The prompt's ids, used in place of rendering ``messages`` (which are only read for the
    tools offered)."""


class GeneratedToken(BaseModel):
    token: str
    """``"token_id:ID"``."""
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list = Field(default_factory=list)


class GeneratedLogprobs(BaseModel):
    content: list[GeneratedToken]


class GenerateChoice(BaseModel):
    index: int
    token_ids: list[int]
    logprobs: GeneratedLogprobs
    finish_reason: str | None = None


class GenerateResponse(BaseModel):
    request_id: str
    choices: list[GenerateChoice]
    prompt_token_ids: list[int]
    usage: Usage | None = None
    prompt_logprobs: None = None


ERRORS = {400: "Invalid request: a malformed body, a bad parameter, token ids outside the vocabulary, a prompt "
               "longer than the context", 401: "Missing or wrong API key",
          404: "Unknown model, or (in a training run) a session that has ended",
          408: "The request did not arrive in time", 413: "The request body is too large",
          429: "Too many requests or tokens in flight; retry after the Retry-After header's seconds",
          500: "A bug in the server", 503: "The server is shutting down, or has too many connections open"}


def _responses(model) -> dict:
    return {200: {"model": model, "description": "The result"},
            **{code: {"model": ErrorResponse, "description": text} for code, text in ERRORS.items()}}


def _generate_body(body: GenerateRequest) -> TokenPromptRequest:
    sp = body.sampling_params
    if body.stream:
        raise bad_request("/inference/v1/generate does not stream; send stream: false", "stream")
    for name, neutral in NEUTRAL.items():
        value = (sp.model_extra or {}).get(name)
        if value is not None and value != neutral:
            raise bad_request(f"sampling_params.{name} = {value!r} is not supported (only {neutral!r})",
                              f"sampling_params.{name}")
    return token_prompt(
        "sampling_params.", model=body.model, prompt=list(body.token_ids), n=sp.n, max_tokens=sp.max_tokens or 1 << 30,
        temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k if sp.top_k and sp.top_k > 0 else None,
        seed=sp.seed, stop=sp.stop or None, ignore_eos=sp.ignore_eos, logprobs=0, return_token_ids=True,
        stop_token_ids=list(sp.stop_token_ids or []))


def token_prompt(where: str, **fields) -> TokenPromptRequest:
    """The completions call, or a 400 naming the field out of the completions call's bounds."""
    try:
        return TokenPromptRequest(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        name = ".".join(str(x) for x in err["loc"])
        raise bad_request(f"{where}{name}: {err['msg']}", f"{where}{name}") from None


def _choices_of(response) -> tuple[dict | None, Response | None]:
    """The completions call's JSON, or the response to pass on as it is (a client gone)."""
    if not isinstance(response, JSONResponse):
        return None, response
    return json.loads(response.body), None


def _token_logprobs(choice: dict) -> list[float]:
    return list((choice.get("logprobs") or {}).get("token_logprobs") or [])


def token_router(service, *, prefix: str = "/v1", on_call=None, tags: list[str] | None = None) -> APIRouter:
    """The token-in routes for an `openai_router` mounted at ``prefix`` (``/v1`` or
    ``/sessions/{session_id}/v1``); ``on_call`` as there."""
    root = prefix[: -len("/v1")] if prefix.endswith("/v1") else prefix
    router = APIRouter(tags=tags or ["tokens"], route_class=limited_route(service))

    @router.post(root + "/inference/v1/generate", response_model=None, responses=_responses(GenerateResponse),
                 summary="Generate from prompt token ids (vLLM's token generate endpoint)")
    async def generate(body: GenerateRequest, request: Request):
        response = await service.completions(_generate_body(body), request, on_call)
        data, passed = _choices_of(response)
        if passed is not None:
            return passed
        choices = []
        for c in data["choices"]:
            ids = c.get("token_ids") or []
            content = [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                       for t, lp in zip(ids, _token_logprobs(c))]
            choices.append({"index": c["index"], "token_ids": ids, "logprobs": {"content": content},
                            "finish_reason": c.get("finish_reason")})
        prompt = data["choices"][0].get("prompt_token_ids") if data["choices"] else list(body.token_ids)
        return JSONResponse({"request_id": body.request_id or data["id"], "choices": choices,
                             "prompt_token_ids": prompt, "usage": data.get("usage"), "prompt_logprobs": None})

    @router.post(prefix + "/chat/completions/tokens", response_model=None, responses=_responses(ChatCompletion),
                 summary="Create a chat completion from prompt token ids (prime-rl's extension)")
    async def chat_completions_tokens(body: ChatTokensRequest, request: Request):
        if body.stream:
            raise bad_request("/chat/completions/tokens does not stream; send stream: false", "stream")
        limit = min(x for x in (body.max_tokens, body.max_completion_tokens, 1 << 30) if x is not None)
        call = token_prompt(
            "", model=body.model, prompt=list(body.tokens), n=body.n, max_tokens=limit, temperature=body.temperature,
            top_p=body.top_p, top_k=body.top_k, seed=body.seed, stop=body.stop, ignore_eos=body.ignore_eos,
            logprobs=0, return_token_ids=True, stop_token_ids=list(service.chat_format.turn_end_ids))
        response = await service.completions(call, request, on_call)
        data, passed = _choices_of(response)
        if passed is not None:
            return passed
        tools = body.tools if body.tools and body.tool_choice != "none" else None
        choices = []
        for c in data["choices"]:
            content, calls = c["text"], []
            if tools:
                content, calls = parse_output(c["text"], tools, body.tool_format)
            logprobs = None
            if body.logprobs:  # the sampled tokens' log-probs (no alternatives)
                strings = (c.get("logprobs") or {}).get("tokens") or []
                logprobs = ChoiceLogprobs(content=[TokenLogprob(token=t, logprob=lp, bytes=list(t.encode()))
                                                   for t, lp in zip(strings, _token_logprobs(c))])
            choices.append(ChatChoice(
                index=c["index"], message=AssistantMessage(content=content, tool_calls=calls or None),
                finish_reason="tool_calls" if calls else c.get("finish_reason"), logprobs=logprobs,
                token_ids=c.get("token_ids") if body.return_token_ids else None))
        prompt = list(body.tokens) if body.return_token_ids else None
        result = ChatCompletion(id=f"chatcmpl-{secrets.token_hex(12)}", created=int(time.time()),
                                model=data["model"], choices=choices, usage=data.get("usage"),
                                prompt_token_ids=prompt)
        return JSONResponse(result.model_dump(mode="json"))

    return router
