"""A background task's end, the same everywhere: cancelled, then awaited until it has ended."""

from __future__ import annotations

import asyncio

# A task still running this long after its cancellation is cancelled again: Python 3.11's
# `asyncio.wait_for` (nats-py's requests) can swallow a cancellation that arrives as its future
# completes (CPython gh-86296), and a loop that then catches the request's error goes on; seen
# in CI as a lease keeper renewing on, "cancelling", and a stop waiting on it for good.
RECANCEL_S = 5.0


async def cancelled(*tasks: asyncio.Task[object] | asyncio.Future[object] | None,
                    recancel_s: float = RECANCEL_S) -> None:
    """Cancel each of `tasks` (None: never started) and wait until all have ended, cancelling
    again every `recancel_s` those that go on; what they raise on the way out is theirs (they
    were told to stop)."""
    started = [task for task in tasks if task is not None]
    while running := [task for task in started if not task.done()]:
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=recancel_s)
    await asyncio.gather(*started, return_exceptions=True)
