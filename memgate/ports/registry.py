"""The registry actor as governance and recall see it: context sets and citations (SPEC §3.3)."""

from __future__ import annotations

from typing import Protocol

from memgate.bus import subjects
from memgate.contracts.registry import (
    CheckRemember, Citation, Citations, Scope, ScopeRequest, Verification, Verify,
)
from memgate.ports.bus import Requester


class Registry(Protocol):
    async def scope(self, workspace_id: str, context_set_id: str) -> Scope:
        """A context set as it is now."""
        ...

    async def check_remember(self, request: CheckRemember) -> list[Citation]:
        """The citations to store with a memory, once every cited passage may be cited."""
        ...

    async def verify(self, workspace_id: str, context_set_id: str | None,
                     cited: dict[str, list[Citation]], query: str | None = None) -> Verification:
        """Which memories to hide (sources gone, expired or unreadable now), which cite changed
        sources, and how many entities the query names in each one's passages."""
        ...


class BusRegistry:
    """`Registry` over the bus (`mem.int.registry.*`): one batched request per command."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def scope(self, workspace_id: str, context_set_id: str) -> Scope:
        return await self._bus.request(subjects.registry("scope"), ScopeRequest(
            workspace_id=workspace_id, context_set_id=context_set_id), Scope)

    async def check_remember(self, request: CheckRemember) -> list[Citation]:
        return (await self._bus.request(subjects.registry("check_remember"), request,
                                        Citations)).citations

    async def verify(self, workspace_id: str, context_set_id: str | None,
                     cited: dict[str, list[Citation]], query: str | None = None) -> Verification:
        if not cited:  # nothing cites anything: no request at all
            return Verification()
        return await self._bus.request(subjects.registry("verify"), Verify(
            workspace_id=workspace_id, context_set_id=context_set_id, citations=cited,
            query=query), Verification)
