"""Group commit: what arrives while the previous batch is being committed goes in the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from memgate.observe import metrics
from memgate.runtime.actor import Serial

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")

# A batch's commit returns one outcome per item, in order: its result, or the error it alone met.
Commit = Callable[[Sequence[Item]], Sequence[Outcome | Exception]]


class GroupCommit(Generic[Item, Outcome]):
    """Runs `commit` on `serial` for batches of items; each caller waits for its own outcome.

    The first item of a quiet moment is committed at once (no lingering: one caller alone pays
    one commit); items that arrive while a commit runs wait for it to end and then share the
    next one, at most `cap` of them. A caller is answered only after the commit that holds its
    item, so an acknowledgement still means committed. A failure of the whole commit (the
    database, not one item) is every caller's failure.
    """

    def __init__(self, serial: Serial, commit: Commit[Item, Outcome], *, cap: int = 128,
                 name: str = "group-commit") -> None:
        self._serial = serial
        self._sizes = metrics.GROUP_COMMIT_SIZE.labels(name)  # `memgate_group_commit_size`
        self._commit = commit
        self._cap = cap
        self._waiting: list[tuple[Item, asyncio.Future[Outcome]]] = []
        self._running: asyncio.Task[None] | None = None

    async def __call__(self, item: Item) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._running is None:
            self._running = asyncio.create_task(self._drain(), name="group-commit")
        # shielded: a caller that gives up does not take its item out of a commit under way
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        batch: list[tuple[Item, asyncio.Future[Outcome]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[: self._cap], self._waiting[self._cap:]
                self._sizes.observe(len(batch))
                try:
                    outcomes = await self._serial(self._commit, [item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        _settle(future, exc)
                    continue
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    _settle(future, outcome)
        finally:
            self._running = None
            for _, future in [*batch, *self._waiting]:  # cancelled (shutdown): left unknown
                if not future.done():
                    future.cancel()
            self._waiting = []


def _settle(future: asyncio.Future[Outcome], outcome: Outcome | Exception) -> None:
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
