"""REST routes: the mem0-compatible routes under /memory/{spaceId} (SPEC §4.4). Bus clients only.

The unmodified `mem0ai` client (`MemoryClient(host=f"{base}/memory/{spaceId}", api_key=TOKEN)`)
calls these paths with `Authorization: Token <key>`. Each route forwards the member token, the
path, the query parameters it knows and the JSON body to `mem.space.memories.<op>`; the
space-memories actor checks access first and validates after, so a body that is not a JSON
object travels as a refusal the actor reports once the caller is known. Answers are mem0's
snake_case JSON. Errors keep the SPEC §3.10 `error` object and add mem0's `detail` beside it,
which the client turns into its own exceptions (400/422 ValidationError, 401/403
AuthenticationError, 404 MemoryNotFoundError, 429 RateLimitError with `Retry-After`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from memgate.adapters.http_errors import COMMON, error_response, responses
from memgate.adapters.routing import Mark, Send, token_of
from memgate.bus import subjects
from memgate.contracts import Contract
from memgate.contracts.errors import MemgateError
from memgate.contracts.memory import IDEMPOTENCY_KEY_MAX
from memgate.contracts.mem0 import (
    AddResults, History, ImportResults, Mem0Memory, Mem0Message, MemoryPage, Ping, SearchResults,
)

REFUSED = "refusedBody"  # a param set when the body is not a JSON object
QUERY_PARAMS = ("page", "page_size", "filters", "user_id", "agent_id", "run_id")
QUERY_PARAM_MAX = 8192
BODY_DEPTH_MAX = 32  # objects and lists within each other (mem0 bodies need a handful)
READS = responses(*COMMON)


def _query(*names: str) -> dict[str, Any]:
    """Query parameters for the OpenAPI document (the route reads them itself)."""
    return {"parameters": [{"name": name, "in": "query", "required": False,
                            "schema": {"type": "string"}} for name in names]}


WRITES = responses(*COMMON, 409, 429)


def mem0_error(exc: MemgateError) -> JSONResponse:
    """The §3.10 shape, with mem0's `detail` (its client reads the message from it)."""
    return error_response(exc, detail=exc.message)


class Mem0Route(APIRoute):
    """A route whose memgate errors carry mem0's `detail`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handle(request)
            except MemgateError as exc:
                return mem0_error(exc)

        return route


def _depth(value: Any) -> int:
    """How deeply a JSON value nests (iteratively: the value may be deeper than the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth > BODY_DEPTH_MAX:
                break
            stack += [(child, depth + 1)
                      for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def _no_constant(name: str) -> Any:
    """NaN and Infinity are no JSON: a body holding them is refused like any malformed one
    (they would otherwise travel on as null)."""
    raise ValueError("not JSON")


def _json(result: Contract) -> Any:
    """mem0's JSON: field names as they are (snake_case), no `score` outside search."""
    data = result.model_dump(mode="json")
    for memory in data.get("results", []) if isinstance(data, dict) else []:
        if isinstance(memory, dict) and memory.get("score", 0) is None:
            del memory["score"]
    return data


class Forward(Protocol):
    async def __call__(self, request: Request, operation: str, result: type[Contract], *,
                       body: bool = False, **params: str) -> Any: ...


def forwarder(send: Send) -> Forward:
    """Sends a mem0 route's request to `mem.space.memories.<operation>`: its path parameters,
    the query parameters it knows, its `Idempotency-Key` (a write retried answers as the first
    did: add and delete), `params` and its JSON body."""

    async def forward(request: Request, operation: str, result: type[Contract], *,
                      body: bool = False, **params: str) -> Any:
        params = {**{k: str(v) for k, v in request.path_params.items()}, **params}
        params.update({k: v[:QUERY_PARAM_MAX] for k, v in request.query_params.items()
                       if k in QUERY_PARAMS})
        if (key := request.headers.get("Idempotency-Key")) is not None:  # too long: refused
            params["idempotencyKey"] = key[:IDEMPOTENCY_KEY_MAX + 1]
        data: dict[str, Any] = {}
        if body:
            raw = await request.body()
            try:
                parsed = json.loads(raw, parse_constant=_no_constant) if raw else {}
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                parsed = None
            if isinstance(parsed, dict) and _depth(parsed) <= BODY_DEPTH_MAX:
                data = parsed
            else:
                params[REFUSED] = "1"
        token = token_of(request.headers.get("Authorization"))
        return await send(subjects.space(f"memories.{operation}"), result, token, data,
                          **params)

    return forward


def router(send: Send, mark: Mark) -> APIRouter:
    routes = APIRouter(prefix="/memory/{spaceId}", tags=["mem0-compatible"],
                       route_class=Mem0Route)

    forward = forwarder(send)

    @routes.get("/v1/ping/", responses=READS)
    async def mem0_ping(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "ping", Ping)))

    @routes.post("/v3/memories/add/", responses=WRITES)
    async def mem0_add(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "add", AddResults, body=True)))

    @routes.post("/v3/memories/", responses=READS, openapi_extra=_query("page", "page_size"))
    async def mem0_get_all(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "list", MemoryPage, body=True)))

    @routes.post("/v3/memories/search/", responses=READS)
    async def mem0_search(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "search", SearchResults, body=True)))

    @routes.get("/v1/memories/{memoryId}/", responses=READS)
    async def mem0_get(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "get", Mem0Memory)))

    @routes.put("/v1/memories/{memoryId}/", responses=WRITES)
    async def mem0_update(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "update", Mem0Memory, body=True)))

    @routes.delete("/v1/memories/{memoryId}/", responses=READS)
    async def mem0_delete(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "delete", Mem0Message)))

    @routes.delete("/v1/memories/", responses=READS,
                   openapi_extra=_query("filters", "user_id", "agent_id", "run_id"))
    async def mem0_delete_all(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "delete_all", Mem0Message)))

    @routes.put("/v1/batch/", responses=WRITES)
    async def mem0_batch_update(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "batch_update", Mem0Message,
                                                body=True)))

    @routes.delete("/v1/batch/", responses=READS)
    async def mem0_batch_delete(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "batch_delete", Mem0Message,
                                                body=True)))

    @routes.post("/v1/import/", responses=WRITES)
    async def memgate_import(request: Request) -> JSONResponse:
        """memgate's own (`memgate import mem0`): mem0 memories kept under their ids, with
        their timestamps and categories; a space owner's only."""
        return JSONResponse(_json(await forward(request, "import", ImportResults, body=True)))

    @routes.get("/v1/memories/{memoryId}/history/", responses=READS)
    async def mem0_history(request: Request) -> JSONResponse:
        history: History = await forward(request, "history", History)
        return JSONResponse(_json(history)["entries"])

    return routes
