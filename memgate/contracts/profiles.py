"""User profiles of a memory space, as mem0 2.2's client calls them (SPEC §4.4): the settings
(`GET`/`POST /v2/profiles/settings/`), generation jobs (`POST /v2/profiles/jobs/`, `GET
/v2/profiles/jobs/{id}/`) and a user's profile (`GET /v2/entities/user/{id}/profile/`).

Bodies come from the mem0 client in snake_case; answers are rendered in mem0's snake_case by
the REST routes. `mem.int.spaces.profiles.*` carry the spaces actor's side: settings, jobs and
stored profiles live beside the space's entity map (`storage.profiles`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from memgate.contracts.base import Contract
from memgate.contracts.mem0 import ENTITY_MAX

INSTRUCTIONS_MAX = 4000  # characters of custom_instructions
SAMPLE_MAX = 10  # users one sample job generates (mem0: 1-10)
KEY_MIN, KEY_MAX = 8, 128  # an Idempotency-Key (mem0's bounds)

ProfileStatus = Literal["succeeded", "pending", "failed", "not_enabled", "insufficient_data"]
JobStatus = Literal["pending", "running", "succeeded", "failed"]
Operation = Literal["trigger", "sample"]


class _Body(Contract):
    """A body from the mem0 client: snake_case, closed (a typo is a 400, not a silent no-op)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class UserProfileSettings(_Body):
    """`entities.user`: a field left out is kept, an explicit null clears it."""

    schema_: Any = Field(default=None, alias="schema")  # checked by policy.profiles
    custom_instructions: str | None = Field(default=None, max_length=INSTRUCTIONS_MAX)


class EntitySettings(_Body):
    user: UserProfileSettings | None = None


class UpdateProfileSettings(_Body):
    enabled: bool | None = None
    entities: EntitySettings | None = None


class CreateProfileJob(_Body):
    operation: Operation | None = None  # None with an entity_id: trigger
    entity_type: Literal["user"] = "user"
    entity_id: str | None = Field(default=None, min_length=1, max_length=ENTITY_MAX)
    limit: int | None = Field(default=None, ge=1, le=SAMPLE_MAX)


# --- answers (the REST routes render them by field name, as mem0 does) ---

class ProfileSettings(Contract):
    """The settings as stored, and what the space can do with them."""

    enabled: bool
    capabilities: dict[str, Any]
    entities: dict[str, dict[str, Any]]  # {"user": {"schema": ..., "custom_instructions": ...}}


class ProfileJobCreated(Contract):
    job_id: str
    status: JobStatus
    status_url: str
    operation: Operation
    entity_type: Literal["user"] = "user"
    entity_count_reserved: int
    event_id: str | None = None
    replayed: bool = False
    sampled: int | None = None  # sample only
    entity_ids: list[str] | None = None  # sample only


class ProfileJobView(Contract):
    id: str
    operation: Operation
    entity_type: Literal["user"] = "user"
    status: JobStatus
    total: int | None
    completed: int
    succeeded: int
    failed: int
    skipped: int
    enumeration_complete: bool = True
    created_at: datetime
    updated_at: datetime


class ProfileJobEnvelope(Contract):
    job: ProfileJobView


class Profile(Contract):
    profile: dict[str, Any] = Field(default_factory=dict)  # empty unless succeeded
    status: ProfileStatus
    entity_type: Literal["user"] = "user"
    entity_id: str
    updated_at: datetime | None = None
    generation_count: int = 0


# --- the spaces actor's side (`mem.int.spaces.profiles.*`) ---

class SettingsRequest(Contract):
    space_id: str


class StoredSettings(Contract):
    """A space's profile settings as kept (the schema as JSON text, masked)."""

    enabled: bool = True
    schema_text: str | None = None
    custom_instructions: str | None = None


class SettingsChange(Contract):
    """`update_profile_settings`, checked and masked: only the fields in `fields` change."""

    space_id: str
    fields: list[Literal["enabled", "schema", "custom_instructions"]]
    enabled: bool | None = None
    schema_text: str | None = None
    custom_instructions: str | None = None


class JobRequest(Contract):
    space_id: str
    key: str  # the Idempotency-Key
    operation: Operation
    entity_id: str | None = None
    limit: int = SAMPLE_MAX


class Job(Contract):
    """A job as the spaces actor keeps it: which users, and how each ended."""

    job_id: str
    space_id: str
    operation: Operation
    entity_ids: list[str]
    outcomes: dict[str, ProfileStatus] = Field(default_factory=dict)  # by entity id
    running: bool = False
    created_at: datetime
    updated_at: datetime
    replayed: bool = False


class JobLookup(Contract):
    space_id: str
    job_id: str


class ProfileLookup(Contract):
    space_id: str
    entity_id: str


class StoredProfile(Contract):
    """A user's profile as kept (masked JSON text), and whether a job is building one."""

    known: bool  # the user has memories in the space (an entity names them)
    profile_json: str | None = None
    status: ProfileStatus | None = None
    updated_at: datetime | None = None
    generation_count: int = 0
    building: bool = False


class ProfileOutcome(Contract):
    """One user of a job done: the profile (masked JSON) when it succeeded."""

    space_id: str
    job_id: str
    entity_id: str
    status: ProfileStatus
    profile_json: str | None = None
    namespaces: list[str] = Field(default_factory=list)  # whose keys seal it in a backup


__all__ = [
    "INSTRUCTIONS_MAX", "SAMPLE_MAX", "CreateProfileJob", "EntitySettings", "Job",
    "JobLookup", "JobRequest", "JobStatus", "Operation", "Profile", "ProfileJobCreated",
    "ProfileJobEnvelope", "ProfileJobView", "ProfileLookup", "ProfileOutcome",
    "ProfileSettings", "ProfileStatus", "SettingsChange", "SettingsRequest", "StoredProfile",
    "StoredSettings", "UpdateProfileSettings", "UserProfileSettings",
]
