"""Error codes of SPEC §3.10, their HTTP statuses, and the exceptions that carry them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    VALIDATION_ERROR = "VALIDATION_ERROR"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
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
    MEMORY_SPACES_DISABLED = "MEMORY_SPACES_DISABLED"
    MEMORY_SPACE_FULL = "MEMORY_SPACE_FULL"
    MEMORY_SPACE_RATE_LIMITED = "MEMORY_SPACE_RATE_LIMITED"
    UNPROCESSABLE = "UNPROCESSABLE"
    CONFLICT = "CONFLICT"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"
    UNAVAILABLE = "UNAVAILABLE"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    INTERNAL = "INTERNAL"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.VALIDATION_ERROR: 400,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
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
    ErrorCode.MEMORY_SPACES_DISABLED: 403,
    ErrorCode.MEMORY_SPACE_FULL: 409,
    ErrorCode.MEMORY_SPACE_RATE_LIMITED: 429,
    ErrorCode.UNPROCESSABLE: 422,
    ErrorCode.CONFLICT: 409,
    ErrorCode.PRECONDITION_FAILED: 412,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.OUTCOME_UNKNOWN: 504,
    ErrorCode.INTERNAL: 500,
}

# Refusals that say when to retry (`details.retryAfterSeconds`; REST adds `Retry-After`).
RATE_LIMITED = frozenset({ErrorCode.AGENT_MEMORY_RATE_LIMITED,
                          ErrorCode.MEMORY_SPACE_RATE_LIMITED})
# A 503 was not done: ask again. A 504 may have been done: ask again with the same idempotency
# key, which answers what was done, or does it now (SPEC §6, "Idempotency").
RETRYABLE = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.OUTCOME_UNKNOWN, *RATE_LIMITED})


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


class ValidationFailedError(MemgateError):
    """Malformed body, lengths, counts, bad dates."""

    code = ErrorCode.VALIDATION_ERROR


class PayloadTooLargeError(MemgateError):
    """The request body exceeds the configured limit (refused before it is read)."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class MethodNotAllowedError(MemgateError):
    """The path exists, but not with this HTTP method."""

    code = ErrorCode.METHOD_NOT_ALLOWED


class AgentMemoryEmptyError(MemgateError):
    """Nothing is left of the text after masking."""

    code = ErrorCode.AGENT_MEMORY_EMPTY


class AgentMemoryPersonalDataError(MemgateError):
    """Personal data in a namespace or key."""

    code = ErrorCode.AGENT_MEMORY_PERSONAL_DATA


class UnauthenticatedError(MemgateError):
    """Missing, unknown or revoked credential."""

    code = ErrorCode.UNAUTHENTICATED


class InsufficientScopeError(MemgateError):
    """Scope missing, or the member's role too low for it."""

    code = ErrorCode.INSUFFICIENT_SCOPE


class ForbiddenError(MemgateError):
    """The caller may not do this."""

    code = ErrorCode.FORBIDDEN


class AgentMemoryDisabledError(MemgateError):
    """The owner has not enabled agent memories."""

    code = ErrorCode.AGENT_MEMORY_DISABLED


class NonRetainingWorkspaceError(MemgateError):
    """The workspace keeps no history."""

    code = ErrorCode.NON_RETAINING_WORKSPACE


class ContextSetScopeRefusedError(MemgateError):
    """Outside the credential's bound context set."""

    code = ErrorCode.AGENT_CONTEXT_SET_SCOPE_REFUSED


class NotFoundError(MemgateError):
    """Unknown id, or one the caller may not see."""

    code = ErrorCode.NOT_FOUND


class AgentMemoryFullError(MemgateError):
    """The member's version limit is reached."""

    code = ErrorCode.AGENT_MEMORY_FULL


class RateLimitedError(MemgateError):
    """The credential's remember rate is reached."""

    code = ErrorCode.AGENT_MEMORY_RATE_LIMITED


class MemorySpacesDisabledError(MemgateError):
    """The member's memory-space feature flag is off (SPEC §4.1, §4.5)."""

    code = ErrorCode.MEMORY_SPACES_DISABLED


class MemorySpaceFullError(MemgateError):
    """A member's limit of spaces, sessions or events is reached: `details` names it
    (`limit`: spaces, sessions or events) and its `max`."""

    code = ErrorCode.MEMORY_SPACE_FULL


class MemorySpaceRateLimitedError(MemgateError):
    """A member made as many spaces, sessions or events in the last hour as allowed:
    `details` names the limit (`spacesPerHour`, `sessionsPerHour`, `eventsPerHour`), its
    `max` and `retryAfterSeconds`."""

    code = ErrorCode.MEMORY_SPACE_RATE_LIMITED


class UnprocessableError(MemgateError):
    """Well-formed, but a rule of memory spaces refuses it (SPEC §4.1–§4.3): a 422."""

    code = ErrorCode.UNPROCESSABLE


class ConflictError(MemgateError):
    """The request conflicts with the state (e.g. a strategy type that already ran): a 409."""

    code = ErrorCode.CONFLICT


class PreconditionFailedError(MemgateError):
    """`If-Match` or `createdAt` names a state that has changed since: re-read, then retry."""

    code = ErrorCode.PRECONDITION_FAILED


class UnavailableError(MemgateError):
    """No actor answered in time; retry."""

    code = ErrorCode.UNAVAILABLE


class OutcomeUnknownError(UnavailableError):
    """No answer in time, or a write done here whose copies could not be confirmed: it may have
    been done. Ask again with the same idempotency key (a write without one may be done twice).
    An `UnavailableError` to those that only wait and retry."""

    code = ErrorCode.OUTCOME_UNKNOWN


class InternalError(MemgateError):
    """An unexpected failure (details are logged, never returned)."""

    code = ErrorCode.INTERNAL

ERROR_TYPES: dict[ErrorCode, type[MemgateError]] = {
    cls.code: cls
    for cls in (
        ValidationFailedError, PayloadTooLargeError, MethodNotAllowedError,
        AgentMemoryEmptyError, AgentMemoryPersonalDataError,
        UnauthenticatedError, InsufficientScopeError, ForbiddenError, AgentMemoryDisabledError,
        NonRetainingWorkspaceError, ContextSetScopeRefusedError, NotFoundError,
        AgentMemoryFullError, RateLimitedError, MemorySpacesDisabledError, MemorySpaceFullError,
        MemorySpaceRateLimitedError, UnprocessableError,
        ConflictError, PreconditionFailedError, UnavailableError, OutcomeUnknownError,
        InternalError,
    )
}


def error_for(code: str, message: str, details: dict[str, Any] | None = None) -> MemgateError:
    """The typed exception for a code received as data (unknown codes become INTERNAL)."""
    try:
        cls = ERROR_TYPES[ErrorCode(code)]
    except ValueError:
        cls = InternalError
    return cls(message, details)
