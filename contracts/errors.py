"""Error codes of SPEC §3.10, their HTTP statuses, and the exceptions that carry them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    VALIDATION_ERROR = "VALIDATION_ERROR"
    AGENT_MEMORY_EMPTY = "AGENT_MEMORY_EMPTY"
    AGENT_MEMORY_PERSONAL_DATA = "AGENT_MEMORY_PERSONAL_DATA"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    INSUFFICIENT_SCOPE = "INSUFFICIENT_SCOPE"
    FORBIDDEN = "FORBIDDEN"
    AGENT_MEMORY_DISABLED = "AGENT_MEMORY_DISABLED"
    NON_RETAINING_WORKSPACE = "NON_RETAINING_WORKSPACE"
    AGENT_CONTEXT_SET_SCOPE_REFUSED = "AGENT_CONTEXT_SET_SCOPE_REFUSED"
    NOT_FOUND = "NOT_FOUND"
    AGENT_MEMORY_FULL = "AGENT_MEMORY_FULL"
    AGENT_MEMORY_RATE_LIMITED = "AGENT_MEMORY_RATE_LIMITED"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.VALIDATION_ERROR: 400,
    ErrorCode.AGENT_MEMORY_EMPTY: 400,
    ErrorCode.AGENT_MEMORY_PERSONAL_DATA: 400,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.INSUFFICIENT_SCOPE: 403,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.AGENT_MEMORY_DISABLED: 403,
    ErrorCode.NON_RETAINING_WORKSPACE: 403,
    ErrorCode.AGENT_CONTEXT_SET_SCOPE_REFUSED: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.AGENT_MEMORY_FULL: 409,
    ErrorCode.AGENT_MEMORY_RATE_LIMITED: 429,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
}

RETRYABLE = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.AGENT_MEMORY_RATE_LIMITED})


class MemgateError(Exception):
    """Root of memgate's failures; each carries a stable code and safe details (no content)."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.code]


def _error(code: ErrorCode) -> type[MemgateError]:
    name = "".join(part.title() for part in code.value.split("_")) + "Error"
    return type(name, (MemgateError,), {"code": code, "__doc__": f"Failure with code {code}."})


ValidationFailedError = _error(ErrorCode.VALIDATION_ERROR)
AgentMemoryEmptyError = _error(ErrorCode.AGENT_MEMORY_EMPTY)
AgentMemoryPersonalDataError = _error(ErrorCode.AGENT_MEMORY_PERSONAL_DATA)
UnauthenticatedError = _error(ErrorCode.UNAUTHENTICATED)
InsufficientScopeError = _error(ErrorCode.INSUFFICIENT_SCOPE)
ForbiddenError = _error(ErrorCode.FORBIDDEN)
AgentMemoryDisabledError = _error(ErrorCode.AGENT_MEMORY_DISABLED)
NonRetainingWorkspaceError = _error(ErrorCode.NON_RETAINING_WORKSPACE)
ContextSetScopeRefusedError = _error(ErrorCode.AGENT_CONTEXT_SET_SCOPE_REFUSED)
NotFoundError = _error(ErrorCode.NOT_FOUND)
AgentMemoryFullError = _error(ErrorCode.AGENT_MEMORY_FULL)
RateLimitedError = _error(ErrorCode.AGENT_MEMORY_RATE_LIMITED)
UnavailableError = _error(ErrorCode.UNAVAILABLE)
InternalError = _error(ErrorCode.INTERNAL)

ERROR_TYPES: dict[ErrorCode, type[MemgateError]] = {
    cls.code: cls
    for cls in (
        ValidationFailedError, AgentMemoryEmptyError, AgentMemoryPersonalDataError,
        UnauthenticatedError, InsufficientScopeError, ForbiddenError, AgentMemoryDisabledError,
        NonRetainingWorkspaceError, ContextSetScopeRefusedError, NotFoundError,
        AgentMemoryFullError, RateLimitedError, UnavailableError, InternalError,
    )
}


def error_for(code: str, message: str, details: dict[str, Any] | None = None) -> MemgateError:
    """The typed exception for a code received as data (unknown codes become INTERNAL)."""
    try:
        cls = ERROR_TYPES[ErrorCode(code)]
    except ValueError:
        cls = InternalError
    return cls(message, details)
