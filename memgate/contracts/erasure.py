"""Erasure requests (SPEC §5.3): intake → identity verification → discovery → decision →
execution → evidence, and what the layers of §5.2 answer about a subject."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from memgate.contracts.base import Contract, Id
from memgate.contracts.internal import Owner

# The six layers of SPEC §5.2, in the order execution erases them.
LayerName = Literal["memory_store", "vector_index", "conversation_logs", "traces_logs",
                "eval_exports", "backups"]
LAYERS: tuple[str, ...] = get_args(LayerName)


class Status(StrEnum):
    RECEIVED = "received"
    VERIFIED = "verified"
    DISCOVERED = "discovered"
    DECIDED = "decided"
    EXECUTING = "executing"
    COMPLETED = "completed"
    FAILED = "failed"


class ErasureSubject(Contract):
    """Whom the request is about: a member of the workspace, or an end user of its memory
    spaces (a mem0 `user_id`, a session participant)."""

    member_id: Id | None = None
    external_id: Id | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ErasureSubject:
        if (self.member_id is None) == (self.external_id is None):
            raise ValueError("give exactly one of memberId and externalId")
        return self


class ErasureIntake(Contract):
    workspace_id: Id
    subject: ErasureSubject


class VerifyIdentity(Contract):
    method: str = Field(min_length=1, max_length=64)
    verified_by: str = Field(min_length=1, max_length=120)


class Decide(Contract):
    """Layers kept by a legal hold or exception (GDPR Art. 17(3)), and why."""

    holds: list[LayerName] = Field(default_factory=list, max_length=len(LAYERS))
    reason: str = Field(min_length=1, max_length=1000)


class Evidence(Contract):
    layer: str
    erased: int
    at: datetime
    how: str  # e.g. "deleted and compacted", "crypto-shredded", "none held"
    nodes: list[str] = Field(default_factory=list)  # where it was erased (cluster nodes)


class ErasureView(Contract):
    """A request as the operator sees it: stages, counts, evidence; never content."""

    request_id: str
    workspace_id: str
    status: Status
    received_at: datetime
    due_at: datetime
    verified_at: datetime | None = None
    verification_method: str | None = None
    discovery: dict[str, int] | None = None
    holds: list[str] | None = None
    decision_reason: str | None = None
    evidence: list[Evidence] = Field(default_factory=list)
    completed_at: datetime | None = None
    failure: str | None = None


class ErasureRequests(Contract):
    """Every erasure request, newest first (the console's list): stages and counts only."""

    requests: list[ErasureView]


class ErasureMetrics(Contract):
    open: int
    overdue: int
    completed: int
    days_in_process_max: float
    days_in_process_median: float


class SubjectTarget(Contract):
    """What a layer is asked about: a verified subject within one tenant (tenant mandatory).

    `member_id` for a member's agent memories; `owners` maps a storage owner (a space) to the
    namespaces holding the subject's mem0 memories; `participant` for conversation logs."""

    model_config = ConfigDict(extra="ignore")

    tenant: str
    member_id: str | None = None
    external_id: str | None = None
    owners: dict[str, list[str]] = Field(default_factory=dict)
    # the conversation-log records about the subject (`<sessionId>/<sequenceId>`): what was
    # derived from them (memories extracted from their sessions) goes with them, SPEC §5.2
    derived_from: list[str] = Field(default_factory=list)
    erase: bool = False  # False: only count (discovery)


class SubjectCount(Contract):
    model_config = ConfigDict(extra="ignore")

    count: int
    record_ids: list[str] = Field(default_factory=list)  # for the audit log (ids, not content)
    by_owner: dict[str, list[str]] = Field(default_factory=dict)  # storage owner → its ids
    node: str | None = None  # the node that answered (its lease's), for the evidence


class Drop(Contract):
    """Drop these versions of an owner from an index now (an erasure does not wait for the
    events that would drop them too); answered with how many the index held."""

    owner: Owner
    memory_ids: list[str]


__all__ = [
    "LAYERS", "Decide", "Drop", "ErasureIntake", "ErasureMetrics", "ErasureRequests",
    "ErasureSubject", "ErasureView", "Evidence", "Status", "SubjectCount", "SubjectTarget",
    "VerifyIdentity",
]
