"""REST routes: memory spaces and sharing (SPEC §4.1, §4.5). Bus clients only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from memgate.adapters.http_errors import COMMON, QUOTA, responses
from memgate.adapters.routing import CallerToken, IdempotencyKey, Mark, Send, keyed
from memgate.bus import subjects
from memgate.contracts import Done
from memgate.contracts.base import ID_MAX
from memgate.contracts.spaces import CreateSpace, ShareSpace, SpaceList, SpaceView

PathId = Annotated[str, Path(min_length=1, max_length=ID_MAX)]
SPACE_ERRORS = responses(*COMMON, 422)


def router(send: Send, mark: Mark) -> APIRouter:
    routes = APIRouter(prefix="/memory/spaces", tags=["memory spaces"])

    @routes.post("", responses=responses(*COMMON, 422, *QUOTA))
    @mark(subjects.space("spaces.create"), SpaceView)
    async def create_space(body: CreateSpace, token: CallerToken,
                           idempotency_key: IdempotencyKey = None) -> SpaceView:
        """Sent again with the same `Idempotency-Key` (the member's): the space the first
        made, nothing created."""
        return await send(subjects.space("spaces.create"), SpaceView, token, body,
                          **keyed(idempotency_key))

    @routes.get("", responses=SPACE_ERRORS)
    async def list_spaces(token: CallerToken) -> SpaceList:
        return await send(subjects.space("spaces.list"), SpaceList, token, {})

    @routes.get("/{spaceId}", responses=SPACE_ERRORS)
    async def get_space(spaceId: PathId, token: CallerToken) -> SpaceView:
        return await send(subjects.space("spaces.get"), SpaceView, token, {}, spaceId=spaceId)

    @routes.delete("/{spaceId}", responses=SPACE_ERRORS)
    async def delete_space(spaceId: PathId, token: CallerToken) -> Done:
        return await send(subjects.space("spaces.delete"), Done, token, {}, spaceId=spaceId)

    @routes.put("/{spaceId}/shares/{memberId}", responses=SPACE_ERRORS)
    @mark(subjects.space("shares.put"), SpaceView)
    async def share_space(spaceId: PathId, memberId: PathId, body: ShareSpace,
                          token: CallerToken) -> SpaceView:
        return await send(subjects.space("shares.put"), SpaceView, token, body, spaceId=spaceId,
                          memberId=memberId)

    @routes.delete("/{spaceId}/shares/{memberId}", responses=SPACE_ERRORS)
    async def revoke_share(spaceId: PathId, memberId: PathId, token: CallerToken) -> Done:
        return await send(subjects.space("shares.delete"), Done, token, {}, spaceId=spaceId,
                          memberId=memberId)

    return routes
