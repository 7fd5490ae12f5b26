"""Live re-verification of citations (SPEC §3.3): one batched registry request per command."""

from __future__ import annotations

from dataclasses import dataclass, field

from bus import BusClient, subjects
from contracts import Memory
from contracts.registry import Verification, Verify


@dataclass(frozen=True)
class Verified:
    memories: list[Memory]
    hidden: int = 0
    entity_matches: dict[str, int] = field(default_factory=dict)


async def reverify(bus: BusClient, workspace_id: str, context_set_id: str | None,
                   memories: list[Memory], query: str | None = None) -> Verified:
    """Drop memories whose cited documents are gone, expired or unreadable now; mark those whose
    sources changed; count entities the query names (for recall's entity list)."""
    cited = {m.memory_id: m.citations for m in memories if m.citations}
    if not cited:
        return Verified(memories)
    verdict = await bus.request(subjects.registry("verify"), Verify(
        workspace_id=workspace_id, context_set_id=context_set_id, citations=cited, query=query),
        Verification)
    hidden, changed = set(verdict.hidden), set(verdict.changed)
    kept = [m.model_copy(update={"source_state": "changed"}) if m.memory_id in changed else m
            for m in memories if m.memory_id not in hidden]
    return Verified(kept, len(hidden), verdict.entity_matches)
