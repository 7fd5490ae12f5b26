"""Memory spaces (SPEC §4.1, §4.5): spaces, sharing roles, and the access check every space
route makes first.

The spaces actor owns the spaces, their shares and the mem0 entities seen in each space; every
other actor that serves a space route (sessions, space memories) asks it `access` first.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from memgate.contracts.base import Contract
from memgate.contracts.errors import ForbiddenError, NotFoundError


class Permission(StrEnum):
    CAN_VIEW = "CAN_VIEW"
    CAN_UPDATE = "CAN_UPDATE"
    CAN_DELETE = "CAN_DELETE"
    CAN_SHARE = "CAN_SHARE"


class SpaceRole(StrEnum):
    CONSUMER = "consumer"
    EDITOR = "editor"
    OWNER = "owner"

    @property
    def permissions(self) -> list[Permission]:
        return list(_PERMISSIONS[self])


_PERMISSIONS = {
    SpaceRole.CONSUMER: (Permission.CAN_VIEW,),
    SpaceRole.EDITOR: (Permission.CAN_VIEW, Permission.CAN_UPDATE),
    SpaceRole.OWNER: tuple(Permission),
}


class CreateSpace(Contract):
    description: str = Field(default="", max_length=1000)
    llm_model_name: str | None = Field(default=None, min_length=1, max_length=120)
    llm_base_url: str | None = Field(default=None, min_length=1, max_length=2000)


class SpaceView(Contract):
    id: str
    description: str
    llm_model_name: str | None = None
    llm_base_url: str | None = None
    permissions: list[Permission]
    rbac_resource_id: str


class SpaceList(Contract):
    spaces: list[SpaceView]


class ShareSpace(Contract):
    role: SpaceRole


class AccessRequest(Contract):
    """May the holder of this member token use this space, and with which permissions?

    Refused with UNAUTHENTICATED (unknown or revoked token), MEMORY_SPACES_DISABLED (the
    member's flag is off) or NOT_FOUND (no such space, or no share in it: never which)."""

    token_hash: str
    space_id: str


class SpaceAccess(Contract):
    """What the caller may do in the space, resolved afresh at every request."""

    model_config = ConfigDict(extra="ignore")  # a newer spaces actor may add fields

    space_id: str
    workspace_id: str
    member_id: str
    role: SpaceRole
    permissions: list[Permission]
    llm_model_name: str | None = None
    llm_base_url: str | None = None
    retention_days: int = 90  # the workspace's (SPEC §3.9)

    def allows(self, permission: Permission) -> bool:
        return permission in self.permissions

    def require(self, permission: Permission) -> SpaceAccess:
        """This access if it allows `permission`. Else refused: NOT_FOUND when the caller may
        not even view the space (its existence is not told), FORBIDDEN otherwise."""
        if self.allows(permission):
            return self
        if not self.allows(Permission.CAN_VIEW):
            raise NotFoundError("no such memory space")
        raise ForbiddenError("your role in this memory space does not allow this",
                             {"permission": permission.value})


class Entity(Contract):
    """Who a mem0 memory is about: its `user_id`, `agent_id`, `run_id` (any may be absent).

    Memories of one entity share one storage namespace, `namespace`, an opaque id the spaces
    actor issues (the ids themselves may be personal: they stay in the spaces actor's file)."""

    model_config = ConfigDict(extra="ignore")

    user_id: str | None = Field(default=None, min_length=1, max_length=200)
    agent_id: str | None = Field(default=None, min_length=1, max_length=200)
    run_id: str | None = Field(default=None, min_length=1, max_length=200)
    namespace: str | None = None  # set in replies


class EntityRequest(Contract):
    """The namespace of this entity in the space, for an add about it: its own, or for a new
    entity a new one, whose row is written pending before the store (an erasure finds it) and
    kept only if memories are stored (`EntitySettled`)."""

    space_id: str
    entity: Entity


class EntitySettled(Contract):
    """An add about an entity ended (`mem.int.spaces.settle`): with its memories `stored`
    (a new entity's pending row is settled) or refused (a new entity's row is deleted once
    every add about it was refused)."""

    space_id: str
    entity: Entity
    stored: bool


class EntitiesRequest(Contract):
    """The entities of these namespaces in the space (what a read shows: a page, at most)."""

    space_id: str
    namespaces: list[str] = Field(max_length=1000)


class Entities(Contract):
    entities: list[Entity]  # those of the namespaces asked that the space knows, with them


class ScopeRequest(Contract):
    """The namespaces of the space's entities that a mem0 filter selects (resolved where the
    entity map is: it may be too large for one message)."""

    space_id: str
    filters: dict[str, Any]


class Scope(Contract):
    namespaces: list[str]


__all__ = [
    "AccessRequest", "CreateSpace", "Entities", "EntitiesRequest", "Entity", "EntityRequest",
    "EntitySettled", "Scope", "ScopeRequest",
    "Permission", "ShareSpace", "SpaceAccess", "SpaceList", "SpaceRole", "SpaceView",
]
