"""User profiles of memory spaces (mem0 2.2's profiles): each space's profile settings and its
users' generated profiles, in `spaces.duckdb` beside the entity map, and the generation jobs,
in memory. Owned by the spaces actor, the file's single writer; mirrored in memory.

A profile names its end user (`user_id`) and the namespaces of their memories it was built
from: erasing the user, deleting the space, deletes it (the spaces actor then rewrites the
file), and a backup seals it under those namespaces' keys. Its text is masked before it gets
here. Jobs are transient (a restart forgets them, as it forgets an answer in flight): each
keeps its Idempotency-Key a day, and one not finished within `JOB_STALE` reads as failed for
the users it did not reach (its worker's process may have died). At most `RUNNING_MAX` jobs of
a space are under way at once (each asks the space's LLM once a user): one more is refused 429
until one ends.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import duckdb

from memgate.contracts.errors import ConflictError, MemorySpaceRateLimitedError, NotFoundError
from memgate.contracts.profiles import (
    Job, JobRequest, JobStatus, ProfileJobView, ProfileOutcome, ProfileStatus, SettingsChange,
    StoredProfile, StoredSettings,
)
from memgate.storage.directory import new_id
from memgate.storage.named import named

SCHEMA = """
CREATE TABLE IF NOT EXISTS profile_settings (
    space_id VARCHAR NOT NULL, enabled BOOLEAN NOT NULL, schema_text VARCHAR,
    custom_instructions VARCHAR
);
CREATE TABLE IF NOT EXISTS profiles (
    space_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, namespaces VARCHAR[] NOT NULL,
    status VARCHAR NOT NULL, profile_json VARCHAR, updated_at TIMESTAMP NOT NULL,
    generation_count INTEGER NOT NULL
);
"""
KEY_TTL = timedelta(hours=24)  # an Idempotency-Key returns its job this long
JOB_STALE = timedelta(minutes=10)  # a job still unfinished then has failed where it did not reach
JOBS_MAX = 1000  # jobs kept per space (the oldest go first)
RUNNING_MAX = 4  # jobs of a space under way at once: each asks the space's LLM for each user
RETRY_AFTER_S = 30


@dataclass(frozen=True)
class ProfileRow:
    space_id: str
    user_id: str
    namespaces: list[str]
    status: str
    profile_json: str | None
    updated_at: datetime
    generation_count: int


def job_view(job: Job, now: datetime) -> ProfileJobView:
    """The job as mem0 shows it; a stale one has failed for the users it did not reach."""
    outcomes = dict(job.outcomes)
    if now - job.updated_at > JOB_STALE:
        outcomes |= {user: "failed" for user in job.entity_ids if user not in outcomes}
    counts = {status: sum(1 for o in outcomes.values() if o == status)
              for status in ("succeeded", "failed", "insufficient_data")}
    total = len(job.entity_ids)
    status: JobStatus
    if len(outcomes) == total:
        status = "failed" if total and counts["failed"] == total else "succeeded"
    else:
        status = "running" if job.running else "pending"
    return ProfileJobView(id=job.job_id, operation=job.operation, status=status, total=total,
                          completed=len(outcomes), succeeded=counts["succeeded"],
                          failed=counts["failed"], skipped=counts["insufficient_data"],
                          created_at=job.created_at, updated_at=job.updated_at)


class ProfileStore:
    """The profile tables of `connection()`'s file (the spaces store's; a rewrite replaces it,
    so it is asked each time) and the jobs."""

    def __init__(self, connection: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        self._db = connection
        self._settings = {space_id: StoredSettings(enabled=enabled, schema_text=schema_text,
                                                   custom_instructions=instructions)
                          for space_id, enabled, schema_text, instructions in self._db().execute(
                              "SELECT space_id, enabled, schema_text, custom_instructions "
                              "FROM profile_settings").fetchall()}
        self._profiles = {(p.space_id, p.user_id): p for p in named(
            ProfileRow, self._db().execute("SELECT * FROM profiles"))}
        self._jobs: dict[str, dict[str, Job]] = {}  # by space, by job id (oldest first)
        self._keys: dict[tuple[str, str], tuple[str, JobRequest]] = {}

    # --- settings ---

    def settings(self, space_id: str) -> StoredSettings:
        return self._settings.get(space_id, StoredSettings())

    def configure(self, change: SettingsChange) -> StoredSettings:
        updated = self.settings(change.space_id).model_copy(update={
            name if name != "schema" else "schema_text": getattr(
                change, name if name != "schema" else "schema_text")
            for name in change.fields})
        db = self._db()
        db.execute("DELETE FROM profile_settings WHERE space_id = ?", [change.space_id])
        db.execute("INSERT INTO profile_settings VALUES (?, ?, ?, ?)",
                   [change.space_id, updated.enabled, updated.schema_text,
                    updated.custom_instructions])
        self._settings[change.space_id] = updated
        return updated

    # --- jobs ---

    def job(self, request: JobRequest, users: list[str], now: datetime) -> Job:
        """The job of this Idempotency-Key (replayed), or a new one for `users` (the space's
        users it will build a profile of). A key reused for another request: 409."""
        self._expire(now)
        if (known := self._keys.get((request.space_id, request.key))) is not None:
            job_id, first = known
            if first != request:
                raise ConflictError("this Idempotency-Key was used for another request",
                                    {"field": "Idempotency-Key"})
            job = self._jobs.get(request.space_id, {}).get(job_id)
            if job is not None:
                return job.model_copy(update={"replayed": True})
        jobs = self._jobs.setdefault(request.space_id, {})
        if sum(1 for job in jobs.values() if job_view(job, now).status in ("pending", "running")
               ) >= RUNNING_MAX:
            raise MemorySpaceRateLimitedError(
                "as many profile jobs as allowed are under way in this memory space",
                {"limit": "profileJobsRunning", "max": RUNNING_MAX,
                 "retryAfterSeconds": RETRY_AFTER_S})
        job = Job(job_id=new_id("pj"), space_id=request.space_id, operation=request.operation,
                  entity_ids=users, created_at=now, updated_at=now)
        jobs[job.job_id] = job
        while len(jobs) > JOBS_MAX:
            del jobs[next(iter(jobs))]
        self._keys[(request.space_id, request.key)] = (job.job_id, request)
        return job

    def _expire(self, now: datetime) -> None:
        for key, (job_id, _) in list(self._keys.items()):
            job = self._jobs.get(key[0], {}).get(job_id)
            if job is None or now - job.created_at > KEY_TTL:
                del self._keys[key]
                self._jobs.get(key[0], {}).pop(job_id, None)

    def started(self, space_id: str, job_id: str, now: datetime) -> None:
        if (job := self._jobs.get(space_id, {}).get(job_id)) is not None:
            self._jobs[space_id][job_id] = job.model_copy(update={"running": True,
                                                                  "updated_at": now})

    def find_job(self, space_id: str, job_id: str) -> Job:
        job = self._jobs.get(space_id, {}).get(job_id)
        if job is None:
            raise NotFoundError("no such profile job")
        return job

    def _building(self, space_id: str, user_id: str, now: datetime) -> bool:
        return any(user_id in job.entity_ids and user_id not in job.outcomes
                   and now - job.updated_at <= JOB_STALE
                   for job in self._jobs.get(space_id, {}).values())

    # --- profiles ---

    def profile(self, space_id: str, user_id: str, known: bool, now: datetime
                ) -> StoredProfile:
        row = self._profiles.get((space_id, user_id))
        building = self._building(space_id, user_id, now)
        if row is None:
            return StoredProfile(known=known, building=building)
        status: ProfileStatus = row.status  # type: ignore[assignment]  # stored from the enum
        return StoredProfile(known=True, profile_json=row.profile_json, status=status,
                             updated_at=row.updated_at, generation_count=row.generation_count,
                             building=building)

    def record(self, outcome: ProfileOutcome, now: datetime) -> None:
        """One user of a job done. A profile that succeeded replaces the user's; a failure, or
        no memories to build from, leaves a profile built before as it was."""
        jobs = self._jobs.get(outcome.space_id, {})
        if (job := jobs.get(outcome.job_id)) is not None:
            jobs[outcome.job_id] = job.model_copy(update={
                "outcomes": {**job.outcomes, outcome.entity_id: outcome.status},
                "updated_at": now})
        key = (outcome.space_id, outcome.entity_id)
        before = self._profiles.get(key)
        if outcome.status != "succeeded" and before is not None and before.profile_json:
            return
        row = ProfileRow(outcome.space_id, outcome.entity_id, list(outcome.namespaces),
                         outcome.status, outcome.profile_json, now.replace(tzinfo=None),
                         (before.generation_count if before else 0)
                         + (outcome.status == "succeeded"))
        if before is not None and not row.profile_json:
            row = replace(row, generation_count=before.generation_count)
        db = self._db()
        db.execute("DELETE FROM profiles WHERE space_id = ? AND user_id = ?", list(key))
        db.execute("INSERT INTO profiles VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [row.space_id, row.user_id, row.namespaces, row.status, row.profile_json,
                    row.updated_at, row.generation_count])
        self._profiles[key] = row

    # --- deletions (inside the spaces store's deleting transaction) ---

    def forget_space(self, space_id: str) -> None:
        db = self._db()
        for table in ("profile_settings", "profiles"):
            db.execute(f"DELETE FROM {table} WHERE space_id = ?", [space_id])
        self._settings.pop(space_id, None)
        for key in [k for k in self._profiles if k[0] == space_id]:
            del self._profiles[key]
        self._jobs.pop(space_id, None)
        for key in [k for k in self._keys if k[0] == space_id]:
            del self._keys[key]

    def forget_users(self, space_id: str, user_ids: Collection[str]) -> None:
        """The users' profiles, and the jobs that name them (their ids leave memory too)."""
        users = set(user_ids)
        db = self._db()
        for user_id in users:
            db.execute("DELETE FROM profiles WHERE space_id = ? AND user_id = ?",
                       [space_id, user_id])
            self._profiles.pop((space_id, user_id), None)
        jobs = self._jobs.get(space_id, {})
        for job_id in [j for j, job in jobs.items() if users & set(job.entity_ids)]:
            del jobs[job_id]


__all__ = ["SCHEMA", "ProfileRow", "ProfileStore", "job_view"]
