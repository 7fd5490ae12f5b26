"""REST routes: the rest of mem0 2.2.1's client under /memory/{spaceId} (SPEC §4.4). Bus
clients only.

The user-profile and entity calls go to the space-memories actor like every mem0 route
(`actors.space_profiles`, `actors.space_entities`). The calls memgate does not serve
(`UNSERVED`: exports, summaries, project settings, webhooks, feedback) answer mem0's own
refusal: 404 with `detail` naming the call, which the client raises as its
`MemoryNotFoundError` (docs/mem0-client.md lists every method of the client and what it gets).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from memgate.adapters.http_errors import COMMON, responses
from memgate.adapters.rest_mem0 import READS, WRITES, Mem0Route, _json, forwarder, mem0_error
from memgate.adapters.routing import Mark, Send
from memgate.contracts.errors import NotFoundError
from memgate.contracts.mem0 import Mem0Message
from memgate.contracts.mem0_entities import EntityList
from memgate.contracts.profiles import (
    Profile, ProfileJobCreated, ProfileJobEnvelope, ProfileSettings,
)

# (method, path, the client's methods that call it) of each mem0 route memgate does not serve
UNSERVED: tuple[tuple[str, str, str], ...] = (
    ("POST", "/v1/exports/", "create_memory_export"),
    ("POST", "/v1/exports/get/", "get_memory_export"),
    ("POST", "/v1/summary/", "get_summary"),
    ("GET", "/api/v1/orgs/organizations/{orgId}/projects/{projectId}/", "get_project"),
    ("PATCH", "/api/v1/orgs/organizations/{orgId}/projects/{projectId}/", "update_project"),
    ("GET", "/api/v1/webhooks/projects/{projectId}/", "get_webhooks"),
    ("POST", "/api/v1/webhooks/projects/{projectId}/", "create_webhook"),
    ("PUT", "/api/v1/webhooks/{webhookId}/", "update_webhook"),
    ("DELETE", "/api/v1/webhooks/{webhookId}/", "delete_webhook"),
    ("POST", "/v1/feedback/", "feedback"),
)


def _refusal(calls: str) -> Callable[[], Awaitable[JSONResponse]]:
    async def unserved() -> JSONResponse:
        return mem0_error(NotFoundError(
            f"memgate does not serve mem0's {calls} (see docs/mem0-client.md)",
            {"unserved": calls}))

    return unserved


def router(send: Send, mark: Mark) -> APIRouter:
    routes = APIRouter(prefix="/memory/{spaceId}", tags=["mem0-compatible"],
                       route_class=Mem0Route)
    forward = forwarder(send)

    @routes.get("/v1/entities/", responses=READS)
    async def mem0_users(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "users", EntityList)))

    @routes.delete("/v2/entities/{entityType}/{entityId}/", responses=READS)
    async def mem0_delete_entity(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "delete_entity", Mem0Message)))

    @routes.get("/v2/entities/{entityType}/{entityId}/profile/", responses=READS)
    async def mem0_get_profile(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "profile", Profile)))

    @routes.post("/v2/profiles/jobs/", responses=responses(*COMMON, 409, 422))
    async def mem0_generate_profiles(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "profile_job", ProfileJobCreated,
                                                body=True)))

    @routes.get("/v2/profiles/jobs/{jobId}/", responses=READS)
    async def mem0_get_profile_job(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "profile_job_get",
                                                ProfileJobEnvelope)))

    @routes.get("/v2/profiles/settings/", responses=READS)
    async def mem0_get_profile_settings(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "profile_settings", ProfileSettings)))

    @routes.post("/v2/profiles/settings/", responses=WRITES)
    async def mem0_update_profile_settings(request: Request) -> JSONResponse:
        return JSONResponse(_json(await forward(request, "profile_settings_update",
                                                ProfileSettings, body=True)))

    for method, path, calls in UNSERVED:
        routes.add_api_route(path, _refusal(calls), methods=[method], include_in_schema=False,
                             name=f"mem0_unserved_{method.lower()}_{path}")
    return routes


__all__ = ["UNSERVED", "router"]
