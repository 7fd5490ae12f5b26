"""When an actor's deletions have left its files: compactions shared by the deletions before them.

After a deletion commits, the owner of a DuckDB file rewrites it (`storage.compaction`) so the
deleted bytes leave the disk, and only then reports the deletion done. A rewrite costs the whole
file, so deletions share one: a run, queued on the owner's `Serial` thread behind them, covers
every deletion that finished before it started. Deletions that finish while a run is queued (a
burst of forgets, the 5,000 memories of an erasure) join it; one that finishes after the run has
started waits for the next. No timer: an idle store compacts at once, a busy one in batches.

An answer that deletes waits for `settled`, whatever the handler did: a try whose rows were
deleted but whose answer failed (its rewrite failed, or a cluster's standby record could not be
written: a 503) leaves them in the file until then, and the same request asked again finds
nothing (a 404) yet must not be answered before they are gone (SPEC §5.4).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from memgate.runtime.actor import Serial

log = logging.getLogger("memgate.compaction")


class Rewritable(Protocol):
    """A store whose deletions leave its file for a rewrite (`storage.compaction.Rewritable`)."""

    deletions_pending: bool

    def compact(self) -> None:
        """Rewrite the file with only its live rows."""


class _Run:
    def __init__(self) -> None:
        self.started = False
        self.done: asyncio.Future[None] | None = None


class Compactions:
    """Compactions of the file of `store` (the store open now), run on its owner's serial
    thread."""

    def __init__(self, serial: Serial, store: Callable[[], Rewritable], name: str) -> None:
        self._serial = serial
        self._store = store
        self._name = name
        self._queued: _Run | None = None
        self.runs = 0  # completed, for tests and benches

    async def settled(self) -> None:
        """Once every deletion committed so far has left the file's bytes (a no-op when there
        was none since the last rewrite)."""
        if self._store().deletions_pending:
            await self.after_deletion()

    @asynccontextmanager
    async def deleting(self) -> AsyncIterator[None]:
        """Around an answer that deletes: `settled` when it is done, failed or not."""
        try:
            yield
        finally:
            await self.settled()

    async def after_deletion(self) -> None:
        """Return once a compaction that started after this call (so after every deletion
        already committed) has finished; raise if it failed (the deletion stays marked in the
        file, and the next compaction, or the next start, rewrites it)."""
        run = self._queued
        if run is None or run.started:
            run = self._queued = _Run()
            run.done = asyncio.ensure_future(self._serial(self._run, run))
        assert run.done is not None
        await asyncio.shield(run.done)

    def _run(self, run: _Run) -> None:
        run.started = True  # read by the event loop: a deletion that sees it queues a new run
        try:
            self._store().compact()
        except Exception as exc:
            log.error("%s: compaction failed (%s)", self._name, type(exc).__name__)
            raise
        self.runs += 1
