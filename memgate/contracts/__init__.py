"""Versioned pydantic contracts: pure data, no I/O."""

from memgate.contracts.base import Contract, as_utc
from memgate.contracts.directory import (
    AddMember, CreateCredential, CreateNatsAgent, CreateWorkspace, CredentialCreated, Done,
    MemberToken, MemberView, NatsAgentCreated, NatsAgentKey, NatsAgents, PatchMember, Principal,
    Role, Scope, SettingsUpdate, WorkspaceCreated, WorkspaceSettings,
)
from memgate.contracts.errors import ERROR_TYPES, HTTP_STATUS, ErrorCode, MemgateError, error_for
from memgate.contracts.events import MemoriesDeleted, MemoryStored
from memgate.contracts.memory import (
    DeleteOwnMemories,
    ForgetRequest, ForgetResult, ListRequest, ListResult, Memory, Ranks, RecallRequest,
    RecalledMemory, RecallResult, RememberRequest, RememberResult,
)
from memgate.contracts.reply import REPLY, Envelope, ErrorBody, Failure, Ok

__all__ = [
    "ERROR_TYPES", "HTTP_STATUS", "REPLY", "AddMember", "Contract", "CreateCredential",
    "CreateNatsAgent", "CreateWorkspace", "DeleteOwnMemories", "NatsAgentCreated", "NatsAgentKey",
    "NatsAgents", "CredentialCreated", "Done", "Envelope", "ErrorBody", "ErrorCode",
    "Failure", "ForgetRequest", "ForgetResult", "ListRequest", "ListResult", "MemberToken",
    "MemberView", "MemgateError", "MemoriesDeleted", "Memory", "MemoryStored", "Ok",
    "PatchMember", "Principal", "Ranks", "RecallRequest", "RecallResult", "RecalledMemory",
    "RememberRequest", "RememberResult", "Role", "Scope", "SettingsUpdate", "WorkspaceCreated",
    "WorkspaceSettings", "as_utc", "error_for",
]
