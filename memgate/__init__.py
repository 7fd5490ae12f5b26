"""memgate: governed long-term memory for AI agents, an async actor system over NATS.

What an agent imports: `from memgate import MemgateClient`, and the typed errors it raises.
The client (nats-py) is imported when first asked for (`memgate.lazy`), so that what only needs
the contracts or the settings, such as the command line's admin commands, does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memgate.contracts.errors import (
    AgentMemoryDisabledError,
    AgentMemoryEmptyError,
    AgentMemoryFullError,
    AgentMemoryPersonalDataError,
    ContextSetScopeRefusedError,
    ErrorCode,
    ForbiddenError,
    InsufficientScopeError,
    InternalError,
    MemgateError,
    NonRetainingWorkspaceError,
    NotFoundError,
    OutcomeUnknownError,
    RateLimitedError,
    UnauthenticatedError,
    UnavailableError,
    ValidationFailedError,
)
from memgate.contracts.memory import (
    ForgetResult,
    ListResult,
    Memory,
    RecalledMemory,
    RecallResult,
    RememberResult,
)
from memgate.lazy import exports

if TYPE_CHECKING:
    from memgate.bus.client import MemgateClient

__all__ = [
    "AgentMemoryDisabledError", "AgentMemoryEmptyError", "AgentMemoryFullError",
    "AgentMemoryPersonalDataError", "ContextSetScopeRefusedError", "ErrorCode", "ForbiddenError",
    "ForgetResult", "InsufficientScopeError", "InternalError", "ListResult", "MemgateClient",
    "MemgateError", "Memory", "RecallResult", "RecalledMemory", "RememberResult",
    "NonRetainingWorkspaceError", "NotFoundError", "OutcomeUnknownError", "RateLimitedError",
    "UnauthenticatedError",
    "UnavailableError", "ValidationFailedError",
]
__getattr__ = exports(__name__, {"MemgateClient": "memgate.bus.client"})
