"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, for every
failure the server can answer: a bad body (400, never FastAPI's 422), a wrong API key (401), an
unknown model or route (404), a wrong method (405), a body over the limit (413), admission
refused (429, with ``Retry-After``), shutting down (503) and true bugs (500, with no internals:
the traceback goes to the log)."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error the API answers with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict | None = None) -> Response:
        headers = {**(self.headers or {}), **(headers or {})} or None
        if self.status == 401:
            headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
        # ASCII JSON: a message may quote what the client sent, lone surrogates included.
        return Response(json.dumps(self.body()), status_code=self.status, headers=headers,
                        media_type="application/json")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="service_unavailable")


def too_large(limit: int, *, close: bool = True) -> APIError:
    """413; ``close``: the connection closes after it, and the rest of the body is never read."""
    return APIError(413, f"The request body is larger than this server takes ({limit} bytes; "
                         "serve.max_body_bytes).", code="request_too_large",
                    headers={"Connection": "close"} if close else None)


def rate_limited(message: str, kind: str, retry_after_s: int, *, close: bool = False) -> APIError:
    """429 as OpenAI words a rate limit (type "requests" or "tokens"), with ``Retry-After``;
    ``close``: the connection closes after it (a body left unread)."""
    headers = {"Retry-After": str(retry_after_s), **({"Connection": "close"} if close else {})}
    return APIError(429, f"{message} Please try again in {retry_after_s}s.", type=kind,
                    code="rate_limit_exceeded", headers=headers)


# pydantic error types -> OpenAI's codes
_TYPE_ERRORS = ("_type", "_parsing", "model_attributes_type", "is_instance_of", "dict_type", "list_type")
_VALUE_ERRORS = ("greater_than", "less_than", "too_short", "too_long", "literal_error", "enum",
                 "string_pattern_mismatch", "value_error", "finite_number", "multiple_of")


def validation_error(exc: RequestValidationError) -> APIError:
    """The first of pydantic's errors, as OpenAI words a bad parameter."""
    errors = exc.errors()
    if not errors:
        return bad_request("the request body is invalid")
    err = errors[0]
    loc = [p for p in err.get("loc", ()) if p != "body"]
    param = _param_name(loc)
    kind = str(err.get("type", ""))
    detail = str(err.get("msg", "invalid"))
    if kind == "json_invalid":
        return bad_request(f"could not parse the JSON body of the request ({detail}); send a JSON object")
    if kind == "missing":
        if not param:
            return bad_request("the request needs a JSON body", code="missing_required_parameter")
        return bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    where = f"'{param}'" if param else "the request body"
    if kind.endswith(_TYPE_ERRORS) or kind in _TYPE_ERRORS:
        return bad_request(f"Invalid type for {where}: {detail}.", param or None, "invalid_type")
    if kind.startswith(_VALUE_ERRORS) or kind in _VALUE_ERRORS:
        return bad_request(f"Invalid value for {where}: {detail}.", param or None, "invalid_value")
    return bad_request(f"Invalid {where}: {detail}.", param or None, "invalid_value")


def _param_name(loc: list) -> str:
    """``["messages", 0, "content"]`` -> ``"messages[0].content"``; pydantic's union branch
    names (``"str"``, ``"list[int]"``, ...) are left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part) in ("str", "int", "float", "bool", "function-after", "function-wrap"):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def install(app: FastAPI) -> None:
    """Answer every error in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, exc: RequestValidationError):
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            err = APIError(404, f"Unknown request URL: {request.method} {request.url.path}.",
                           code="unknown_url")
        elif exc.status_code == 405:
            err = APIError(405, f"Method {request.method} is not allowed for {request.url.path}.",
                           code="method_not_allowed")
        else:
            err = APIError(exc.status_code, str(exc.detail), type="invalid_request_error")
        return err.response(exc.headers)  # a 405 keeps its Allow header

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        logger.error("serve: %s %s failed", request.method, request.url.path, exc_info=exc)
        return internal_error().response()


def internal_error() -> APIError:
    return APIError(500, "The server had an error while processing the request; its log has the details.",
                    type="server_error", code="internal_error")
