"""The embedding gate: remembers held while their partition's embedder is behind, in turn,
refused (not written) past the wait, never held by an embedder that says nothing."""

from __future__ import annotations

import asyncio

import pytest

from memgate.contracts.errors import UnavailableError
from memgate.contracts.internal import EmbedProgress
from memgate.runtime import backpressure
from memgate.runtime.backpressure import EmbeddingGate

pytestmark = pytest.mark.unit


async def admitted_now(gate: EmbeddingGate, count: int = 1) -> bool:
    """Whether `count` versions go in without waiting (they are counted in if they do)."""
    try:
        await asyncio.wait_for(gate.admit(count), 0.05)
    except TimeoutError:
        return False
    return True


async def test_a_burst_right_after_the_start_is_held_until_the_embedder_speaks() -> None:
    gate = EmbeddingGate(4)
    for seq in range(101, 105):  # the store held 100 versions before this start
        assert await admitted_now(gate)
        gate.written(seq)
    assert gate.behind() == 4
    assert not await admitted_now(gate)
    gate.heard(EmbedProgress(seen=104, left=1))
    assert await admitted_now(gate)


async def test_an_embedder_never_heard_of_holds_nothing_back_after_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backpressure, "SILENT_S", 0.1)
    gate = EmbeddingGate(4)
    await asyncio.sleep(0.15)
    for seq in range(1, 21):
        assert await admitted_now(gate)
        gate.written(seq)
    assert gate.behind() == 20  # written, not heard of: but nobody said so


async def test_remembers_wait_while_the_embedder_is_behind_and_go_in_as_it_catches_up() -> None:
    gate = EmbeddingGate(4)
    gate.heard(EmbedProgress(seen=10, left=3))
    assert await admitted_now(gate)  # 3 + 1
    assert not await admitted_now(gate)  # 3 + 1 let in + 1
    gate.written(11)  # the one let in: 3 left of 10, and 11 not seen yet
    assert gate.behind() == 4
    waiting = asyncio.create_task(gate.admit())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.heard(EmbedProgress(seen=11, left=1))
    await asyncio.wait_for(waiting, 1)
    assert gate.behind() == 2  # 1 left, 1 let in


async def test_the_limit_counts_versions_let_in_but_not_written_yet() -> None:
    gate = EmbeddingGate(4)
    gate.heard(EmbedProgress(seen=0, left=0))
    assert [await admitted_now(gate) for _ in range(5)] == [True] * 4 + [False]
    gate.written(4, count=4)
    gate.heard(EmbedProgress(seen=4, left=0))
    assert await admitted_now(gate, 4)


async def test_waiting_remembers_go_in_in_the_order_they_came() -> None:
    gate = EmbeddingGate(1)
    gate.heard(EmbedProgress(seen=1, left=1))
    order: list[int] = []

    async def remember(i: int) -> None:
        await gate.admit()
        order.append(i)

    waiting = []
    for i in range(5):
        waiting.append(asyncio.create_task(remember(i)))
        await asyncio.sleep(0)  # each in the queue before the next comes
    for seq in range(2, 7):
        gate.heard(EmbedProgress(seen=seq, left=0))
        gate.written(seq)  # the one let in at the last step, written and seen
        await asyncio.sleep(0.02)
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert order == [0, 1, 2, 3, 4]


async def test_a_remember_held_past_the_wait_is_refused_as_not_written() -> None:
    gate = EmbeddingGate(2, max_wait_s=0.2)
    gate.heard(EmbedProgress(seen=5, left=5))
    with pytest.raises(UnavailableError, match="not written"):
        await gate.admit()
    assert gate.behind() == 5  # nothing counted in


async def test_an_embedder_silent_for_long_is_not_waited_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backpressure, "SILENT_S", 0.1)
    gate = EmbeddingGate(2)
    gate.heard(EmbedProgress(seen=5, left=50))
    assert not await admitted_now(gate)
    await asyncio.sleep(0.15)
    assert await admitted_now(gate)


async def test_the_limit_zero_is_off() -> None:
    gate = EmbeddingGate(0)
    gate.heard(EmbedProgress(seen=1, left=1000))
    assert await admitted_now(gate, 10)


async def test_an_embedder_that_says_it_is_stuck_holds_nothing_back_after_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Words that say nothing moved (a cluster's embedder retrying a batch its killed standby
    never applies) do not keep the source of truth waiting on a derived store."""
    monkeypatch.setattr(backpressure, "SILENT_S", 0.2)
    gate = EmbeddingGate(2)
    gate.heard(EmbedProgress(seen=5, left=5))
    for _ in range(3):
        await asyncio.sleep(0.1)
        gate.heard(EmbedProgress(seen=5, left=5))
    assert await admitted_now(gate)
