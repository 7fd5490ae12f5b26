"""Live re-verification of citations (SPEC §3.3): one batched registry request per command."""

from __future__ import annotations

from memgate.bus import BusClient, subjects
from memgate.contracts import Memory
from memgate.contracts.registry import Citation, Verification, Verify


async def verify(bus: BusClient, workspace_id: str, context_set_id: str | None,
                 cited: dict[str, list[Citation]], query: str | None = None) -> Verification:
    """Which of these memories to hide (sources gone, expired or unreadable now), which cite
    changed sources, and how many entities the query names in each one's passages."""
    if not cited:  # nothing cites anything: no request at all
        return Verification()
    return await bus.request(subjects.registry("verify"), Verify(
        workspace_id=workspace_id, context_set_id=context_set_id, citations=cited, query=query),
        Verification)


def apply(verdict: Verification, memories: list[Memory]) -> list[Memory]:
    hidden, changed = set(verdict.hidden), set(verdict.changed)
    return [m.model_copy(update={"source_state": "changed"}) if m.memory_id in changed else m
            for m in memories if m.memory_id not in hidden]


async def reverify(bus: BusClient, workspace_id: str, context_set_id: str | None,
                   memories: list[Memory]) -> tuple[list[Memory], int]:
    """The memories still shown, and how many were hidden."""
    verdict = await verify(bus, workspace_id, context_set_id,
                           {m.memory_id: m.citations for m in memories if m.citations})
    return apply(verdict, memories), len(verdict.hidden)
