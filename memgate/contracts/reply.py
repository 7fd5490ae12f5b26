"""The reply envelope of every bus command: `Ok` with a result, or `Failure` with a code."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from memgate.contracts.base import Contract
from memgate.contracts.errors import RETRYABLE, ErrorCode, MemgateError


class ErrorBody(Contract):
    code: ErrorCode
    message: str
    details: dict[str, Any] = Field(default_factory=dict)
    retryable: bool = False


class Ok(Contract):
    v: int = 1
    ok: Literal[True] = True
    result: dict[str, Any]


class Failure(Contract):
    v: int = 1
    ok: Literal[False] = False
    error: ErrorBody

    @classmethod
    def of(cls, exc: MemgateError) -> Failure:
        body = ErrorBody(
            code=exc.code, message=exc.message, details=exc.details, retryable=exc.code in RETRYABLE
        )
        return cls(error=body)


Reply = Annotated[Ok | Failure, Field(discriminator="ok")]
REPLY = TypeAdapter(Reply)


class Envelope(Contract):
    """A command as it travels on a public subject: the credential travels with it."""

    v: int = 1
    token: str | None = None
    body: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, str] = Field(default_factory=dict)
