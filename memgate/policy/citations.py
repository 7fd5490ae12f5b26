"""What a registry verdict does to memories on their way out (SPEC §3.3)."""

from __future__ import annotations

from memgate.contracts import Memory
from memgate.contracts.registry import Citation, Verification


def cited(memories: list[Memory]) -> dict[str, list[Citation]]:
    """The memories that cite anything, with their citations (the only ones to verify)."""
    return {m.memory_id: m.citations for m in memories if m.citations}


def apply(verdict: Verification, memories: list[Memory]) -> list[Memory]:
    """Drop the hidden memories; mark those citing changed sources `source_state: changed`."""
    hidden, changed = set(verdict.hidden), set(verdict.changed)
    return [m.model_copy(update={"source_state": "changed"}) if m.memory_id in changed else m
            for m in memories if m.memory_id not in hidden]
