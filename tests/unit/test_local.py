"""Requests answered in process (`runtime.local.InProcess`): the local subject never reaches
the bus, the others do; failures are the handler's typed errors; a slow handler times out."""

from __future__ import annotations

import asyncio

import pytest

from memgate.contracts import RecallResult
from memgate.contracts.errors import (
    NotFoundError, UnavailableError, ValidationFailedError,
)
from memgate.contracts.internal import Owner, RecallQuery, RecallScope
from memgate.runtime.local import InProcess, Local
from tests.fakes import FakeRequester

pytestmark = pytest.mark.unit

QUERY = RecallQuery(owner=Owner(tenant="w", subject_id="m"), query="deploys", limit=3)


def requester(answer, *, timeout: float = 5.0) -> tuple[InProcess, FakeRequester]:
    async def scope(_: bytes) -> RecallScope:
        return RecallScope(high_seq=7, total=1, cited={})

    bus = FakeRequester({"mem.int.store.p0.scope": scope})
    return InProcess(bus, {"mem.int.recall": Local(RecallQuery, answer)},
                     timeout=timeout), bus


async def test_the_local_subject_is_answered_here_with_the_contract_itself() -> None:
    seen: list[RecallQuery] = []

    async def answer(query: RecallQuery) -> RecallResult:
        seen.append(query)
        return RecallResult(memories=[], hidden=2)

    local, bus = requester(answer)
    result = await local.request("mem.int.recall", QUERY, RecallResult)
    assert result == RecallResult(memories=[], hidden=2)
    assert seen == [QUERY] and seen[0] is QUERY  # not encoded, not parsed again
    assert bus.asked == []
    # bytes (a caller that encoded already) are parsed as the bus's handler would
    assert await local.request("mem.int.recall", QUERY.to_json(), RecallResult) == result
    assert seen[1] == QUERY


async def test_other_subjects_go_over_the_bus() -> None:
    async def answer(query: RecallQuery) -> RecallResult:
        raise AssertionError("not this one")

    local, bus = requester(answer)
    scope = await local.request("mem.int.store.p0.scope", QUERY, RecallScope)
    assert scope.high_seq == 7
    assert [subject for subject, _ in bus.asked] == ["mem.int.store.p0.scope"]
    with pytest.raises(UnavailableError):  # nobody answers: as over the bus
        await local.request("mem.int.nobody", QUERY, RecallResult)


async def test_failures_are_the_handlers_typed_errors() -> None:
    async def answer(query: RecallQuery) -> RecallResult:
        raise NotFoundError("no such memory")

    local, _ = requester(answer)
    with pytest.raises(NotFoundError):
        await local.request("mem.int.recall", QUERY, RecallResult)
    with pytest.raises(ValidationFailedError):  # malformed bytes: refused before the handler
        await local.request("mem.int.recall", b'{"query": 3}', RecallResult)


async def test_a_handler_slower_than_the_timeout_fails_unavailable_and_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def answer(query: RecallQuery) -> RecallResult:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not reached")

    local, _ = requester(answer, timeout=0.05)
    with pytest.raises(UnavailableError) as failed:
        await local.request("mem.int.recall", QUERY, RecallResult)
    assert failed.value.details == {"subject": "mem.int.recall"}
    assert cancelled.is_set()
