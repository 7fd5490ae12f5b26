"""Who may do what to agent memories (SPEC §2.1–§2.2, §3.2): rules on a resolved principal."""

from __future__ import annotations

from memgate.contracts import Principal, Scope
from memgate.contracts.errors import (
    AgentMemoryDisabledError, AgentMemoryPersonalDataError, InsufficientScopeError,
    NonRetainingWorkspaceError,
)
from memgate.policy.masking import contains_personal_data


def authorise(principal: Principal, scope: Scope) -> None:
    """The workspace and role rules, in the order a caller can fix them: the workspace's
    settings first, then the credential's scopes, then the member's role."""
    if principal.settings.non_retaining:
        raise NonRetainingWorkspaceError("this workspace keeps no history")
    if not principal.settings.agent_memories_enabled:
        raise AgentMemoryDisabledError("the workspace owner has not enabled agent memories")
    if scope not in principal.scopes:
        raise InsufficientScopeError(f"the credential lacks {scope.value}", {"scope": scope.value})
    if principal.role.rank < scope.minimum_role.rank:
        raise InsufficientScopeError(
            f"{scope.value} needs the role {scope.minimum_role.value}; the member's role is lower",
            {"scope": scope.value})


def refuse_personal_data(**fields: str | None) -> None:
    """Names (namespace, key) are never masked, so personal data in them is refused instead."""
    for name, value in fields.items():
        if value is not None and contains_personal_data(value):
            raise AgentMemoryPersonalDataError(f"{name} must not contain personal data",
                                               {"field": name})
