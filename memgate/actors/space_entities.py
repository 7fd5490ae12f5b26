"""The entity calls of a space's mem0-compatible API (mem0 2.2: `users`, `delete_users`,
`reset`), served by the space-memories actor (its `public` handlers).

`users()` lists each `user_id`, `agent_id` and `run_id` the space's current memories are about
(at most `read_max` versions read, as `get_all`), with their count. Deleting an entity deletes
every memory about it (all versions, as `delete_all` with its filter); an entity no memory is
about is not found (404), and mem0's `app` entities do not exist in memgate.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import datetime

from memgate.contracts import Contract, Envelope
from memgate.contracts.errors import NotFoundError
from memgate.contracts.internal import Owner, StoreForget, StoreQuery, space_owner
from memgate.contracts.mem0 import Mem0Message
from memgate.contracts.mem0_entities import EntityList, EntityType, EntityView
from memgate.contracts.spaces import Permission, SpaceAccess
from memgate.ports.spaces import Spaces
from memgate.ports.storage import Storage

Handler = Callable[[Envelope], Awaitable[Contract]]
TYPES: tuple[EntityType, ...] = ("user", "agent", "run")


def _owner(access: SpaceAccess) -> Owner:
    return Owner(tenant=access.workspace_id, subject_id=space_owner(access.space_id))


class SpaceEntities:
    def __init__(self, *, spaces: Spaces, storage: Storage, read_max: int) -> None:
        self._spaces = spaces
        self._storage = storage
        self._read_max = read_max

    def public(self) -> dict[str, Handler]:
        return {"users": self.users, "delete_entity": self.delete_entity}

    async def users(self, envelope: Envelope) -> EntityList:
        access = await self._spaces.access(envelope, Permission.CAN_VIEW)
        memories = (await self._storage.list(StoreQuery(owner=_owner(access),
                                                        limit=self._read_max))).memories
        times: dict[str, list[datetime]] = defaultdict(list)
        for memory in memories:
            times[memory.namespace].append(memory.created_at)
        found = await self._spaces.entities(access.space_id, sorted(times)) if times else []
        named: dict[tuple[EntityType, str], list[datetime]] = defaultdict(list)
        for entity in found:
            for kind, name in zip(TYPES, (entity.user_id, entity.agent_id, entity.run_id),
                                  strict=True):
                if name is not None and entity.namespace is not None:
                    named[(kind, name)] += times[entity.namespace]
        results = [EntityView(id=f"{kind}:{name}", name=name, type=kind,
                              total_memories=len(instants), owner=access.member_id,
                              organization=access.workspace_id, created_at=min(instants),
                              updated_at=max(instants))
                   for (kind, name), instants in sorted(named.items())]
        return EntityList(count=len(results), results=results)

    async def delete_entity(self, envelope: Envelope) -> Mem0Message:
        access = await self._spaces.access(envelope, Permission.CAN_DELETE)
        kind = envelope.params.get("entityType", "")
        if kind not in TYPES:
            raise NotFoundError("no such entity in this memory space")
        namespaces = await self._spaces.scope(
            access.space_id, {f"{kind}_id": envelope.params.get("entityId", "")})
        if not namespaces:
            raise NotFoundError("no such entity in this memory space")
        with contextlib.suppress(NotFoundError):  # none left: deleted all the same
            await self._storage.forget(StoreForget(owner=_owner(access), namespaces=namespaces))
        return Mem0Message(message="Entity deleted successfully!")


__all__ = ["SpaceEntities"]
