"""The spaces actor as the sessions and space-memories actors see it (SPEC §4): who may do what
in a space, and who its memories are about."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from memgate.bus import subjects
from memgate.contracts import Done, Envelope
from memgate.contracts.base import ID_MAX
from memgate.contracts.erasure import SubjectTarget
from memgate.contracts.errors import NotFoundError, UnauthenticatedError
from memgate.contracts.mem0 import SpaceLlm, SpaceLlmRequest
from memgate.contracts.spaces import (
    AccessRequest, Entities, EntitiesRequest, Entity, EntityRequest, EntitySettled, Permission,
    Scope, ScopeRequest, SpaceAccess,
)
from memgate.ports.bus import Requester
from memgate.storage.directory import hash_token


class Spaces(Protocol):
    async def access(self, envelope: Envelope, permission: Permission) -> SpaceAccess:
        """The caller's access to the envelope's `spaceId`, if it allows `permission`; a space
        the caller may not even view is not found."""
        ...

    async def entities(self, space_id: str, namespaces: Sequence[str]) -> list[Entity]: ...

    async def scope(self, space_id: str, filters: dict[str, Any]) -> list[str]:
        """The namespaces of the space's entities a mem0 filter selects."""
        ...

    async def entity(self, space_id: str, entity: Entity) -> Entity:
        """The entity with its namespace; a new one is written pending until `settle`."""
        ...

    async def settle(self, space_id: str, entity: Entity, *, stored: bool) -> None: ...
    async def llm(self, space_id: str) -> SpaceLlm: ...

    async def subject(self, target: SubjectTarget) -> SubjectTarget:
        """An erasure's end user: the namespaces that hold them, by owner (`target.owners`);
        erasing, their entity rows go (the identity mapping, last)."""
        ...


class BusSpaces:
    """`Spaces` over the bus (`mem.int.spaces.*`)."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def access(self, envelope: Envelope, permission: Permission) -> SpaceAccess:
        if not envelope.token:
            raise UnauthenticatedError("a member token is required")
        space_id = envelope.params.get("spaceId", "")
        if not 1 <= len(space_id) <= ID_MAX:
            raise NotFoundError("no such memory space")
        access = await self._bus.request(subjects.spaces_internal("access"), AccessRequest(
            token_hash=hash_token(envelope.token), space_id=space_id), SpaceAccess)
        return access.require(permission)

    async def entities(self, space_id: str, namespaces: Sequence[str]) -> list[Entity]:
        found = await self._bus.request(subjects.spaces_internal("entities"), EntitiesRequest(
            space_id=space_id, namespaces=list(namespaces)), Entities)
        return found.entities

    async def scope(self, space_id: str, filters: dict[str, Any]) -> list[str]:
        return (await self._bus.request(subjects.spaces_internal("scope"), ScopeRequest(
            space_id=space_id, filters=filters), Scope)).namespaces

    async def entity(self, space_id: str, entity: Entity) -> Entity:
        return await self._bus.request(subjects.spaces_internal("entity"), EntityRequest(
            space_id=space_id, entity=entity), Entity)

    async def settle(self, space_id: str, entity: Entity, *, stored: bool) -> None:
        await self._bus.request(subjects.spaces_internal("settle"), EntitySettled(
            space_id=space_id, entity=entity, stored=stored), Done)

    async def llm(self, space_id: str) -> SpaceLlm:
        return await self._bus.request(subjects.spaces_internal("llm"),
                                       SpaceLlmRequest(space_id=space_id), SpaceLlm)

    async def subject(self, target: SubjectTarget) -> SubjectTarget:
        return await self._bus.request(subjects.spaces_internal("subject"), target,
                                       SubjectTarget)


__all__ = ["BusSpaces", "Spaces"]
