"""A background task's end, the same everywhere: cancelled, then awaited until it has ended."""

from __future__ import annotations

import asyncio


async def cancelled(*tasks: asyncio.Task[object] | asyncio.Future[object] | None) -> None:
    """Cancel each of `tasks` (None: never started) and wait until all have ended; what they
    raise on the way out is theirs (they were told to stop)."""
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)
