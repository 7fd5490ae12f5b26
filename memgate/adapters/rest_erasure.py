"""REST routes: erasure requests (SPEC §5.3), operator only. Bus clients only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from memgate.adapters.http_errors import COMMON, responses
from memgate.adapters.routing import CallerToken, Mark, Send
from memgate.bus.subjects import Admin
from memgate.contracts.base import ID_MAX
from memgate.contracts.erasure import (
    Decide, ErasureIntake, ErasureMetrics, ErasureRequests, ErasureView, VerifyIdentity,
)

PathId = Annotated[str, Path(min_length=1, max_length=ID_MAX)]
ERRORS = responses(*COMMON, 409)


def router(send: Send, mark: Mark) -> APIRouter:
    routes = APIRouter(prefix="/api/admin/erasure-requests", tags=["erasure"])

    @routes.post("", responses=ERRORS)
    @mark(Admin.ERASURE_CREATE, ErasureView)
    async def create_erasure_request(body: ErasureIntake, token: CallerToken) -> ErasureView:
        """Intake: recorded with its deadline (30 days); nothing is resolved yet."""
        return await send(Admin.ERASURE_CREATE, ErasureView, token, body)

    @routes.get("", responses=ERRORS)
    async def list_erasure_requests(token: CallerToken) -> ErasureRequests:
        """Every request, newest first: stages, counts and evidence, never content."""
        return await send(Admin.ERASURE_LIST, ErasureRequests, token, {})

    @routes.get("/metrics", responses=ERRORS)
    async def erasure_metrics(token: CallerToken) -> ErasureMetrics:
        return await send(Admin.ERASURE_METRICS, ErasureMetrics, token, {})

    @routes.get("/{requestId}", responses=ERRORS)
    async def get_erasure_request(requestId: PathId, token: CallerToken) -> ErasureView:
        """Status and evidence: stages, counts per layer, when; never content."""
        return await send(Admin.ERASURE_GET, ErasureView, token, {}, requestId=requestId)

    @routes.post("/{requestId}/verify", responses=ERRORS)
    @mark(Admin.ERASURE_VERIFY, ErasureView)
    async def verify_erasure_request(requestId: PathId, body: VerifyIdentity,
                                     token: CallerToken) -> ErasureView:
        return await send(Admin.ERASURE_VERIFY, ErasureView, token, body, requestId=requestId)

    @routes.post("/{requestId}/discover", responses=ERRORS)
    async def discover_erasure_request(requestId: PathId, token: CallerToken) -> ErasureView:
        """Counts per layer (SPEC §5.2) for the verified subject, in its tenant only."""
        return await send(Admin.ERASURE_DISCOVER, ErasureView, token, {}, requestId=requestId)

    @routes.post("/{requestId}/decide", responses=ERRORS)
    @mark(Admin.ERASURE_DECIDE, ErasureView)
    async def decide_erasure_request(requestId: PathId, body: Decide,
                                     token: CallerToken) -> ErasureView:
        return await send(Admin.ERASURE_DECIDE, ErasureView, token, body, requestId=requestId)

    @routes.post("/{requestId}/execute", responses=ERRORS)
    async def execute_erasure_request(requestId: PathId, token: CallerToken) -> ErasureView:
        """Starts the erasure; poll `GET` until `completed` (or `failed`, then execute again)."""
        return await send(Admin.ERASURE_EXECUTE, ErasureView, token, {}, requestId=requestId)

    return routes
