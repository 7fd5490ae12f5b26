"""HTTP's side of SPEC §3.10: one error shape for every answer that is not a success.

`error_response` renders a `MemgateError`; `install_error_handlers` makes FastAPI's and
Starlette's own refusals (malformed JSON, unknown path, wrong method) and unexpected failures
take the same shape; `BodyLimit` refuses an oversized body (413) before it is read into memory;
`responses` documents each route's real statuses in the OpenAPI document.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memgate.contracts.errors import (
    RATE_LIMITED, ErrorCode, ForbiddenError, InternalError, MemgateError, MethodNotAllowedError,
    NotFoundError, PayloadTooLargeError, UnauthenticatedError, UnavailableError,
    ValidationFailedError,
)

log = logging.getLogger("memgate.rest")

REFUSED_BODY: dict[str, Any] = {"-": "refused by the HTTP adapter"}
"""A command body no contract accepts (they are closed): the bus authenticates, then refuses it."""

RAW_BODY = "memgate.raw_body"
"""The scope key under which `BodyLimit` leaves the body it read (for refused requests)."""


class ErrorBody(BaseModel):
    code: ErrorCode
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    """The one error shape of SPEC §3.10."""

    error: ErrorBody


_WHEN = {
    400: "VALIDATION_ERROR (malformed body, lengths, counts, dates), AGENT_MEMORY_EMPTY, "
         "AGENT_MEMORY_PERSONAL_DATA",
    401: "UNAUTHENTICATED: missing, unknown or revoked credential",
    403: "INSUFFICIENT_SCOPE, FORBIDDEN, AGENT_MEMORY_DISABLED, NON_RETAINING_WORKSPACE, "
         "AGENT_CONTEXT_SET_SCOPE_REFUSED, MEMORY_SPACES_DISABLED",
    404: "NOT_FOUND: unknown id, or one the caller may not see",
    409: "AGENT_MEMORY_FULL: the member's version limit is reached; MEMORY_SPACE_FULL: the "
         "member's limit of spaces, sessions or events is reached; CONFLICT: the request "
         "conflicts with the state (e.g. a lifecycle strategy that already ran)",
    412: "PRECONDITION_FAILED: If-Match or createdAt names a state that has changed; re-read",
    413: "PAYLOAD_TOO_LARGE: the body exceeds the limit (MEMGATE_MAX_BODY_BYTES)",
    422: "UNPROCESSABLE: well-formed, but a memory-space rule refuses it (SPEC §4.1–§4.3)",
    429: "AGENT_MEMORY_RATE_LIMITED: the remember rate is reached; MEMORY_SPACE_RATE_LIMITED: "
         "the member's hourly rate of spaces, sessions or events is reached (see Retry-After)",
    503: "UNAVAILABLE: not done (no actor answers, no quorum); retry",
    504: "OUTCOME_UNKNOWN: no answer in time, or a write whose copies were not confirmed: it "
         "may have been done; retry with the same Idempotency-Key",
}
COMMON = (400, 401, 403, 404, 413, 503, 504)
QUOTA = (409, 429)  # what a member may hold, and make per hour (spaces, sessions, events)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that can answer these error statuses."""
    return {status: {"model": ErrorResponse, "description": _WHEN[status]}
            for status in sorted(statuses)}


def error_response(exc: MemgateError, headers: Mapping[str, str] | None = None,
                   **beside: Any) -> JSONResponse:
    """The §3.10 body (with `beside` fields next to `error`, e.g. mem0's `detail`); a rate
    limit's refusal says when to retry in `Retry-After`."""
    headers = dict(headers or {})
    if exc.code in RATE_LIMITED:
        headers["Retry-After"] = str(exc.details.get("retryAfterSeconds", 60))
    body = {"error": {"code": exc.code.value, "message": exc.message, "details": exc.details},
            **beside}
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _http_error(exc: HTTPException) -> MemgateError:
    """Starlette's refusals as memgate errors (their `detail` is a fixed text, never input)."""
    errors: dict[int, type[MemgateError]] = {
        400: ValidationFailedError, 401: UnauthenticatedError, 403: ForbiddenError,
        404: NotFoundError, 405: MethodNotAllowedError, 413: PayloadTooLargeError,
        503: UnavailableError,
    }
    return errors.get(exc.status_code, InternalError)(str(exc.detail))


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal and failure of `app` in the SPEC §3.10 shape; no 422 in its OpenAPI."""

    @app.exception_handler(MemgateError)
    async def on_memgate_error(request: Request, exc: MemgateError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(_http_error(exc), headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_failure(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        return error_response(InternalError("internal error"))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            app.openapi_schema = _without_422(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _without_422(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI documents a 422 on every route with parameters; memgate answers 400 instead
    (a 422 memgate does answer, UNPROCESSABLE, is documented by the route and kept)."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            statuses = operation.get("responses", {})
            if statuses.get("422", {}).get("description") == "Validation Error":
                del statuses["422"]
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    return schema


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` is refused with 413 before it is held in memory.

    A declared `Content-Length` over the limit is refused without reading a byte; otherwise the
    body is read up to the limit (counted, so chunked bodies are bounded too) and handed on.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self._max):
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        scope[RAW_BODY] = body
        await self._app(scope, _replay(body, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = PayloadTooLargeError(f"the request body exceeds {self._max} bytes",
                                       {"limitBytes": self._max})
        # The server discards whatever of the body the client still sends (never held).
        await error_response(refusal)(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the whole body once, then listens to the client (disconnects)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
