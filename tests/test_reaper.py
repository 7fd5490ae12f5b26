"""The reaper (SPEC §3.9, §5.1) on the real bus: retention by retentionDays and by expires_at,
legal holds kept and hidden, racing reapers, sweeps on a schedule and when retention changes.
Time moves through the reaper's injected clock; nothing sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from memgate.actors.reaper import ReaperActor
from memgate.bus.connections import KindConnections
from memgate.contracts.errors import NotFoundError
from tests.agents import Agent
from tests.conftest import Member, Memgate, eventually, run_memgate

Clock = Callable[[], datetime]


def days_later(days: float) -> Clock:
    instant = datetime.now(UTC) + timedelta(days=days)
    return lambda: instant


async def reaper_on(memgate: Memgate, now: Clock, **options: float) -> ReaperActor:
    """A reaper of our own on the real bus, with its kind's login and our clock (not started:
    the test sweeps, unless it starts it)."""
    kinds = KindConnections(memgate.bus, timeout=30)
    await kinds.connect("reaper", memgate.stack)
    return ReaperActor(bus=kinds.client("reaper"), partitions=memgate.settings.partitions,
                       interval_s=options.pop("interval_s", 3600), now=now, **options)


async def workspace(memgate: Memgate, retention_days: int | None = None) -> tuple[Member, Agent]:
    owner = await memgate.workspace()
    if retention_days is not None:
        await memgate.ok("PUT", f"/api/w/{owner.workspace_id}/ask-history/settings",
                         owner.token, {"retentionDays": retention_days})
    return owner, await memgate.agent("rest", await memgate.credential(owner))


async def listed(agent: Agent) -> list[str]:
    return [m.memory_id for m in (await agent.list(limit=100)).memories]


async def test_memories_older_than_retention_days_are_purged(memgate: Memgate) -> None:
    _, short = await workspace(memgate, retention_days=30)
    _, default = await workspace(memgate)  # 90 days
    gone = await short.remember("notes", "the boiler is serviced in March")
    await short.remember("notes", "older versions count too", key="k")
    await short.remember("notes", "every version is aged alone", key="k")
    stays = await default.remember("notes", "the boiler is serviced in March")

    assert await (await reaper_on(memgate, days_later(29))).sweep() == 0
    assert await (await reaper_on(memgate, days_later(31))).sweep() == 3
    assert await listed(short) == []
    assert await listed(default) == [stays.memory_id]

    async def unindexed() -> bool:  # the same events as a forget: the channels drop them
        return (await short.recall("boiler serviced March")).memories == []

    await eventually(unindexed)
    assert gone.memory_id not in {m.memory_id for m in
                                  (await default.recall("boiler serviced March")).memories}
    assert await (await reaper_on(memgate, days_later(91))).sweep() == 1
    assert await listed(default) == []


async def test_expires_at_holds_even_if_retention_is_raised_and_a_lower_retention_wins(
        memgate: Memgate) -> None:
    owner, raised = await workspace(memgate)  # written under 90 days: expires_at = +90
    await raised.remember("notes", "written under ninety days")
    await memgate.ok("PUT", f"/api/w/{owner.workspace_id}/ask-history/settings", owner.token,
                     {"retentionDays": 365})
    owner2, lowered = await workspace(memgate)
    await lowered.remember("notes", "written under ninety days, then ten")
    await memgate.ok("PUT", f"/api/w/{owner2.workspace_id}/ask-history/settings", owner2.token,
                     {"retentionDays": 10})

    assert await (await reaper_on(memgate, days_later(11))).sweep() == 1  # lowered: 10 days
    assert len(await listed(raised)) == 1
    assert await listed(lowered) == []
    assert await (await reaper_on(memgate, days_later(91))).sweep() == 1  # its expires_at
    assert await listed(raised) == []


async def test_legal_hold_is_kept_and_hidden(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        owner, agent = await workspace(memgate)
        held = await agent.remember("notes", "the contract dispute file is in room nine")
        free = await agent.remember("notes", "the lunch order is pizza")
    path = tmp_path / "data/partitions/p0/memories.duckdb"
    db = duckdb.connect(str(path))  # an operator's hold (SPEC §5.3 decision), while stopped
    db.execute("UPDATE memories SET legal_hold = true WHERE memory_id = ?", [held.memory_id])
    db.close()
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        agent = await memgate.agent("rest", await memgate.credential(owner))
        assert await listed(agent) == [free.memory_id]  # hidden from list
        recalled = await agent.recall("contract dispute file room nine")
        assert held.memory_id not in {m.memory_id for m in recalled.memories}  # and recall
        try:
            await agent.forget(memory_id=held.memory_id)
            raise AssertionError("a held memory was forgotten")
        except NotFoundError:
            pass
        assert await (await reaper_on(memgate, days_later(400))).sweep() == 1  # the free one
        purged = await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/ask-history/"
                                  "settings/agent-memories", owner.token)
        assert purged["deleted"] == 0
        assert await listed(agent) == []
    db = duckdb.connect(str(path), read_only=True)
    kept = db.execute("SELECT memory_id, legal_hold FROM memories").fetchall()
    db.close()
    assert kept == [(held.memory_id, True)]  # kept


async def test_racing_reapers_delete_each_memory_once(memgate: Memgate) -> None:
    _, agent = await workspace(memgate)
    for i in range(20):
        await agent.remember("notes", f"note number {i}")
    reapers = [await reaper_on(memgate, days_later(100)) for _ in range(3)]
    counts = await asyncio.gather(*(r.sweep() for r in reapers))
    assert sum(counts) == 20
    assert await reapers[0].sweep() == 0  # idempotent
    assert await listed(agent) == []


async def test_the_reaper_sweeps_on_its_schedule(memgate: Memgate) -> None:
    _, agent = await workspace(memgate)
    await agent.remember("notes", "a note to age")
    reaper = await reaper_on(memgate, days_later(100), interval_s=0.05, first_sweep_s=0)
    await reaper.start()
    memgate.closing(reaper.stop)

    async def reaped() -> bool:
        return await listed(agent) == []

    await eventually(reaped)


async def test_a_change_of_retention_days_sweeps_at_once(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, skip=frozenset({"reaper"}))
        reaper = await reaper_on(memgate, days_later(40))  # not started: no schedule
        kinds = KindConnections(memgate.bus, timeout=30)
        broker = kinds.broker("reaper", graceful_timeout=5)
        broker.include_router(reaper.router())
        await broker.start()
        stack.push_async_callback(broker.stop)
        owner, agent = await workspace(memgate)
        await agent.remember("notes", "forty days old, by the reaper's clock")
        assert len(await listed(agent)) == 1
        await memgate.ok("PUT", f"/api/w/{owner.workspace_id}/ask-history/settings",
                         owner.token, {"retentionDays": 30})

        async def reaped() -> bool:
            return await listed(agent) == []

        await eventually(reaped)
