"""REST routes: erasure requests (SPEC §5.3), operator only. Bus clients only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from memgate.adapters.http_errors import COMMON, responses
from memgate.adapters.routing import CallerToken, Mark, Send
from memgate.bus import subjects
from memgate.contracts.base import ID_MAX
from memgate.contracts.erasure import (
    Decide, ErasureIntake, ErasureMetrics, ErasureRequests, ErasureView, VerifyIdentity,
)

PathId = Annotated[str, Path(min_length=1, max_length=ID_MAX)]
ERRORS = responses(*COMMON, 409)


def router(send: Send, mark: Mark) -> APIRouter:
    routes = APIRouter(prefix="/api/admin/erasure-requests", tags=["erasure"])

    def subject(stage: str) -> str:
        return subjects.admin(f"erasure.{stage}")

    @routes.post("", responses=ERRORS)
    @mark(subject("create"), ErasureView)
    async def create_erasure_request(body: ErasureIntake, token: CallerToken) -> ErasureView:
        """Intake: recorded with its deadline (30 days); nothing is resolved yet."""
        return await send(subject("create"), ErasureView, token, body)

    @routes.get("", responses=ERRORS)
    async def list_erasure_requests(token: CallerToken) -> ErasureRequests:
        """Every request, newest first: stages, counts and evidence, never content."""
        return await send(subject("list"), ErasureRequests, token, {})

    @routes.get("/metrics", responses=ERRORS)
    async def erasure_metrics(token: CallerToken) -> ErasureMetrics:
        return await send(subject("metrics"), ErasureMetrics, token, {})

    @routes.get("/{requestId}", responses=ERRORS)
    async def get_erasure_request(requestId: PathId, token: CallerToken) -> ErasureView:
        """Status and evidence: stages, counts per layer, when; never content."""
        return await send(subject("get"), ErasureView, token, {}, requestId=requestId)

    @routes.post("/{requestId}/verify", responses=ERRORS)
    @mark(subject("verify"), ErasureView)
    async def verify_erasure_request(requestId: PathId, body: VerifyIdentity,
                                     token: CallerToken) -> ErasureView:
        return await send(subject("verify"), ErasureView, token, body, requestId=requestId)

    @routes.post("/{requestId}/discover", responses=ERRORS)
    async def discover_erasure_request(requestId: PathId, token: CallerToken) -> ErasureView:
        """Counts per layer (SPEC §5.2) for the verified subject, in its tenant only."""
        return await send(subject("discover"), ErasureView, token, {}, requestId=requestId)

    @routes.post("/{requestId}/decide", responses=ERRORS)
    @mark(subject("decide"), ErasureView)
    async def decide_erasure_request(requestId: PathId, body: Decide,
                                     token: CallerToken) -> ErasureView:
        return await send(subject("decide"), ErasureView, token, body, requestId=requestId)

    @routes.post("/{requestId}/execute", responses=ERRORS)
    async def execute_erasure_request(requestId: PathId, token: CallerToken) -> ErasureView:
        """Starts the erasure; poll `GET` until `completed` (or `failed`, then execute again)."""
        return await send(subject("execute"), ErasureView, token, {}, requestId=requestId)

    return routes
