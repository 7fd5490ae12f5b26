"""Recall after a bulk import (issue 45): `cosine` is named degraded for the importer while its
versions wait for their vectors, never for another owner, and no longer once they have them.
Apart from tests/test_bulk_import.py, whose memgate runs no embedder."""

from __future__ import annotations

from tests.conftest import Memgate, eventually
from tests.test_bulk_import import items


async def test_recall_after_an_import_names_cosine_degraded_only_while_its_memories_wait(
    memgate: Memgate
) -> None:
    importer = await memgate.new_agent("rest")
    other = await memgate.new_agent("rest")
    await other.remember("notes", "the quarterly budget review is on friday")
    await importer.import_memories(items(400))
    waiting = await importer.recall("green tea", namespace="imported")
    unaffected = await other.recall("budget review")
    # its 400 versions take longer to embed than a recall waits, another owner's do not
    assert waiting.degraded == ["cosine"]
    assert waiting.memories  # found by their words meanwhile (BM25 reads its writes)
    assert unaffected.degraded == [] and unaffected.memories

    async def embedded() -> bool:
        return (await importer.recall("green tea", namespace="imported")).degraded == []

    await eventually(embedded, timeout=90)
