"""The query batcher: concurrent texts share one hop to the model's thread, each vector handed
back as soon as it is made."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from memgate.embedding.batching import Batcher
from memgate.runtime.actor import Serial

pytestmark = pytest.mark.unit


class HeldAfterFirst:
    """A model that makes the first text's vector, then holds every other until released."""

    dim = 4

    def __init__(self) -> None:
        self.release = threading.Event()
        self.texts: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.texts:
            self.release.wait(timeout=10)
        self.texts += texts
        return np.ones((len(texts), self.dim), dtype=np.float32)


async def test_a_vector_is_handed_back_before_the_rest_of_its_batch_is_made() -> None:
    model, thread = HeldAfterFirst(), Serial("test.model")
    batcher = Batcher(model.embed, thread, size=8)
    batcher.start()
    try:
        first, second = (asyncio.ensure_future(batcher.embed(text)) for text in ("a", "b"))
        assert (await asyncio.wait_for(first, 5)).shape == (4,)
        assert not second.done()  # the same batch, still on the model
        model.release.set()
        await asyncio.wait_for(second, 5)
        assert model.texts == ["a", "b"]
    finally:
        model.release.set()
        await batcher.stop()
        thread.shutdown()
