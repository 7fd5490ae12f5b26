"""The user-profile calls of a space's mem0-compatible API (mem0 2.2: `get_profile`,
`generate_profile`, `sample_profiles`, `get_profile_job`, `get_profile_settings`,
`update_profile_settings`), served by the space-memories actor (its `public` handlers).

Access first, as for every mem0 call: CAN_VIEW reads, CAN_UPDATE sets the settings and starts
a generation. The settings, jobs and profiles are the spaces actor's (`ports.profiles`).

A generation is a job: `generate_profile` answers at once with the job (an Idempotency-Key
sent again within a day answers the same job, `replayed`), and a task of this process builds
each user's profile: the user's newest memories (masked when stored) and the space's schema
and instructions go to the space's LLM, whose answer is kept only if the schema validates it,
masked again (`policy.profiles`). A space without an LLM, or whose profiles are turned off,
has none: `get_profile` says `not_enabled` (200, as mem0 does), a generation is refused 422
with `details.status: "not_enabled"` (mem0's ValidationError).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from memgate.bus import parse
from memgate.contracts import Contract, Envelope
from memgate.contracts.errors import (
    MemgateError, NotFoundError, UnprocessableError, ValidationFailedError,
)
from memgate.contracts.internal import Owner, StoreQuery, space_owner
from memgate.contracts.profiles import (
    KEY_MAX, KEY_MIN, CreateProfileJob, Job, JobRequest, Profile, ProfileJobCreated,
    ProfileJobEnvelope, ProfileOutcome, ProfileSettings, ProfileStatus, SettingsChange,
    StoredSettings, UpdateProfileSettings,
)
from memgate.contracts.spaces import Permission, SpaceAccess
from memgate.policy import profiles
from memgate.policy.extraction import MalformedAnswerError
from memgate.ports.llm import ChatModel
from memgate.ports.profiles import ProfileState
from memgate.ports.spaces import Spaces
from memgate.ports.storage import Storage
from memgate.storage.profiles import job_view
from memgate.tasks import cancelled

log = logging.getLogger("memgate.space-profiles")
JOBS_PATH = "/v2/profiles/jobs/"
Handler = Callable[[Envelope], Awaitable[Contract]]
B = TypeVar("B", bound=Contract)


def _now() -> datetime:
    return datetime.now(UTC)


def _enabled(access: SpaceAccess, settings: StoredSettings) -> bool:
    return bool(access.llm_model_name and access.llm_base_url and settings.enabled)


def _not_enabled() -> UnprocessableError:
    return UnprocessableError("profiles are not enabled for this memory space: it has no LLM, "
                              "or its profile settings turn them off (status: not_enabled)",
                              {"status": "not_enabled"})


def _body(model: type[B], envelope: Envelope) -> B:
    if "refusedBody" in envelope.params:
        raise ValidationFailedError("the body is not a JSON object", {"field": "body"})
    return parse(model, envelope.body)


def _settings_view(access: SpaceAccess, settings: StoredSettings) -> ProfileSettings:
    llm = bool(access.llm_model_name and access.llm_base_url)
    return ProfileSettings(
        enabled=settings.enabled,
        capabilities={"llm": llm, "generation": llm and settings.enabled,
                      "entity_types": ["user"], "operations": ["trigger", "sample"]},
        entities={"user": {
            "schema": None if settings.schema_text is None else json.loads(settings.schema_text),
            "custom_instructions": settings.custom_instructions}})


def _change(space_id: str, body: UpdateProfileSettings) -> SettingsChange:
    """The update, checked and masked (call off the event loop: it masks)."""
    fields: list[Any] = ["enabled"] if body.enabled is not None else []
    values: dict[str, Any] = {"enabled": body.enabled}
    user = body.entities.user if body.entities is not None else None
    if user is not None:
        if "schema_" in user.model_fields_set:
            fields.append("schema")
            values["schema_text"] = None if user.schema_ is None else json.dumps(
                profiles.checked_schema(user.schema_), ensure_ascii=False)
        if "custom_instructions" in user.model_fields_set:
            fields.append("custom_instructions")
            values["custom_instructions"] = profiles.masked_instructions(
                user.custom_instructions)
    return SettingsChange(space_id=space_id, fields=fields, **values)


class SpaceProfiles:
    """The profile handlers and the generations under way in this process."""

    def __init__(self, *, spaces: Spaces, state: ProfileState, storage: Storage,
                 chat: ChatModel, llm_timeout_s: float | None = None) -> None:
        self._spaces = spaces
        self._state = state
        self._storage = storage
        self._chat = chat
        self._timeout = llm_timeout_s
        self._running: set[asyncio.Task[None]] = set()

    def public(self) -> dict[str, Handler]:
        return {"profile": self.profile, "profile_job": self.create_job,
                "profile_job_get": self.job, "profile_settings": self.settings,
                "profile_settings_update": self.update_settings}

    async def stop(self) -> None:
        await cancelled(*self._running)

    # --- settings ---

    async def settings(self, envelope: Envelope) -> ProfileSettings:
        access = await self._spaces.access(envelope, Permission.CAN_VIEW)
        return _settings_view(access, await self._state.settings(access.space_id))

    async def update_settings(self, envelope: Envelope) -> ProfileSettings:
        access = await self._spaces.access(envelope, Permission.CAN_UPDATE)
        body = _body(UpdateProfileSettings, envelope)
        change = await asyncio.to_thread(_change, access.space_id, body)
        return _settings_view(access, await self._state.configure(change))

    # --- a user's profile ---

    async def profile(self, envelope: Envelope) -> Profile:
        access = await self._spaces.access(envelope, Permission.CAN_VIEW)
        entity_id = envelope.params.get("entityId", "")
        if envelope.params.get("entityType", "user") != "user":
            raise ValidationFailedError("profiles are of users only", {"field": "entity_type"})
        if not _enabled(access, await self._state.settings(access.space_id)):
            return Profile(status="not_enabled", entity_id=entity_id)
        stored = await self._state.profile(access.space_id, entity_id)
        if not stored.known:
            raise NotFoundError("no such user in this memory space")
        status: ProfileStatus = stored.status or "insufficient_data"
        if stored.building and status != "succeeded":
            status = "pending"
        return Profile(profile=json.loads(stored.profile_json) if stored.profile_json else {},
                       status=status, entity_id=entity_id, updated_at=stored.updated_at,
                       generation_count=stored.generation_count)

    # --- jobs ---

    async def create_job(self, envelope: Envelope) -> ProfileJobCreated:
        access = await self._spaces.access(envelope, Permission.CAN_UPDATE)
        body = _body(CreateProfileJob, envelope)
        key = envelope.params.get("idempotencyKey", "")
        if not KEY_MIN <= len(key) <= KEY_MAX:
            raise ValidationFailedError(
                f"an Idempotency-Key header of {KEY_MIN} to {KEY_MAX} characters is required",
                {"field": "Idempotency-Key"})
        operation = body.operation or ("trigger" if body.entity_id else None)
        if operation is None or (operation == "trigger") != (body.entity_id is not None):
            raise ValidationFailedError("trigger names one entity_id; sample names none",
                                        {"field": "operation"})
        settings = await self._state.settings(access.space_id)
        if not _enabled(access, settings):
            raise _not_enabled()
        job = await self._state.job(JobRequest(
            space_id=access.space_id, key=key, operation=operation, entity_id=body.entity_id,
            **({"limit": body.limit} if body.limit else {})))
        if not job.replayed:
            task = asyncio.create_task(self._generate(job, access, settings))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        sample = operation == "sample"
        return ProfileJobCreated(
            job_id=job.job_id, status=job_view(job, _now()).status,
            status_url=f"{JOBS_PATH}{job.job_id}/", operation=operation,
            entity_count_reserved=len(job.entity_ids), replayed=job.replayed,
            sampled=len(job.entity_ids) if sample else None,
            entity_ids=job.entity_ids if sample else None)

    async def job(self, envelope: Envelope) -> ProfileJobEnvelope:
        access = await self._spaces.access(envelope, Permission.CAN_VIEW)
        job = await self._state.find(access.space_id, envelope.params.get("jobId", ""))
        return ProfileJobEnvelope(job=job_view(job, _now()))

    async def _generate(self, job: Job, access: SpaceAccess, settings: StoredSettings) -> None:
        """Each user's profile in turn; a failure is the user's, recorded, never raised."""
        try:
            await self._state.started(job.space_id, job.job_id)
            for user in job.entity_ids:
                await self._state.record(await self._one(job, access, settings, user))
        except MemgateError as error:  # the spaces actor is away: the job reads as stale
            log.warning("a profile job of space %s stopped (%s)", job.space_id, error.code)

    async def _one(self, job: Job, access: SpaceAccess, settings: StoredSettings,
                   user: str) -> ProfileOutcome:
        def outcome(status: ProfileStatus, namespaces: list[str],
                    profile: dict[str, Any] | None = None) -> ProfileOutcome:
            return ProfileOutcome(space_id=job.space_id, job_id=job.job_id, entity_id=user,
                                  status=status, namespaces=namespaces,
                                  profile_json=None if profile is None
                                  else json.dumps(profile, ensure_ascii=False))

        try:
            namespaces = await self._spaces.scope(job.space_id, {"user_id": user})
            memories = (await self._storage.list(StoreQuery(
                owner=Owner(tenant=access.workspace_id, subject_id=space_owner(job.space_id)),
                namespaces=namespaces, limit=profiles.MEMORIES_MAX))).memories if namespaces \
                else []
            if not memories:
                return outcome("insufficient_data", namespaces)
            schema = (json.loads(settings.schema_text) if settings.schema_text
                      else profiles.DEFAULT_SCHEMA)
            assert access.llm_model_name and access.llm_base_url
            answer = await self._chat.complete(
                access.llm_base_url, access.llm_model_name,
                profiles.prompt(schema, settings.custom_instructions,
                                [m.text for m in memories]), timeout_s=self._timeout)
            built = await asyncio.to_thread(profiles.profile_of, answer, schema)  # masks
            return outcome("succeeded", namespaces, built)
        except (MemgateError, MalformedAnswerError) as error:
            log.info("a profile of space %s was not built (%s)", job.space_id,
                     getattr(error, "code", "malformed answer"))
            return outcome("failed", [])


__all__ = ["SpaceProfiles"]
