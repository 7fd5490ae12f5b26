"""Contracts: closed, frozen, camelCase on the wire, errors with one table of statuses."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from memgate.actors.directory import check_grantable
from memgate.actors.governance import authorise
from memgate.bus.replies import decode_reply, parse
from memgate.contracts import (
    HTTP_STATUS,
    ErrorCode,
    Failure,
    ForgetRequest,
    ListRequest,
    ListResult,
    Principal,
    RememberRequest,
    Role,
    Scope,
    WorkspaceSettings,
    error_for,
)
from memgate.contracts.errors import (
    AgentMemoryDisabledError,
    InsufficientScopeError,
    NonRetainingWorkspaceError,
    NotFoundError,
    ValidationFailedError,
)


def test_contracts_are_closed_and_frozen() -> None:
    with pytest.raises(ValidationError):
        RememberRequest.model_validate({"namespace": "n", "text": "t", "surprise": 1})
    request = RememberRequest(namespace="n", text="t")
    with pytest.raises(ValidationError):
        request.namespace = "other"  # type: ignore[misc]


def test_wire_names_are_camel_case_and_naive_instants_are_utc() -> None:
    request = ListRequest.model_validate({"asOf": "2025-01-02T03:04:05", "collectionId": "c"})
    assert request.as_of == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert b'"collectionId":"c"' in request.to_json()


def test_forget_takes_an_id_or_a_namespace_and_key() -> None:
    assert ForgetRequest(memory_id="m").memory_id == "m"
    assert ForgetRequest(namespace="n", key="k").key == "k"
    for bad in ({}, {"namespace": "n"}, {"memoryId": "m", "namespace": "n", "key": "k"}):
        with pytest.raises(ValidationError):
            ForgetRequest.model_validate(bad)


def test_validation_errors_never_echo_the_input() -> None:
    with pytest.raises(ValidationFailedError) as failure:
        parse(RememberRequest, b'{"namespace": "jane.doe@example.com", "text": ""}')
    assert "jane" not in str(failure.value.details)


def test_every_code_has_a_status_and_round_trips_as_data() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)
    wire = Failure.of(NotFoundError("no such memory", {"id": "x"})).to_json()
    with pytest.raises(NotFoundError) as failure:
        decode_reply(wire, ListResult)
    assert failure.value.status == 404 and failure.value.details == {"id": "x"}
    assert type(error_for("NO_SUCH_CODE", "m")).__name__ == "InternalError"


def principal(role: Role, scopes: set[Scope], **settings: bool) -> Principal:
    return Principal(
        workspace_id="w",
        member_id="m",
        credential_id="c",
        role=role,
        scopes=frozenset(scopes),
        settings=WorkspaceSettings(agent_memories_enabled=True).model_copy(update=settings),
    )


def test_governance_decisions() -> None:
    authorise(principal(Role.EDITOR, {Scope.WRITE}), Scope.WRITE)
    authorise(principal(Role.VIEWER, {Scope.READ}), Scope.READ)
    refusals = [
        (principal(Role.VIEWER, {Scope.WRITE}), Scope.WRITE, InsufficientScopeError),
        (principal(Role.OWNER, {Scope.READ}), Scope.WRITE, InsufficientScopeError),
        (
            principal(Role.OWNER, {Scope.WRITE}, agent_memories_enabled=False),
            Scope.WRITE,
            AgentMemoryDisabledError,
        ),
        (
            principal(Role.OWNER, {Scope.WRITE}, non_retaining=True),
            Scope.WRITE,
            NonRetainingWorkspaceError,
        ),
    ]
    for who, scope, error in refusals:
        with pytest.raises(error):
            authorise(who, scope)


def test_scopes_are_granted_only_to_roles_that_reach_them() -> None:
    check_grantable(Role.VIEWER, [Scope.READ])
    check_grantable(Role.EDITOR, [Scope.READ, Scope.WRITE])
    with pytest.raises(InsufficientScopeError):
        check_grantable(Role.VIEWER, [Scope.WRITE])
