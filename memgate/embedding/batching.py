"""Coalescing concurrent embedding requests into one call on the model's thread (under load: one
thread hop for many texts; `OnnxEmbedder` runs each text alone). Each vector is handed back as
soon as it is made, not at the end of its batch: a recall's next step (its cosine rank, which has
the versions it lacks embedded meanwhile) starts one text's run after the model took it up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from memgate.tasks import cancelled

Embed = Callable[[list[str]], np.ndarray]  # a model's `embed`: blocking, one row per text
Run = Callable[[Callable[[], np.ndarray]], Awaitable[np.ndarray]]  # on the model's thread


class Batcher:
    """Coalesces concurrent `embed(text)` calls into batches of up to `size`: each batch is
    `run` (on the model's thread: `runtime.Serial`), calling `embed` once per text."""

    def __init__(self, embed: Embed, run: Run, size: int) -> None:
        self._embed = embed
        self._run = run
        self._size = size
        self._queue: asyncio.Queue[tuple[str, asyncio.Future[np.ndarray]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="embedder.batcher")

    async def stop(self) -> None:
        await cancelled(self._task)

    async def embed(self, text: str) -> np.ndarray:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self._queue.put((text, future))
        return await future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._size and not self._queue.empty():
                batch.append(self._queue.get_nowait())

            def run(batch: list[tuple[str, asyncio.Future[np.ndarray]]] = batch) -> np.ndarray:
                """On the model's thread: each vector but the last handed back as made (a
                wake-up of the loop each: the last comes with the call's own)."""
                for text, future in batch[:-1]:
                    loop.call_soon_threadsafe(_resolve, future, self._embed([text])[0])
                last: np.ndarray = self._embed([batch[-1][0]])[0]
                return last

            try:
                _resolve(batch[-1][1], await self._run(run))
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)


def _resolve(future: asyncio.Future[np.ndarray], vector: np.ndarray) -> None:
    if not future.done():  # its caller may have given up
        future.set_result(vector)
