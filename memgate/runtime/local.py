"""Requests to an actor of the same process, answered without the bus.

Governance and space-memories ask recall for every recall; when recall runs in their process
(the `front` group), a request through NATS cost two more hops (~0.45 ms each on our 2-core
machine), the query and the result encoded and parsed once more, and the socket writes of both
ends. `InProcess` calls the handler with the contract as is and returns its reply as is; every
other subject still goes over the bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from memgate.bus import parse
from memgate.contracts import Contract
from memgate.contracts.errors import UnavailableError
from memgate.ports.bus import Requester

T = TypeVar("T", bound=Contract)


@dataclass(frozen=True)
class Local:
    """A subject this process answers itself: the request's contract and its handler."""

    request: type[Contract]
    answer: Callable[[Any], Awaitable[Contract]]


class InProcess:
    """A `Requester`: the `local` subjects answered here, the rest over `bus`. Failures are
    the handler's typed errors, as a bus reply would decode them; a handler slower than the
    timeout fails `UNAVAILABLE`, as a request with no reply does."""

    def __init__(self, bus: Requester, local: Mapping[str, Local], *, timeout: float) -> None:
        self._bus = bus
        self._local = dict(local)
        self._timeout = timeout

    async def request(self, subject: str, payload: Contract | bytes, result_type: type[T],
                      *, timeout: float | None = None) -> T:
        local = self._local.get(subject)
        if local is None:
            return await self._bus.request(subject, payload, result_type, timeout=timeout)
        request = parse(local.request, payload) if isinstance(payload, bytes) else payload
        try:
            result = await asyncio.wait_for(local.answer(request), timeout or self._timeout)
        except TimeoutError:
            raise UnavailableError("the request timed out", {"subject": subject}) from None
        if not isinstance(result, result_type):  # a wiring mistake, not a runtime condition
            raise TypeError(f"{subject} answered {type(result).__name__}")
        return result
