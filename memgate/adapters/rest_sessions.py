"""REST routes: sessions and events of memory spaces (SPEC §4.2, §4.3). Bus clients only.

Bodies are forwarded as the JSON objects they are: the sessions actor parses them (a null
`lifecycleStrategies` must reach it as null, to be refused, not dropped as absent).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query, Response

from memgate.adapters.http_errors import COMMON, QUOTA, responses
from memgate.adapters.routing import CallerToken, IdempotencyKey, Mark, Send, keyed
from memgate.bus import subjects
from memgate.contracts import Done
from memgate.contracts.base import ID_MAX
from memgate.contracts.sessions import MAX_LAST_N, EventList, EventView, SessionView

PathId = Annotated[str, Path(min_length=1, max_length=ID_MAX)]
SequenceId = Annotated[int, Path(ge=0, le=10**15 - 1)]
IfMatch = Annotated[str | None, Header(alias="If-Match", max_length=64)]
JsonObject = Annotated[dict[str, Any], Body()]
ERRORS = responses(*COMMON, 422)


def _subject(operation: str) -> str:
    return subjects.space(f"sessions.{operation}")


def _etag(response: Response, session: SessionView) -> SessionView:
    response.headers["ETag"] = f'"{session.version}"'
    return session


def router(send: Send, mark: Mark) -> APIRouter:
    routes = APIRouter(prefix="/memory/{spaceId}/sessions", tags=["memory sessions"])

    @routes.post("", responses=responses(*COMMON, 422, *QUOTA),
                 openapi_extra=_schema("CreateSession"))
    @mark(_subject("create"), SessionView)
    async def session_create(spaceId: PathId, body: JsonObject, token: CallerToken,
                             response: Response,
                             idempotency_key: IdempotencyKey = None) -> SessionView:
        """`{participants, description?, lifecycleStrategies?}` → the session; sent again
        with the same `Idempotency-Key` (the member's): the session the first made."""
        created = await send(_subject("create"), SessionView, token, body, spaceId=spaceId,
                             **keyed(idempotency_key))
        return _etag(response, created)

    @routes.get("/{sessionId}", responses=ERRORS)
    @mark(_subject("get"), SessionView)
    async def session_get(spaceId: PathId, sessionId: PathId, token: CallerToken,
                          response: Response) -> SessionView:
        found = await send(_subject("get"), SessionView, token, {}, spaceId=spaceId,
                           sessionId=sessionId)
        return _etag(response, found)

    @routes.patch("/{sessionId}", responses=responses(*COMMON, 409, 412, 422),
                  openapi_extra=_schema("PatchSession"))
    @mark(_subject("patch"), SessionView)
    async def session_patch(spaceId: PathId, sessionId: PathId, body: JsonObject,
                            token: CallerToken, response: Response,
                            if_match: IfMatch = None) -> SessionView:
        """`lifecycleStrategies` replaces the whole list; `If-Match: "<version>"` is honoured
        (stale: 412)."""
        params = {"spaceId": spaceId, "sessionId": sessionId}
        if if_match is not None:
            params["ifMatch"] = if_match
        updated = await send(_subject("patch"), SessionView, token, body, **params)
        return _etag(response, updated)

    @routes.delete("/{sessionId}", responses=responses(*COMMON, 412))
    @mark(_subject("delete"), Done)
    async def session_delete(spaceId: PathId, sessionId: PathId, token: CallerToken,
                             if_match: IfMatch = None) -> Done:
        params = {"spaceId": spaceId, "sessionId": sessionId}
        if if_match is not None:
            params["ifMatch"] = if_match
        return await send(_subject("delete"), Done, token, {}, **params)

    @routes.post("/{sessionId}/events", responses=responses(*COMMON, 422, *QUOTA),
                 openapi_extra=_schema("EventIn"))
    @mark(_subject("events.append"), EventView)
    async def session_events_append(spaceId: PathId, sessionId: PathId, body: JsonObject,
                                    token: CallerToken,
                                    idempotency_key: IdempotencyKey = None,
                                    ) -> EventView | EventList:
        """One event `{body, emitter: {type, id}, eventType}` → it, with its `sequenceId`; or
        `{events: [...]}` (1 to 200, one transaction: all or none) → `{events: [...]}`. Sent
        again with the same `Idempotency-Key` (the member's, within 24 h): the events the
        first stored, nothing appended."""
        answer = EventList if "events" in body else EventView
        return await send(_subject("events.append"), answer, token, body, spaceId=spaceId,
                          sessionId=sessionId, **keyed(idempotency_key))

    @routes.get("/{sessionId}/events", responses=ERRORS)
    @mark(_subject("events.list"), EventList)
    async def session_events_list(
            spaceId: PathId, sessionId: PathId, token: CallerToken,
            lastN: Annotated[int, Query(ge=1, le=MAX_LAST_N)] = 20) -> EventList:
        """The newest `lastN` events, oldest first."""
        return await send(_subject("events.list"), EventList, token, {"lastN": lastN},
                          spaceId=spaceId, sessionId=sessionId)

    @routes.patch("/{sessionId}/events/{sequenceId}", responses=responses(*COMMON, 412, 429),
                  openapi_extra=_schema("EditEvent"))
    @mark(_subject("events.edit"), EventView)
    async def session_events_edit(spaceId: PathId, sessionId: PathId, sequenceId: SequenceId,
                                  body: JsonObject, token: CallerToken) -> EventView:
        """`{body, createdAt?}`: with `createdAt`, refused (412) if the event changed after it."""
        return await send(_subject("events.edit"), EventView, token, body, spaceId=spaceId,
                          sessionId=sessionId, sequenceId=str(sequenceId))

    return routes


def _schema(name: str) -> dict[str, Any]:
    """Documents the body a route forwards as a JSON object (see the module's docstring)."""
    return {"requestBody": {"description": f"a `{name}` (memgate.contracts.sessions)"}}
