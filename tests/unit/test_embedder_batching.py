"""Under load a batch of events spans many owners: the embedder embeds them together (a few texts
a hop to the model thread, whatever their owners; one transaction)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memgate.actors import embedder as embedder_module
from memgate.actors.embedder import BACKGROUND_BATCH, EmbedderActor
from memgate.bus import subjects
from memgate.contracts.events import MemoryStored
from memgate.contracts.internal import Owner
from tests.fakes import FakeBus, FakeEmbedder, catalog_route, served, texts_route

pytestmark = pytest.mark.unit


async def test_a_batch_of_events_from_many_owners_is_embedded_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = FakeEmbedder()
    monkeypatch.setattr(embedder_module, "OnnxEmbedder", lambda *_, **__: model)
    texts = {"a": "budget review", "b": "team lunch"}  # every owner's, in the fake storage
    fake = FakeBus({subjects.store("p0", "texts"): texts_route(texts),
                    subjects.store("p0", "catalog"): catalog_route(texts)})
    actor = EmbedderActor(partition="p0", path=tmp_path / "vectors.duckdb", model=Path("m"),
                          tokenizer=Path("t"), bus=fake, batch=8)
    owners = [Owner(tenant="ws", subject_id=f"member-{n}") for n in range(3)]
    async with served(actor):
        before = len(model.calls)
        await fake.deliver("embedder-p0", [
            MemoryStored(partition="p0", owner=owner, memory_id=memory_id, seq=seq).to_json()
            for owner in owners for seq, memory_id in enumerate(texts, start=1)])
        runs = model.calls[before:]
        assert [text for run in runs for text in run] == ["budget review", "team lunch"] * 3
        assert all(len(run) <= BACKGROUND_BATCH for run in runs)
        found, _ = actor.vectors.owner("ws", "member-0")  # ids are unique: the fake's are not
        assert sorted(found) == ["a", "b"]
        await fake.deliver("embedder-p0", [  # redelivered: every catalog has its vectors
            MemoryStored(partition="p0", owner=owner, memory_id="b", seq=2).to_json()
            for owner in owners])
        assert model.calls[before:] == runs
