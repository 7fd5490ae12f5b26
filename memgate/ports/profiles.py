"""The spaces actor's profile state as the space-memories actor sees it (mem0 2.2's profiles):
settings, jobs and stored profiles, kept beside the space's entity map (`storage.profiles`)."""

from __future__ import annotations

from typing import Protocol

from memgate.bus import subjects
from memgate.contracts import Done
from memgate.contracts.profiles import (
    Job, JobLookup, JobRequest, ProfileLookup, ProfileOutcome, SettingsChange, SettingsRequest,
    StoredProfile, StoredSettings,
)
from memgate.ports.bus import Requester

OPERATIONS = ("settings", "configure", "job", "started", "find", "profile", "record")


def subject(operation: str) -> str:
    """`mem.int.spaces.profiles.<operation>`."""
    return subjects.spaces_internal(f"profiles.{operation}")


class ProfileState(Protocol):
    async def settings(self, space_id: str) -> StoredSettings: ...
    async def configure(self, change: SettingsChange) -> StoredSettings: ...

    async def job(self, request: JobRequest) -> Job:
        """The key's job (replayed), or a new one for the users it names (404: no such
        user; 409: the key was used for another request)."""
        ...

    async def started(self, space_id: str, job_id: str) -> None: ...
    async def find(self, space_id: str, job_id: str) -> Job: ...
    async def profile(self, space_id: str, entity_id: str) -> StoredProfile: ...
    async def record(self, outcome: ProfileOutcome) -> None: ...


class BusProfileState:
    """`ProfileState` over the bus (`mem.int.spaces.profiles.*`)."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def settings(self, space_id: str) -> StoredSettings:
        return await self._bus.request(subject("settings"), SettingsRequest(space_id=space_id),
                                       StoredSettings)

    async def configure(self, change: SettingsChange) -> StoredSettings:
        return await self._bus.request(subject("configure"), change, StoredSettings)

    async def job(self, request: JobRequest) -> Job:
        return await self._bus.request(subject("job"), request, Job)

    async def started(self, space_id: str, job_id: str) -> None:
        await self._bus.request(subject("started"), JobLookup(space_id=space_id, job_id=job_id),
                                Done)

    async def find(self, space_id: str, job_id: str) -> Job:
        return await self._bus.request(subject("find"), JobLookup(space_id=space_id,
                                                                  job_id=job_id), Job)

    async def profile(self, space_id: str, entity_id: str) -> StoredProfile:
        return await self._bus.request(subject("profile"), ProfileLookup(
            space_id=space_id, entity_id=entity_id), StoredProfile)

    async def record(self, outcome: ProfileOutcome) -> None:
        await self._bus.request(subject("record"), outcome, Done)


__all__ = ["OPERATIONS", "BusProfileState", "ProfileState", "subject"]
