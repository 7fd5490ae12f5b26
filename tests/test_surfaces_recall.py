"""Read-your-writes on every channel (SPEC §3.5; #28 finding 11): a recall sent the moment a
remember is answered ranks the new memory by meaning too, or says the cosine channel is missing."""

from __future__ import annotations

from tests.conftest import Memgate

# A memory, and a question about it that shares no word with it (only cosine can find it).
PAIRS = [
    ("The user deploys on Fridays", "which weekday are releases shipped"),
    ("Our customer prefers Japanese", "what language should replies be written in"),
    ("The office cat is called Miso", "name of the pet at work"),
    ("Invoices go out at month end", "when is billing sent"),
    ("She commutes by bicycle", "how does her trip to work happen"),
]


async def test_a_recall_right_after_a_remember_finds_it_by_meaning_or_says_cosine_is_missing(
        memgate: Memgate) -> None:
    agent = await memgate.new_agent("bus")
    found = 0
    for i in range(50):
        text, query = PAIRS[i % len(PAIRS)]
        stored = await agent.remember(namespace=f"n{i}", text=text)
        result = await agent.recall(query, namespace=f"n{i}")
        ids = [m.memory_id for m in result.memories]
        if stored.memory_id in ids:
            found += 1
        else:  # never an answer that claims to be complete without it
            assert "cosine" in result.degraded, (i, result.degraded)
    assert found == 50
