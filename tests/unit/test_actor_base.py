"""What every actor shares (`runtime.actor`): endpoints declared as data and served the same way
on a broker or in process, readiness added for each actor, and what `start()` opens."""

from __future__ import annotations

import pytest

from memgate.bus import subjects
from memgate.bus.replies import answer
from memgate.contracts import Done, Envelope
from memgate.contracts.errors import UnauthenticatedError, ValidationFailedError
from memgate.contracts.internal import Ready
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Operator, answered
from tests.fakes import served

pytestmark = pytest.mark.unit

OPERATOR_TOKEN = "the operator's token"


class Store:
    closed = False

    def close(self) -> None:
        self.closed = True


class Counter(ActorBase):
    """An actor of the smallest shape: one plain endpoint, one for the operator only."""

    name = "counter"
    store = Opened[Store]()

    def __init__(self) -> None:
        self._operator = Operator(lambda: OPERATOR_TOKEN)
        self.closed: Store | None = None

    async def start(self) -> None:
        self._operator.load()
        self.store = Store()

    async def stop(self) -> None:
        if (store := Counter.store.take(self)) is not None:
            store.close()
            self.closed = store

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint("t.count", self.count),
                Endpoint("t.reset", self._operator.only(self.reset))]

    async def count(self, payload: bytes) -> Done:
        assert self.store is not None
        return Done()

    async def reset(self, envelope: Envelope) -> Done:
        return Done()


async def test_an_actors_endpoints_and_its_readiness_are_served_from_its_declaration() -> None:
    async with served(Counter()) as bus:
        assert await bus.call("t.count", b"{}", Done) == Done()
        assert await bus.call(subjects.ready("counter"), b"{}", Ready) == Ready(actor="counter")


async def test_an_operator_endpoint_refuses_any_other_token_on_the_broker_and_in_process(
) -> None:
    actor = Counter()
    async with served(actor) as bus:
        here = answered([actor])
        for token in (None, "", "a member's token"):
            with pytest.raises(UnauthenticatedError):
                await bus.command("t.reset", token, {}, Done)
            with pytest.raises(UnauthenticatedError):
                await answer(here["t.reset"], Envelope(token=token).to_json(), "t.reset")
        assert await bus.command("t.reset", OPERATOR_TOKEN, {}, Done) == Done()
        assert await answer(here["t.reset"], Envelope(token=OPERATOR_TOKEN).to_json(),
                            "t.reset") == Done()
        with pytest.raises(ValidationFailedError):  # the envelope is parsed first, both ways
            await answer(here["t.reset"], b"{not json", "t.reset")


async def test_what_start_opens_cannot_be_read_before_and_stop_closes_it() -> None:
    actor = Counter()
    with pytest.raises(RuntimeError, match=r"Counter.store: start\(\) first"):
        actor.store  # noqa: B018
    await actor.start()
    opened = actor.store
    await actor.stop()
    assert actor.closed is opened and opened.closed
    with pytest.raises(RuntimeError):
        actor.store  # noqa: B018
    await actor.stop()  # nothing left to close: no error
