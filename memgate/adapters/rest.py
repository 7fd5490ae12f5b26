"""The REST adapter (FastAPI): a bus client that holds no state.

Every route turns its request into a bus command and the reply back into JSON; failures keep
the one error shape of SPEC §3.10 (`adapters.http_errors`). Bodies over the configured limit are
refused before they are read. Authentication comes first, as on the bus: a request FastAPI
refuses still goes to the bus, with a body every contract refuses, so the caller learns about
its credential (401/403/404) before it learns what is wrong with its input (400).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig

from memgate.adapters.http_errors import (
    COMMON, REFUSED_BODY, BodyLimit, error_response, install_error_handlers, responses,
)
from memgate.adapters import (
    console, rest_admin, rest_erasure, rest_mem0, rest_mem0_profiles, rest_sessions,
)
from memgate.adapters import rest_spaces
from memgate.adapters import rest_metrics
from memgate.adapters.mcp_server import McpHttpEndpoint
from memgate.adapters.rest_admin import PathId, Token, bearer
from memgate.adapters.routing import IdempotencyKey, Mark, Send, token_of
from memgate.bus import BusClient, subjects
from memgate.bus.replies import Handler
from memgate.contracts import (
    Contract, ForgetRequest, ForgetResult, ListRequest, ListResult, MemgateError, RecallRequest,
    RecallResult, RememberRequest, RememberResult,
)
from memgate.contracts.errors import (
    UnauthenticatedError, ValidationFailedError,
)
from memgate.contracts.internal import Ready
from memgate.contracts.memory import ImportRequest, ImportResult

log = logging.getLogger("memgate.rest")

T = TypeVar("T", bound=Contract)
E = TypeVar("E", bound=Callable[..., Any])


DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024



# A ready actor answers in about a millisecond; a probe must not hang on one that is not.
READY_TIMEOUT_S = 2.0

# memgate exports no OpenTelemetry: with these off FastAPI stops asking the global providers
# whether to trace, on every request (docs/DECISIONS.md, "REST adapter CPU").
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False,
                                 "operation_spans": False}


def _problems(exc: RequestValidationError) -> list[dict[str, str]]:
    """What FastAPI found wrong, by field and rule (never the input, which may be personal)."""
    return [{"field": ".".join(str(p) for p in err["loc"][1:]) or str(err["loc"][0]),
             "problem": err["msg"]} for err in exc.errors()]


def create_app(nats_url: str, *, ready_subjects: list[str],
               cluster_subjects: Collection[str] = (), timeout: float = 10.0,
               nats_options: dict[str, Any] | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               local: Mapping[str, Handler] | None = None) -> FastAPI:
    """The REST (and MCP) adapter. `local`: the commands an actor of this process answers,
    sent to it without the server (`BusClient`); everything else goes over the bus.
    `/healthz` answers 200 once every one of `ready_subjects` answers; from then on, those of
    them in `cluster_subjects` (a cluster's stores, served on any node) no longer count: one
    waiting is a degraded cluster, said in the body, not a reason to take this node out."""
    state: dict[str, BusClient] = {}
    came_up = False
    mcp = McpHttpEndpoint()
    # route name → the bus command it sends, for routes whose bus handler parses a body
    commands: dict[str, tuple[str, type[Contract]]] = {}

    def command(subject: str, result: type[Contract]) -> Callable[[E], E]:
        def mark(endpoint: E) -> E:
            commands[endpoint.__name__] = (subject, result)
            return endpoint

        return mark

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["bus"] = await BusClient.connect(nats_url, name="memgate-rest", timeout=timeout,
                                               local=local, **(nats_options or {}))
        try:
            async with mcp.serving(state["bus"]):
                yield
        finally:
            await state["bus"].close()

    app = FastAPI(title="memgate", version="0.1.0", lifespan=lifespan,
                  description="Governed long-term memory for AI agents.", telemetry=NO_TELEMETRY)

    # The MCP tools (streamable HTTP): Starlette runs an ASGI app given as a route's endpoint.
    app.add_route("/mcp", mcp, include_in_schema=False)  # type: ignore[arg-type]
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    install_error_handlers(app)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        refusal = ValidationFailedError("the request is not valid", {"problems": _problems(exc)})
        token = token_of(request.headers.get("Authorization"))
        route = commands.get(getattr(request.scope.get("route"), "name", ""))
        if route is None:  # no body to refuse on the bus: these routes all need a credential
            return error_response(refusal if token else
                                  UnauthenticatedError("a credential is required"))
        subject, result = route
        try:
            await state["bus"].command(subject, token, REFUSED_BODY, result,
                                       params=dict(request.path_params), transport="rest")
        except ValidationFailedError:
            return error_response(refusal)
        except MemgateError as failure:
            return error_response(failure)
        log.error("the bus accepted a refused body on %s", subject)
        return error_response(refusal)

    async def send(subject: str, result: type[T], token: str | None,
                   body: Contract | dict[str, Any], **params: str) -> T:
        return await state["bus"].command(subject, token, body, result, params=params,
                                          transport="rest")

    async def answering() -> dict[str, bool]:
        """Each of `ready_subjects`: whether its actor answers now."""
        bus = state["bus"]
        replies = await asyncio.gather(
            *(bus.request(s, b"{}", Ready, timeout=READY_TIMEOUT_S) for s in ready_subjects),
            return_exceptions=True)
        return {s: not isinstance(reply, BaseException)
                for s, reply in zip(ready_subjects, replies, strict=True)}

    @app.get("/healthz", tags=["operations"], responses=responses(503))
    async def healthz() -> JSONResponse:
        nonlocal came_up
        waiting = [s for s, ready in (await answering()).items() if not ready]
        came_up = came_up or not waiting
        degraded = came_up and all(s in cluster_subjects for s in waiting)
        status = "ok" if not waiting else "degraded" if degraded else "starting"
        names = {s: s.removeprefix("mem.int.ready.") for s in ready_subjects}
        return JSONResponse({"status": status, "waiting": [names[s] for s in waiting],
                             "actors": {name: "waiting" if s in waiting else "ready"
                                        for s, name in names.items()}},
                            status_code=200 if status != "starting" else 503)

    # A request is matched against the routes in order, and an included router is costly to
    # try (FastAPI walks each of its routes), so the agents' memory routes come first, on the
    # app itself; then the admin routes, as they always came.
    _agent_routes(app, send, command)
    # No path here overlaps another module's; among the modules the order matters
    # (`/memory/spaces` before `/memory/{spaceId}`) and is kept.
    app.include_router(rest_admin.router(send, command))
    for module in (rest_spaces, rest_sessions, rest_mem0, rest_mem0_profiles, rest_erasure):
        app.include_router(module.router(send, command))
    app.include_router(rest_metrics.router(send, answering))
    app.include_router(console.router())

    return app


def _agent_routes(app: FastAPI, send: Send, mark: Mark) -> None:
    """The agents' memory operations (SPEC §3.1), on the app itself: matched first."""

    @app.post("/api/agent/v1/memories/remember", tags=["memories"],
              responses=responses(*COMMON, 409, 429))
    @mark(subjects.REMEMBER, RememberResult)
    async def remember(body: RememberRequest, token: Token,
                       idempotency_key: IdempotencyKey = None) -> RememberResult:
        if idempotency_key is not None:
            body = body.model_copy(update={"idempotency_key": idempotency_key})
        return await send(subjects.REMEMBER, RememberResult, bearer(token), body)

    @app.post("/api/agent/v1/memories/import", tags=["memories"],
              responses=responses(*COMMON, 429))
    @mark(subjects.IMPORT, ImportResult)
    async def import_memories(body: ImportRequest, token: Token) -> ImportResult:
        """Up to 1,000 remember bodies (each may carry its `idempotencyKey`), each governed
        as a remember and stored or refused alone, in one transaction."""
        return await send(subjects.IMPORT, ImportResult, bearer(token), body)

    @app.post("/api/admin/workspaces/{wsId}/memories/import", tags=["admin"],
              responses=responses(*COMMON))
    @mark(subjects.IMPORT, ImportResult)
    async def operator_import(wsId: PathId, body: ImportRequest, token: Token) -> ImportResult:
        """The operator's import (admin token): each item also names its `memberId`, and may
        keep its `createdAt`."""
        return await send(subjects.IMPORT, ImportResult, bearer(token),
                          body.model_copy(update={"workspace_id": wsId}))

    @app.post("/api/agent/v1/memories/recall", tags=["memories"], responses=responses(*COMMON))
    @mark(subjects.RECALL, RecallResult)
    async def recall(body: RecallRequest, token: Token) -> RecallResult:
        return await send(subjects.RECALL, RecallResult, bearer(token), body)

    @app.post("/api/agent/v1/memories/list", tags=["memories"], responses=responses(*COMMON))
    @mark(subjects.LIST, ListResult)
    async def list_memories(body: ListRequest, token: Token) -> ListResult:
        return await send(subjects.LIST, ListResult, bearer(token), body)

    @app.post("/api/agent/v1/memories/forget", tags=["memories"], responses=responses(*COMMON))
    @mark(subjects.FORGET, ForgetResult)
    async def forget(body: ForgetRequest, token: Token,
                     idempotency_key: IdempotencyKey = None) -> ForgetResult:
        if idempotency_key is not None:
            body = body.model_copy(update={"idempotency_key": idempotency_key})
        return await send(subjects.FORGET, ForgetResult, bearer(token), body)
