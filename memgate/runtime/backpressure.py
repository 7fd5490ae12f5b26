"""Remembers held back while a partition's embedder is behind (issue 44): a bounded backlog.

A memory is recallable by meaning once its vector exists, and a recall waits, up to its cosine
deadline, for the versions of its scope that have none yet (read-your-writes, `actors.embedder`).
Unbounded, a burst of remembers left the recalls after it waiting for the burst's backlog, and
degraded past what the deadline embeds (docs/DECISIONS.md). So the storage actor takes a
remember in only while its partition's embedder has fewer than `limit` versions left to embed,
as a Kafka producer waits on a full buffer and as mem0 embeds before `add` returns: a burst's
remembers wait for the model instead of its recalls.

The embedder tells its progress (`EmbedProgress`, core NATS, at most once): the newest version it
has seen and how many of those it has not embedded yet. The gate adds the versions written since
(`written`) and those let in and not written yet; until it has seen one, every version written
since this gate started counts. An embedder with no progress for `SILENT_S` (stopped, stuck, or
never started) holds nothing back: the source of truth does not wait on a derived store's failure
(a cluster's embedder whose standby was killed retried its batch for longer than a remember
waits). A remember held past `max_wait_s` is refused, not written (503: retry later).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from memgate.contracts.errors import UnavailableError
from memgate.contracts.internal import EmbedProgress

# Without progress from the embedder for this long (since it last embedded, saw a new version or
# had nothing left, or since the gate started), its backlog is not waited on: it may have stopped
# or be stuck (its events wait in the stream, nothing is lost), and writes go on. Below the
# longest wait, so a node without an embedder refuses nothing.
SILENT_S = 3.0


class EmbeddingGate:
    """One partition's remembers, held while its embedder is `limit` versions behind."""

    def __init__(self, limit: int, *, max_wait_s: float = 5.0) -> None:
        self.limit = limit  # 0: off
        self._max_wait_s = max_wait_s
        self._seen: int | None = None  # the newest version the embedder has seen
        self._left = 0  # of those, not embedded yet
        # when it last said so (monotonic): a burst right after the start is held too
        self._heard = time.monotonic()
        self._written = 0  # the newest version written here
        self._admitted = 0  # let in, not written yet
        self._changed = asyncio.Event()
        self._turns = asyncio.Lock()  # the remembers waiting, in the order they came

    def behind(self) -> int:
        """Versions written or let in that the embedder has not embedded (as last heard)."""
        seen = self._written if self._seen is None else self._seen
        return self._left + max(self._written - seen, 0) + self._admitted

    def heard(self, progress: EmbedProgress) -> None:
        moved = (progress.left < self._left or progress.left == 0
                 or (progress.seen or 0) > (self._seen or 0))
        if progress.seen is not None:
            self._seen = max(self._seen or 0, progress.seen)
        self._left = progress.left
        if moved:  # a word that says nothing moved (an embedder stuck) does not keep it held
            self._heard = time.monotonic()
        self._wake()

    def written(self, seq: int, count: int = 1) -> None:
        """`count` versions let in are written (or failed), the newest at `seq` (0: none)."""
        if self._seen is None and seq:  # the first written here: those before, the embedder's
            self._seen = seq - count
        self._written = max(self._written, seq)
        self._admitted = max(self._admitted - count, 0)
        self._wake()

    async def admit(self, count: int = 1) -> None:
        """Wait, in turn (first come, first in), until `count` more versions keep the backlog
        within the limit (one remember goes in at least, whatever the limit), then count them
        in; refused, not written, when that takes `max_wait_s`."""
        if not self._turns.locked() and not self._holding(count):
            self._admitted += count
            return
        try:
            async with asyncio.timeout(self._max_wait_s), self._turns:
                while self._holding(count):
                    self._changed.clear()
                    # woken by progress or a write; looked at again at least every 0.1 s
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 0.1)
                self._admitted += count
        except TimeoutError:
            raise UnavailableError(
                "the embedder is behind: the remember was not written; retry later",
                {"retryAfterSeconds": 1}) from None

    def _holding(self, count: int) -> bool:
        if not self.limit or time.monotonic() - self._heard > SILENT_S:
            return False
        backlog = self.behind()
        return backlog > 0 and backlog + count > self.limit

    def _wake(self) -> None:
        self._changed.set()


__all__ = ["EmbeddingGate", "SILENT_S"]
