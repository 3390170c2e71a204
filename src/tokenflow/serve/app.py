"""The FastAPI application: routes, API key, errors and the published OpenAPI document.

`create_app(engine, model_name)` builds a server around a `RolloutEngine`; its OpenAI routes
come from `openai_router`, which can be mounted again under another prefix with a hook of its
own: a training runtime can serve ``/sessions/{session_id}/v1/...`` on the same app and engine,
and record each call's rollouts (token ids, behaviour log-probs, versions) in its `CallHook`,
which sees the session id in ``request.path_params``. Every POST route checks the limits of
`tokenflow.serve.limits` (the service's `ServeConfig`) before FastAPI parses its body.
"""

from __future__ import annotations

import asyncio
import hmac
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from tokenflow.config.serve import ServeConfig
from tokenflow.serve import errors
from tokenflow.serve.driver import EngineDriver
from tokenflow.serve.errors import APIError
from tokenflow.serve.limits import limited_route
from tokenflow.serve.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from tokenflow.serve.service import CallHook, OpenAIService
from tokenflow.serve.tokenizer_api import tokenizer_router

OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Paths served without the API key (nothing in them reaches the model)."""

_ERRORS = {
    400: "Invalid request: a malformed body, a bad parameter, a prompt longer than the context",
    401: "Missing or wrong API key",
    404: "Unknown model",
    408: "The request head or body did not arrive in time (serve.header_timeout_s, serve.body_timeout_s)",
    413: "The request body is larger than the server takes (serve.max_body_bytes)",
    429: "Too many requests or tokens in flight (serve.max_requests, serve.max_tokens_in_flight); "
         "retry after the Retry-After header's seconds",
    500: "A bug in the server (its log has the details)",
    503: "The server is shutting down, or has as many connections open as it takes (serve.max_connections)",
}


STREAMED_MODELS = (ChatCompletionChunk,)
"""Event payloads that no JSON response names, added to the document's components."""


def _event_schema(chunk) -> dict:
    """One server-sent event (OpenAPI before 3.2: the stream's schema describes each event): its
    ``data`` is a chunk, an error in OpenAI's shape (a stream that failed after it started) or
    the final ``[DONE]``."""
    as_json = [{"type": "string", "contentMediaType": "application/json",
                "contentSchema": {"$ref": f"#/components/schemas/{m.__name__}"}} for m in (chunk, ErrorResponse)]
    return {"type": "object", "required": ["data"],
            "properties": {"data": {"anyOf": [{"const": "[DONE]"}, *as_json]}, "event": {"type": "string"}}}


def _responses(model, chunk=None) -> dict:
    ok: dict = {"model": model, "description": "The result"}
    if chunk is not None:
        ok["description"] = "The result; with `stream: true`, server-sent events ending with `data: [DONE]`"
        ok["content"] = {"text/event-stream": {"schema": _event_schema(chunk)}}
    return {200: ok, **{code: {"model": ErrorResponse, "description": text} for code, text in _ERRORS.items()}}


def openai_router(service: OpenAIService, *, prefix: str = "/v1", on_call: CallHook | None = None,
                  tags: list[str] | None = None) -> APIRouter:
    """The OpenAI endpoints under ``prefix``; ``on_call`` sees every finished call."""
    router = APIRouter(prefix=prefix, tags=tags or ["openai"], route_class=limited_route(service))

    @router.post("/chat/completions", response_model=None, responses=_responses(ChatCompletion, ChatCompletionChunk),
                 summary="Create a chat completion")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await service.chat(body, request, on_call)

    @router.post("/completions", response_model=None, responses=_responses(Completion, Completion),
                 summary="Create a text completion")
    async def completions(body: CompletionRequest, request: Request):
        return await service.completions(body, request, on_call)

    @router.get("/models", response_model=ModelList, responses=_responses(ModelList),
                summary="List the served model")
    async def list_models():
        return service.models()

    @router.get("/models/{model}", response_model=ModelCard, responses=_responses(ModelCard),
                summary="Describe the served model")
    async def get_model(model: str):
        return service.model(model)

    from tokenflow.serve.token_routes import token_router  # token in, token out (verifiers, prime-rl)

    outer = APIRouter()
    outer.include_router(router)
    outer.include_router(token_router(service, prefix=prefix, on_call=on_call, tags=tags))
    outer.include_router(tokenizer_router(service, prefix=prefix, tags=tags))  # /tokenize, ... beside /v1
    return outer


def create_app(engine, model_name: str, *, api_key: str | None = None, on_call: CallHook | None = None,
               config: ServeConfig | None = None) -> FastAPI:
    """An OpenAI-compatible server for ``engine`` (a `RolloutEngine`, which the caller closes),
    within the limits of ``config``. The engine's step loop runs in one thread from startup to
    shutdown (`EngineDriver`)."""
    driver = EngineDriver(engine)
    service = OpenAIService(driver, model_name, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        driver.start()
        try:
            yield
        finally:
            service.closing = True
            # The stop's last fifth: the engine thread ends after its current step.
            await asyncio.to_thread(driver.close, max(1.0, 0.2 * service.config.shutdown_timeout_s))
            service.close()

    app = FastAPI(title="tokenflow serve", version="1",
                  description="OpenAI-compatible chat and text completions from a tokenflow engine.",
                  lifespan=lifespan)
    app.state.service = service
    app.state.driver = driver
    errors.install(app)
    app.include_router(openai_router(service, on_call=on_call))

    @app.get("/health", summary="Whether the server takes requests, and what it has in flight",
             responses={503: {"model": ErrorResponse}})
    async def health():
        if service.closing or not driver.running:
            raise errors.unavailable("the server is shutting down" if driver.failure is None else "the engine failed")
        a = service.admission
        return {"status": "ok", "requests_in_flight": a.requests, "tokens_in_flight": a.tokens,
                "body_bytes_in_flight": a.body, "engine_requests": driver.in_flight, "refused": a.refused}

    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    app.openapi = lambda: _openapi(app, bool(api_key), model_name)
    return app


class APIKeyMiddleware:
    """Answer 401 (OpenAI's shape) to a request without ``Authorization: Bearer <api_key>``,
    before its body is read; `OPEN_PATHS` stay open."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"authorization")
        if given is not None and hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        message = ("Incorrect API key provided." if given else
                   "You didn't provide an API key; send it in an Authorization header (Authorization: Bearer KEY).")
        await APIError(401, message, code="invalid_api_key").response()(scope, receive, send)


def _openapi(app: FastAPI, secured: bool, model_name: str) -> dict:
    """FastAPI's document, with what this server really answers: 400 instead of 422 for a bad
    body, the error shape for every error, the one model name a request may give, and the
    bearer key when one is required."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for route, path in doc.get("paths", {}).items():
            for op in path.values():
                op.get("responses", {}).pop("422", None)
                if secured and route not in OPEN_PATHS:
                    op["security"] = [{"bearer": []}]
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        _, defs = models_json_schema([(m, "serialization") for m in STREAMED_MODELS],
                                     ref_template="#/components/schemas/{model}")
        for name, schema in defs.get("$defs", {}).items():
            schemas.setdefault(name, schema)
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            model = schemas.get(name, {}).get("properties", {}).get("model")
            if model is not None:
                model["anyOf"] = [{"type": "string", "enum": [model_name]}, {"type": "null"}]
        if secured:
            doc.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = doc
    return app.openapi_schema
