"""What a module of REST routes gets from the app: a way to send a command on the bus, the mark
that names a route's command (so a body FastAPI refuses still goes to the bus, authentication
first), and the caller's token from `Authorization: Bearer …` or `Token …` (the mem0 client)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import Depends, Header, Request
from fastapi.security import APIKeyHeader

from memgate.contracts import Contract
from memgate.contracts.memory import IDEMPOTENCY_KEY_MAX

T = TypeVar("T", bound=Contract)
E = TypeVar("E", bound=Callable[..., Any])

SCHEMES = ("bearer", "token")

# Documents the header in OpenAPI; the value is parsed by `token_of`.
_authorization = APIKeyHeader(name="Authorization", auto_error=False,
                              description="`Bearer <token>`, or `Token <token>` as mem0 sends it")


def token_of(header: str | None) -> str | None:
    """The token of an `Authorization` header in either scheme; None otherwise."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() in SCHEMES and token else None


async def _caller_token(request: Request,
                        header: Annotated[str | None, Depends(_authorization)]) -> str | None:
    return token_of(header)


CallerToken = Annotated[str | None, Depends(_caller_token)]
# A write retried with the same key gets its first answer (a body's `idempotencyKey` too).
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1,
                                              max_length=IDEMPOTENCY_KEY_MAX)]


def keyed(key: str | None) -> dict[str, str]:
    """A command's params for its `Idempotency-Key` header (none without one)."""
    return {} if key is None else {"idempotencyKey": key}


class Send(Protocol):
    """Send a public command with the caller's token; the reply parsed as `result` (a failure
    raises its typed exception, which the app turns into the §3.10 shape)."""

    async def __call__(self, subject: str, result: type[T], token: str | None,
                       body: Contract | dict[str, Any], **params: str) -> T: ...


class Mark(Protocol):
    """`@mark(subject, Result)` on a route whose command has a body."""

    def __call__(self, subject: str, result: type[Contract]) -> Callable[[E], E]: ...


__all__ = ["CallerToken", "IdempotencyKey", "Mark", "Send", "keyed", "token_of"]
