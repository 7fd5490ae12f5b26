"""Two lanes to the document model: the versions a waiting recall needs first, the background's
after them (read-your-writes at any backlog, SPEC §3.5).

A rank asks for the versions its filters allow that have no vector yet (`reserve`s those no
lane holds, reads their texts once, and `ask`s the urgent lane for them), and awaits their
futures (`futures`), each
done once its version is embedded (or given up); any number of ranks may await one. The urgent
lane takes them first asked, first embedded (`next_batch`), in small batches so that a rank's
deadline can pass between two; a version whose last waiter's deadline has passed is dropped from
it (its event, or the background backlog, brings it). The background (the events' batches, a
lost file's backlog) embeds small batches too, each only once no urgent version waits or is
being embedded (`quiet`), and `claim`s its versions first: one held by the other lane is left to
it, one still waiting in the urgent lane is taken over with its future. So a version is embedded
once, and a recall waits for at most one small background batch (on its own core, below it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Wanted(Generic[T]):
    """A version waiting in the urgent lane: `of` is what the caller embeds it from, `until`
    the loop time at which its last waiter gives up."""

    memory_id: str
    of: T
    until: float


class Lanes(Generic[T]):
    """Which versions each lane embeds, and in what order (no model of its own)."""

    def __init__(self) -> None:
        self._waiting: dict[str, Wanted[T]] = {}  # the urgent lane's, not taken yet
        self._order: deque[str] = deque()  # their ids, first asked first (some taken since)
        self._held: dict[str, asyncio.Future[None]] = {}  # waiting or being embedded
        self._urgent = 0  # urgent batches being embedded
        self._asked = asyncio.Event()  # some version waits in the urgent lane
        self._quiet = asyncio.Event()  # none waits or is being embedded there
        self._quiet.set()
        self._closed = False  # `close`: nothing waits on the urgent lane from then on

    def reserve(self, memory_ids: list[str]) -> list[str]:
        """Those of these versions that no lane holds, held from now on (what the urgent lane
        needs of them on its way: `ask` for them, and `release` any left)."""
        loop = asyncio.get_running_loop()
        reserved = [memory_id for memory_id in memory_ids if memory_id not in self._held]
        for memory_id in reserved:
            self._held[memory_id] = loop.create_future()
        return reserved

    def ask(self, wanted: dict[str, T], until: float) -> None:
        """These reserved versions wait in the urgent lane from now on."""
        if self._closed:
            self._release(list(wanted))
            return
        for memory_id, of in wanted.items():
            if memory_id in self._held and memory_id not in self._waiting:
                self._waiting[memory_id] = Wanted(memory_id, of, until)
                self._order.append(memory_id)
        if self._waiting:
            self._asked.set()
            self._quiet.clear()

    def release(self, memory_ids: list[str]) -> None:
        """These reserved versions are not asked for after all (their waiters look again)."""
        self._release([memory_id for memory_id in memory_ids if memory_id not in self._waiting])

    def futures(self, memory_ids: list[str], until: float) -> list[asyncio.Future[None]]:
        """The futures of these versions that a lane holds, each done once the version is
        embedded or given up (its waiter then finds it still lacking); those waiting in the
        urgent lane are kept there until `until` at least."""
        futures = []
        for memory_id in memory_ids:
            if (held := self._held.get(memory_id)) is not None:
                futures.append(held)
                if (wanted := self._waiting.get(memory_id)) is not None:
                    wanted.until = max(wanted.until, until)
        return futures

    async def next_batch(self, size: int) -> list[Wanted[T]]:
        """The urgent lane's next versions, at most `size`, first asked first (those whose
        waiters have all given up are dropped); `done` when they are embedded."""
        loop = asyncio.get_running_loop()
        while True:
            await self._asked.wait()
            batch: list[Wanted[T]] = []
            dropped = []
            while self._order and len(batch) < size:
                wanted = self._waiting.pop(self._order.popleft(), None)
                if wanted is None:  # taken over by the background
                    continue
                if wanted.until <= loop.time():
                    dropped.append(wanted.memory_id)
                else:
                    batch.append(wanted)
            if not self._waiting:
                self._asked.clear()
                self._order.clear()
            if batch:
                self._urgent += 1
            self._release(dropped)
            if batch:
                return batch

    def claim(self, memory_ids: list[str]) -> list[str]:
        """For the background: those of these versions it may embed now (none the urgent lane
        is embedding), held until `done`."""
        loop = asyncio.get_running_loop()
        claimed = []
        for memory_id in memory_ids:
            if memory_id in self._waiting:  # its future stays: its waiters get it from here
                del self._waiting[memory_id]
            elif memory_id in self._held:
                continue
            else:
                self._held[memory_id] = loop.create_future()
            claimed.append(memory_id)
        if not self._waiting:
            self._asked.clear()
        self._settle()
        return claimed

    def done(self, memory_ids: list[str], *, urgent: bool) -> None:
        """These versions are embedded (or failed): their waiters look again."""
        if urgent:
            self._urgent -= 1
        self._release(memory_ids)

    async def quiet(self) -> None:
        """Return once no version waits in the urgent lane or is being embedded there."""
        await self._quiet.wait()

    def close(self) -> None:
        """At stop: nothing waits on the urgent lane any more (its waiters look again and find
        their versions lacking), so a background batch waiting for it to be quiet goes on."""
        self._release([*self._waiting, *self._held])
        self._waiting.clear()
        self._order.clear()
        self._urgent = 0
        self._closed = True
        self._quiet.set()

    def _release(self, memory_ids: list[str]) -> None:
        for memory_id in memory_ids:
            future = self._held.pop(memory_id, None)
            if future is not None and not future.done():
                future.set_result(None)
        self._settle()

    def _settle(self) -> None:
        if self._closed or (not self._waiting and self._urgent <= 0):
            self._quiet.set()


__all__ = ["Lanes", "Wanted"]
