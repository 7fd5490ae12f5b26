"""The spaces actor: memory spaces, their sharing roles, and the access check (SPEC §4.1, §4.5).

It owns `DIR/spaces.duckdb` (single writer). Public commands (`mem.space.spaces.*`,
`mem.space.shares.*`) carry a member token; the directory resolves it afresh at every request,
so a member whose flag is turned off, or whose share is revoked, loses access at once. Every
actor serving a space route asks `mem.int.spaces.access` first. Creating a space takes from the
member's quota of spaces (`storage.quotas`), counted by this single writer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from memgate.actors.keys import dumps
from memgate.bus import parse, subjects
from memgate.contracts import Contract, Done, Envelope
from memgate.contracts.directory import MemberPrincipal, MemberRequest
from memgate.contracts.errors import (
    MemorySpacesDisabledError, NonRetainingWorkspaceError, NotFoundError,
    UnauthenticatedError, UnprocessableError,
)
from memgate.contracts.erasure import SubjectTarget
from memgate.contracts.internal import StorePurge, space_owner
from memgate.contracts.sessions import SpaceDeleted
from memgate.contracts.mem0 import SpaceLlm, SpaceLlmRequest
from memgate.contracts.profiles import (
    Job, JobLookup, JobRequest, ProfileLookup, ProfileOutcome, SettingsChange, SettingsRequest,
    StoredProfile, StoredSettings,
)
from memgate.contracts.spaces import (
    AccessRequest, CreateSpace, Entities, EntitiesRequest, Entity, EntityRequest, EntitySettled,
    Permission, Scope, ScopeRequest, ShareSpace, SpaceAccess, SpaceList, SpaceRole, SpaceView,
)
from memgate.policy import idempotency
from memgate.policy.llm_origins import Origin, allowed, well_formed
from memgate.policy.masking import mask
from memgate.policy.mem0 import compile_filters, namespaces
from memgate.ports.bus import Requester
from memgate.ports import profiles
from memgate.ports.directory import BusDirectory
from memgate.ports.storage import BusStorage
from memgate.ports.services import BusSessions
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Serial, enveloped
from memgate.runtime.compaction import Compactions
from memgate.storage.directory import hash_token
from memgate.storage.quotas import SPACES, Quota
from memgate.storage.spaces import EntityRow, SpaceRow, SpaceStore

def _now() -> datetime:
    return datetime.now(UTC)


def _shown(url: str | None) -> str | None:
    """A space's llmBaseUrl as members see it: never with userinfo (a space stored before
    userinfo was refused may still hold a password there)."""
    if url is None or well_formed(url):
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _view(space: SpaceRow, role: SpaceRole) -> SpaceView:
    # masked when stored; masked again when shown, for spaces stored before that (idempotent)
    return SpaceView(id=space.space_id, description=mask(space.description).text,
                     llm_model_name=space.llm_model_name,
                     llm_base_url=_shown(space.llm_base_url),
                     permissions=role.permissions,
                     rbac_resource_id=f"memgate:{space.workspace_id}:space:{space.space_id}")


def _entity(row: EntityRow) -> Entity:
    return Entity(user_id=row.user_id, agent_id=row.agent_id, run_id=row.run_id,
                  namespace=row.namespace)


class SpacesActor(ActorBase):
    name = "spaces"
    store = Opened[SpaceStore]()

    def __init__(self, *, path: Path, bus: Requester, partitions: int = 1,
                 llm_models: Sequence[str], llm_origins: Sequence[Origin] = (),
                 quota: Quota = SPACES) -> None:
        self._path = path
        self._quota = quota
        self._bus = bus
        self._sessions = BusSessions(bus)
        self._directory = BusDirectory(bus)
        self._storage = BusStorage(bus, partitions=partitions)
        self._partitions = partitions
        self._llm_models = tuple(llm_models)
        self._llm_origins = tuple(llm_origins)
        self._serial = Serial("spaces")
        self._dumps = dumps(self, self._serial)  # backups
        self._compactions = Compactions(self._serial, lambda: self.store, self.name)

    async def start(self) -> None:
        self.store = await self._serial(partial(SpaceStore, self._path, quota=self._quota))

    async def stop(self) -> None:
        if (store := SpacesActor.store.take(self)) is not None:
            await self._serial.unreplicated(store.close)
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        public: dict[str, Callable[[Envelope], Awaitable[Contract]]] = {
            "spaces.create": self.create, "spaces.get": self.get, "spaces.list": self.list_spaces,
            "spaces.delete": self.delete, "shares.put": self.share, "shares.delete": self.revoke,
        }
        internal: dict[str, Callable[[bytes], Awaitable[Contract]]] = {
            "access": self.access, "entity": self.entity, "settle": self.settle,
            "entities": self.entities, "scope": self.scope, "subject": self.subject,
            "llm": self.llm,
        }
        kept: dict[str, Callable[[bytes], Awaitable[Contract]]] = {
            "settings": self.profile_settings, "configure": self.configure_profiles,
            "job": self.profile_job, "started": self.profile_job_started,
            "find": self.find_profile_job, "profile": self.profile,
            "record": self.record_profile,
        }
        return [*(Endpoint(subjects.space(operation), enveloped(handler))
                  for operation, handler in public.items()),
                *(Endpoint(subjects.spaces_internal(operation), handler)
                  for operation, handler in internal.items()),
                *(Endpoint(profiles.subject(operation), handler)
                  for operation, handler in kept.items()),
                *self._dumps]

    # --- who is calling ---

    async def _member(self, token_hash: str | None) -> MemberPrincipal:
        """The caller, with the memory-space flag on (SPEC §4.1: all or nothing), in a workspace
        that keeps history: every space route (sessions, events and mem0 ask `access`) is one."""
        if not token_hash:
            raise UnauthenticatedError("a member token is required")
        member = await self._directory.member(MemberRequest(token_hash=token_hash))
        if member.settings.non_retaining:
            raise NonRetainingWorkspaceError("this workspace keeps no history")
        if not member.memory_spaces_enabled:
            raise MemorySpacesDisabledError("memory spaces are not enabled for this member")
        return member

    def _access(self, member: MemberPrincipal, space_id: str) -> SpaceAccess:
        """Runs on the serial thread: the space and the member's share in it, or NOT_FOUND
        (an unknown space and one the member may not see are told apart by nobody)."""
        space = self.store.space(space_id)
        role = self.store.role(space_id, member.member_id) if space else None
        if space is None or role is None or space.workspace_id != member.workspace_id:
            raise NotFoundError("no such memory space")
        space_role = SpaceRole(role)
        return SpaceAccess(space_id=space_id, workspace_id=space.workspace_id,
                           member_id=member.member_id, role=space_role,
                           permissions=space_role.permissions,
                           llm_model_name=space.llm_model_name, llm_base_url=space.llm_base_url,
                           retention_days=member.settings.retention_days)

    async def _allowed(self, envelope: Envelope, permission: Permission) -> SpaceAccess:
        member = await self._member(hash_token(envelope.token) if envelope.token else None)
        access = await self._serial(self._access, member, envelope.params.get("spaceId", ""))
        return access.require(permission)

    # --- internal answers ---

    async def access(self, payload: bytes) -> SpaceAccess:
        request = parse(AccessRequest, payload)
        member = await self._member(request.token_hash)
        return await self._serial(self._access, member, request.space_id)

    async def entity(self, payload: bytes) -> Entity:
        """The entity's namespace; a new entity's row is written pending, before the store, so
        that an erasure finds it even if nothing settles it."""
        request = parse(EntityRequest, payload)
        ids = request.entity
        row = await self._serial(self.store.entity, request.space_id,
                                 (ids.user_id, ids.agent_id, ids.run_id))
        return _entity(row)

    async def settle(self, payload: bytes) -> Done:
        """An add about an entity ended: a pending row is settled if it stored memories, and
        deleted, off the file's bytes, if every add about it was refused."""
        settled = parse(EntitySettled, payload)
        ids = settled.entity
        async with self._compactions.deleting():
            await self._serial(partial(self.store.settle, settled.space_id,
                                       (ids.user_id, ids.agent_id, ids.run_id),
                                       stored=settled.stored))
        return Done()

    async def entities(self, payload: bytes) -> Entities:
        """The entities of the namespaces a read shows (never the whole map: it may not fit
        in one message)."""
        request = parse(EntitiesRequest, payload)
        rows = await self._serial(self.store.entities, request.space_id, request.namespaces)
        return Entities(entities=[_entity(row) for row in rows])

    async def scope(self, payload: bytes) -> Scope:
        """The namespaces a mem0 filter selects, resolved here, beside the entity map."""
        request = parse(ScopeRequest, payload)
        predicate = compile_filters(request.filters)
        rows = await self._serial(self.store.entities, request.space_id)
        return Scope(namespaces=namespaces(predicate, (_entity(row) for row in rows)) or [])

    async def llm(self, payload: bytes) -> SpaceLlm:
        """The LLM a space extracts facts with (the space-memories actor, for a session's
        extract_memories: no member token is at hand then)."""
        request = parse(SpaceLlmRequest, payload)
        space = await self._serial(self.store.space, request.space_id)
        if space is None:
            raise NotFoundError("no such memory space")
        return SpaceLlm(space_id=space.space_id, workspace_id=space.workspace_id,
                        created_by=space.created_by, llm_model_name=space.llm_model_name,
                        llm_base_url=space.llm_base_url)

    async def subject(self, payload: bytes) -> SubjectTarget:
        """For an erasure: the spaces (storage owners) and namespaces that hold an end user's
        mem0 memories; with `erase`, the entity map forgets them (the identity mapping)."""
        target = parse(SubjectTarget, payload)
        if target.external_id is None:
            return target

        def find() -> dict[str, list[str]]:
            entities = self.store.entities_of_user(target.tenant, target.external_id or "")
            owners: dict[str, list[str]] = {}
            for entity in entities:
                owners.setdefault(space_owner(entity.space_id), []).append(entity.namespace)
            if target.erase:
                self.store.forget_entities(entities)
            return owners

        return target.model_copy(update={"owners": await self._serial(find)})

    # --- user profiles (`storage.profiles`; the space-memories actor generates them) ---

    async def profile_settings(self, payload: bytes) -> StoredSettings:
        request = parse(SettingsRequest, payload)
        return await self._serial(self.store.profiles.settings, request.space_id)

    async def configure_profiles(self, payload: bytes) -> StoredSettings:
        return await self._serial(self.store.profiles.configure, parse(SettingsChange, payload))

    async def profile_job(self, payload: bytes) -> Job:
        """The Idempotency-Key's job, or a new one: `trigger` for one user the space has
        memories about (else 404), `sample` for its first users, up to `limit`."""
        request = parse(JobRequest, payload)

        def create() -> Job:
            users = self.store.users(request.space_id)
            if request.operation == "trigger":
                users = [u for u in users if u == request.entity_id]
                if not users:
                    raise NotFoundError("no such user in this memory space",
                                        {"field": "entity_id"})
            return self.store.profiles.job(request, users[:request.limit], _now())

        return await self._serial(create)

    async def profile_job_started(self, payload: bytes) -> Done:
        lookup = parse(JobLookup, payload)
        await self._serial(self.store.profiles.started, lookup.space_id, lookup.job_id, _now())
        return Done()

    async def find_profile_job(self, payload: bytes) -> Job:
        lookup = parse(JobLookup, payload)
        return await self._serial(self.store.profiles.find_job, lookup.space_id, lookup.job_id)

    async def profile(self, payload: bytes) -> StoredProfile:
        lookup = parse(ProfileLookup, payload)

        def read() -> StoredProfile:
            known = lookup.entity_id in self.store.users(lookup.space_id)
            return self.store.profiles.profile(lookup.space_id, lookup.entity_id, known, _now())

        return await self._serial(read)

    async def record_profile(self, payload: bytes) -> Done:
        """A user's profile built (masked), or why not; a user erased meanwhile is not
        brought back."""
        outcome = parse(ProfileOutcome, payload)

        def record() -> None:
            if outcome.entity_id in self.store.users(outcome.space_id):
                self.store.profiles.record(outcome, _now())

        await self._serial(record)
        return Done()

    # --- public commands ---

    def _check_llm(self, body: CreateSpace) -> None:
        if (body.llm_model_name is None) != (body.llm_base_url is None):
            raise UnprocessableError("give both llmModelName and llmBaseUrl, or neither",
                                     {"field": "llmBaseUrl" if body.llm_base_url is None
                                      else "llmModelName"})
        if body.llm_model_name is not None and body.llm_model_name not in self._llm_models:
            raise UnprocessableError("the model is not one of the allowed models",
                                     {"field": "llmModelName",
                                      "allowed": list(self._llm_models)})
        if body.llm_base_url is not None:
            if not well_formed(body.llm_base_url):
                raise UnprocessableError(
                    "llmBaseUrl must be scheme://host[:port] with at most a path (no userinfo, "
                    "query or fragment)", {"field": "llmBaseUrl"})
            if not allowed(body.llm_base_url, self._llm_origins):
                raise UnprocessableError("llmBaseUrl is not at an origin the operator allows",
                                         {"field": "llmBaseUrl", "allowedOrigins": sorted(
                                             f"{o.scheme}://{o.host}:{o.port}{o.path}"
                                             for o in self._llm_origins)})

    async def create(self, envelope: Envelope) -> SpaceView:
        member = await self._member(hash_token(envelope.token) if envelope.token else None)
        body = parse(CreateSpace, envelope.body)
        self._check_llm(body)
        # free text, shown to every member the space is shared with: masked like memory text
        key_hash = idempotency.key_hash(envelope.params)  # a retry gets the space it made
        space = await self._serial(partial(
            self.store.create, member.workspace_id, member.member_id,
            mask(body.description).text, body.llm_model_name, body.llm_base_url,
            space_id=None if key_hash is None else idempotency.keyed_id(
                "sp", member.workspace_id, member.member_id, key_hash)))
        return _view(space, SpaceRole.OWNER)

    async def get(self, envelope: Envelope) -> SpaceView:
        access = await self._allowed(envelope, Permission.CAN_VIEW)
        space = self.store.space(access.space_id)
        if space is None:
            raise NotFoundError("no such memory space")
        return _view(space, access.role)

    async def list_spaces(self, envelope: Envelope) -> SpaceList:
        member = await self._member(hash_token(envelope.token) if envelope.token else None)
        found = await self._serial(self.store.spaces_of, member.workspace_id, member.member_id)
        return SpaceList(spaces=[_view(space, SpaceRole(role)) for space, role in found])

    async def delete(self, envelope: Envelope) -> Done:
        """The space, its shares and its entity map at once; its memories, sessions and events
        are deleted (each owner rewrites its file: they leave the disk)."""
        access = await self._allowed(envelope, Permission.CAN_DELETE)
        await self._serial(self.store.delete, access.space_id)
        await self._storage.purge(StorePurge(tenant=access.workspace_id,
                                             subject_id=space_owner(access.space_id)))
        await self._sessions.space_deleted(SpaceDeleted(tenant=access.workspace_id,
                                                        space_id=access.space_id))
        return Done()

    async def share(self, envelope: Envelope) -> SpaceView:
        access = await self._allowed(envelope, Permission.CAN_SHARE)
        body = parse(ShareSpace, envelope.body)
        target = await self._directory.member(MemberRequest(
            workspace_id=access.workspace_id, member_id=envelope.params.get("memberId", "")))
        await self._serial(self.store.share, access.space_id, target.member_id, body.role.value)
        space = self.store.space(access.space_id)
        assert space is not None
        return _view(space, access.role)

    async def revoke(self, envelope: Envelope) -> Done:
        access = await self._allowed(envelope, Permission.CAN_SHARE)
        if not await self._serial(self.store.revoke, access.space_id,
                                  envelope.params.get("memberId", "")):
            raise NotFoundError("no such share")
        return Done()

