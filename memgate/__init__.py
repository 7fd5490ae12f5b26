"""memgate: governed long-term memory for AI agents, an async actor system over NATS.

What an agent imports: `from memgate import MemgateClient`, and the typed errors it raises.
"""

from memgate.bus.client import MemgateClient
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

__all__ = [
    "AgentMemoryDisabledError", "AgentMemoryEmptyError", "AgentMemoryFullError",
    "AgentMemoryPersonalDataError", "ContextSetScopeRefusedError", "ErrorCode", "ForbiddenError",
    "ForgetResult", "InsufficientScopeError", "InternalError", "ListResult", "MemgateClient",
    "MemgateError", "Memory", "RecallResult", "RecalledMemory", "RememberResult",
    "NonRetainingWorkspaceError", "NotFoundError", "RateLimitedError", "UnauthenticatedError",
    "UnavailableError", "ValidationFailedError",
]
