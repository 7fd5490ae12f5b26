"""The directory actor: owns workspaces, members and credentials (SPEC §2.1–§2.4).

It answers the admin commands (`mem.admin.*`, member or operator token) and resolves agent
credentials to principals for governance (`mem.int.dir.principal`), re-reading role, scopes and
settings at every use so that demotion and revocation bite at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from memgate.actors.keys import dumps
from memgate.runtime.actor import (
    ActorBase, Endpoint, Opened, Operator, Serial, enveloped,
)
from memgate.bus import parse, subjects
from memgate.bus.subjects import Admin
from memgate.ports.bus import Announcer, Requester
from memgate.ports.registry import BusRegistry
from memgate.ports.storage import BusStorage
from memgate.ports.services import BusOperations
from memgate.bus.logins import PARTITIONED_COMMANDS, PUBLIC_COMMANDS
from memgate.bus.server import new_agent_seed
from memgate.contracts import (
    AddMember, Contract, CreateCredential, CreateNatsAgent, CreateWorkspace, CredentialCreated,
    DeleteOwnMemories, Done, Envelope, ForgetResult, ListRequest, ListResult, MemberToken,
    MemberView, NatsAgentCreated, NatsAgentKey, NatsAgents,
    PatchMember, Principal, Role, Scope, SettingsUpdate, WorkspaceCreated, WorkspaceSettings,
)
from memgate.contracts.errors import (
    ForbiddenError, InsufficientScopeError, NotFoundError, UnauthenticatedError,
    UnavailableError, ValidationFailedError,
)
from memgate.contracts.directory import (
    Credentials, CredentialView, Me, MemberPrincipal, MemberRequest, Members,
)
from memgate.contracts.internal import Owner, OwnerCheck, PrincipalRequest, StorePurge, StoreQuery
from memgate.contracts.internal import Retentions
from memgate.storage.directory import DirectoryStore, MemberRow, WorkspaceRow, hash_token
from memgate.policy.authorisation import refuse_personal_data
from memgate.tasks import cancelled

log = logging.getLogger("memgate.directory")

AdminHandler = Callable[[Envelope], Awaitable[Contract]]


def _settings(ws: WorkspaceRow) -> WorkspaceSettings:
    return WorkspaceSettings(agent_memories_enabled=ws.agent_memories_enabled,
                             retention_days=ws.retention_days, non_retaining=ws.non_retaining)


def _view(row: MemberRow) -> MemberView:
    return MemberView(member_id=row.member_id, name=row.name, role=Role(row.role),
                      memory_spaces_enabled=row.memory_spaces_enabled)


def check_grantable(role: Role, scopes: list[Scope]) -> None:
    """A scope may be granted only to a member whose role reaches its minimum (SPEC §2.1)."""
    for scope in scopes:
        if role.rank < scope.minimum_role.rank:
            raise InsufficientScopeError(
                f"{scope.value} needs the role {scope.minimum_role.value} or higher",
                {"scope": scope.value, "role": role.value})


class DirectoryBus(Requester, Announcer, Protocol):
    """What the directory needs of the bus: asking other actors, announcing its changes."""


class DirectoryActor(ActorBase):
    name = "directory"
    store = Opened[DirectoryStore]()

    def __init__(self, *, path: Path, admin_token: Callable[[], str], bus: DirectoryBus,
                 partitions: int = 1, nats_authority: bool = False) -> None:
        """`nats_authority`: memgate runs the NATS server, and a NATS login counts as issued or
        revoked only once the nats-authority has applied it."""
        self._path = path
        self._nats_authority = nats_authority
        self._partitions = partitions
        self._bus = bus
        self._registry = BusRegistry(bus)
        self._operations = BusOperations(bus)
        self._storage = BusStorage(bus, partitions=partitions)
        self._admin = Operator(admin_token)
        self._serial = Serial("directory")
        self._dumps = dumps(self, self._serial)  # backups
        self._sweeps: set[asyncio.Task[None]] = set()  # reaper sweeps asked for, not awaited

    async def start(self) -> None:
        self._admin.load()
        self.store = await self._serial(DirectoryStore, self._path)

    async def stop(self) -> None:
        await cancelled(*self._sweeps)
        if (store := DirectoryActor.store.take(self)) is not None:
            await self._serial.unreplicated(store.close)
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        internal = {
            subjects.DIRECTORY_PRINCIPAL: self.principal,
            subjects.DIRECTORY_NATS_AGENTS: self.nats_agents,
            subjects.DIRECTORY_OWNER_CHECK: self.owner_check,
            subjects.DIRECTORY_MEMBER: self.member_principal,
            subjects.DIRECTORY_FORGET_MEMBER: self.forget_member,
            subjects.DIRECTORY_RETENTION: self.retention,
        }
        admin: dict[str, AdminHandler] = {
            Admin.WORKSPACES_CREATE: self.create_workspace,
            Admin.SELF_WHOAMI: self.whoami,
            Admin.MEMBERS_LIST: self.list_members,
            Admin.MEMBERS_ADD: self.add_member,
            Admin.MEMBERS_PATCH: self.patch_member,
            Admin.CREDENTIALS_LIST: self.list_credentials,
            Admin.CREDENTIALS_CREATE: self.create_credential,
            Admin.CREDENTIALS_REVOKE: self.revoke_credential,
            Admin.SETTINGS_GET: self.get_settings,
            Admin.SETTINGS_PUT: self.put_settings,
            Admin.SELF_LIST: self.list_own_memories,
            Admin.SELF_DELETE: self.delete_own_memories,
            Admin.OWNER_PURGE: self.purge_workspace_memories,
            Admin.NATS_CREATE: self.create_nats_agent,
            Admin.NATS_REVOKE: self.revoke_nats_agent,
        }
        return [*(Endpoint(subject, handler) for subject, handler in internal.items()),
                *(Endpoint(subject, enveloped(handler)) for subject, handler in admin.items()),
                *self._dumps]

    # --- credentials → principals (governance asks, on every command) ---

    async def principal(self, payload: bytes) -> Principal:
        request = parse(PrincipalRequest, payload)
        return await self._serial(self._principal, request.token_hash)

    def _principal(self, token_hash: str) -> Principal:
        credential = self.store.credential_by_token(token_hash)
        if credential is None:
            raise UnauthenticatedError("unknown or revoked credential")
        member = self.store.member(credential.workspace_id, credential.member_id)
        workspace = self.store.workspace(credential.workspace_id)
        if member is None or workspace is None:
            raise UnauthenticatedError("unknown or revoked credential")
        return Principal(
            workspace_id=workspace.workspace_id, member_id=member.member_id,
            credential_id=credential.credential_id, role=Role(member.role),
            scopes=frozenset(Scope(s) for s in credential.scopes),
            context_set_id=credential.context_set_id, settings=_settings(workspace))

    async def member_principal(self, payload: bytes) -> MemberPrincipal:
        """A member token (or a member id within a workspace) → the member, for memory spaces."""
        request = parse(MemberRequest, payload)

        def resolve() -> MemberPrincipal:
            if request.token_hash is not None:
                member = self.store.member_by_token(request.token_hash)
                if member is None:
                    raise UnauthenticatedError("unknown member token")
            else:
                member = self.store.member(request.workspace_id or "", request.member_id or "")
                if member is None:
                    raise NotFoundError("no such member")
            workspace = self.store.workspace(member.workspace_id)
            assert workspace is not None
            return MemberPrincipal(workspace_id=member.workspace_id, member_id=member.member_id,
                                   role=Role(member.role),
                                   memory_spaces_enabled=member.memory_spaces_enabled,
                                   settings=_settings(workspace))

        return await self._serial(resolve)

    async def retention(self, payload: bytes) -> Retentions:
        """For the reaper: every workspace's retentionDays."""
        return Retentions(retention_days=await self._serial(self.store.retention))

    def _sweep_soon(self) -> None:
        """Retention changed: ask the reaper to sweep now (not awaited; a failure only waits
        for its next scheduled sweep)."""
        async def sweep() -> None:
            try:
                await self._operations.sweep()
            except Exception as exc:
                log.warning("directory: the reaper was not reached (%s)", type(exc).__name__)

        task = asyncio.create_task(sweep())
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def forget_member(self, payload: bytes) -> Done:
        """For an erasure, once the member's data is gone: the member ↔ identity mapping goes
        too (the name; the tokens stop working)."""
        request = parse(MemberRequest, payload)

        def forget() -> None:
            member = self.store.member(request.workspace_id or "", request.member_id or "")
            if member is not None:
                self.store.forget_member(member.member_id)

        await self._serial(forget)
        await self._changed()
        return Done()

    async def _changed(self) -> None:
        """A credential, member or workspace changed: governance forgets the principals it
        holds, before the change is answered (`PrincipalCache`)."""
        await self._bus.announce(subjects.PRINCIPALS_CHANGED)

    # --- who is calling an admin command ---

    async def owner_check(self, payload: bytes) -> Done:
        """For the registry: the operator, or the owner of the workspace, may change it."""
        check = parse(OwnerCheck, payload)
        if self._admin.is_digest(check.token_hash):
            return Done()

        def as_owner() -> Done:
            member = self.store.member_by_token(check.token_hash)
            if member is None:
                raise UnauthenticatedError("unknown token")
            if member.workspace_id != check.workspace_id:
                raise NotFoundError("no such workspace")
            if member.role != Role.OWNER:
                raise ForbiddenError("only the workspace owner may do this")
            return Done()

        return await self._serial(as_owner)

    def _operator(self, token: str | None) -> None:
        if not self._admin.is_token(token):
            raise UnauthenticatedError("the operator token is required")

    def _member(self, envelope: Envelope, *, owner: bool = False) -> MemberRow:
        if not envelope.token:
            raise UnauthenticatedError("a member token is required")
        member = self.store.member_by_token(hash_token(envelope.token))
        if member is None:
            raise UnauthenticatedError("unknown member token")
        if member.workspace_id != envelope.params.get("wsId"):
            raise NotFoundError("no such workspace")
        if owner and member.role != Role.OWNER:
            raise ForbiddenError("only the workspace owner may do this")
        return member

    # --- admin commands ---

    async def create_workspace(self, envelope: Envelope) -> WorkspaceCreated:
        self._operator(envelope.token)
        body = parse(CreateWorkspace, envelope.body)
        refuse_personal_data(name=body.name)

        def create() -> WorkspaceCreated:
            workspace_id = self.store.create_workspace(body.name, body.non_retaining)
            member_id, token = self.store.add_member(workspace_id, "owner", Role.OWNER.value)
            return WorkspaceCreated(workspace_id=workspace_id,
                                    owner=MemberToken(member_id=member_id, member_token=token))

        return await self._serial(create)

    async def add_member(self, envelope: Envelope) -> MemberToken:
        await self._serial(lambda: self._member(envelope, owner=True))  # authenticate first
        body = parse(AddMember, envelope.body)
        refuse_personal_data(name=body.name)

        def add() -> MemberToken:
            owner = self._member(envelope, owner=True)
            member_id, token = self.store.add_member(owner.workspace_id, body.name, body.role.value)
            return MemberToken(member_id=member_id, member_token=token)

        return await self._serial(add)

    async def whoami(self, envelope: Envelope) -> Me:
        """The console's first call: the operator, or the member a member token names."""
        token = envelope.token or ""
        if self._admin.is_token(token):
            return Me(kind="operator")

        def member() -> Me:
            row = self.store.member_by_token(hash_token(token)) if token else None
            if row is None:
                raise UnauthenticatedError("a member token or the operator token is required")
            return Me(kind="member", workspace_id=row.workspace_id, member_id=row.member_id,
                      name=row.name, role=Role(row.role),
                      memory_spaces_enabled=row.memory_spaces_enabled)

        return await self._serial(member)

    async def list_members(self, envelope: Envelope) -> Members:
        def members() -> Members:
            owner = self._member(envelope, owner=True)
            return Members(members=[_view(row) for row in self.store.members(owner.workspace_id)])

        return await self._serial(members)

    async def list_credentials(self, envelope: Envelope) -> Credentials:
        def credentials() -> Credentials:
            owner = self._member(envelope, owner=True)
            names = self.store.credential_names(owner.workspace_id)
            return Credentials(credentials=[
                CredentialView(credential_id=c.credential_id,
                               name=names.get(c.credential_id, ""), member_id=c.member_id,
                               scopes=[Scope(s) for s in c.scopes],
                               context_set_id=c.context_set_id)
                for c in self.store.credentials(owner.workspace_id)])

        return await self._serial(credentials)

    async def patch_member(self, envelope: Envelope) -> MemberView:
        await self._serial(lambda: self._member(envelope, owner=True))  # authenticate first
        body = parse(PatchMember, envelope.body)

        def patch() -> MemberView:
            owner = self._member(envelope, owner=True)
            target = self.store.member(owner.workspace_id, envelope.params.get("memberId", ""))
            if target is None:
                raise NotFoundError("no such member")
            if body.role is not None:
                self.store.set_role(owner.workspace_id, target.member_id, body.role.value)
            if body.memory_spaces_enabled is not None:
                self.store.set_memory_spaces(target.member_id, body.memory_spaces_enabled)
            row = self.store.member(owner.workspace_id, target.member_id)
            assert row is not None
            return _view(row)

        view = await self._serial(patch)
        await self._changed()
        return view

    async def create_credential(self, envelope: Envelope) -> CredentialCreated:
        await self._serial(self._member, envelope)  # authenticate before revealing a context set
        body = parse(CreateCredential, envelope.body)
        if body.context_set_id is not None:
            scope = await self._registry.scope(envelope.params.get("wsId", ""),
                                                       body.context_set_id)
            if not scope.exists:
                raise NotFoundError("no such context set", {"field": "contextSetId"})
        refuse_personal_data(name=body.name)
        if len(set(body.scopes)) != len(body.scopes):
            raise ValidationFailedError("scopes must not repeat")

        def create() -> CredentialCreated:
            member = self._member(envelope)
            check_grantable(Role(member.role), body.scopes)
            credential_id, token = self.store.create_credential(
                member, body.name, [s.value for s in body.scopes], body.context_set_id)
            return CredentialCreated(credential_id=credential_id, token=token, scopes=body.scopes)

        return await self._serial(create)

    async def revoke_credential(self, envelope: Envelope) -> Done:
        def revoke() -> Done:
            member = self._member(envelope)
            credential = self.store.credential(member.workspace_id,
                                               envelope.params.get("credentialId", ""))
            if credential is None or (credential.member_id != member.member_id
                                      and member.role != Role.OWNER):
                raise NotFoundError("no such credential")
            self.store.revoke(credential.credential_id)
            return Done()

        done = await self._serial(revoke)
        await self._changed()
        return done

    async def get_settings(self, envelope: Envelope) -> WorkspaceSettings:
        def get() -> WorkspaceSettings:
            member = self._member(envelope)
            workspace = self.store.workspace(member.workspace_id)
            assert workspace is not None
            return _settings(workspace)

        return await self._serial(get)

    async def put_settings(self, envelope: Envelope) -> WorkspaceSettings:
        await self._serial(lambda: self._member(envelope, owner=True))  # authenticate first
        body = parse(SettingsUpdate, envelope.body)

        def put() -> WorkspaceSettings:
            owner = self._member(envelope, owner=True)
            self.store.update_settings(owner.workspace_id,
                                       agent_memories_enabled=body.agent_memories_enabled,
                                       retention_days=body.retention_days)
            workspace = self.store.workspace(owner.workspace_id)
            assert workspace is not None
            return _settings(workspace)

        settings = await self._serial(put)
        await self._changed()
        if body.retention_days is not None:
            self._sweep_soon()
        return settings

    # --- NATS credentials of agents (the embedded server's users) ---

    async def nats_agents(self, payload: bytes) -> NatsAgents:
        keys = await self._serial(self.store.nats_agents)
        return NatsAgents(agents=[NatsAgentKey(public_key=k, inbox_prefix=p) for k, p in keys])

    async def _apply_nats_agents(self) -> None:
        """Have the embedded server reload its users; answered once applied (else
        `UnavailableError`). Joined to an external NATS without a nats-authority, the operator
        manages that server's users instead."""
        try:
            await self._operations.reload_nats(await self.nats_agents(b""))
        except UnavailableError:
            if self._nats_authority:
                raise

    async def create_nats_agent(self, envelope: Envelope) -> NatsAgentCreated:
        self._operator(envelope.token)
        body = parse(CreateNatsAgent, envelope.body)
        refuse_personal_data(name=body.name)
        seed, public_key = new_agent_seed()
        agent_id, inbox_prefix = await self._serial(self.store.add_nats_agent, body.name,
                                                    public_key)
        try:
            await self._apply_nats_agents()
        except UnavailableError:
            # never issued: the server may not know it; a later reload drops it if it does
            await self._serial(self.store.revoke_nats_agent, agent_id)
            raise UnavailableError("the NATS server did not apply the new login; none was "
                                   "issued, try again") from None
        return NatsAgentCreated(agent_id=agent_id, seed=seed, inbox_prefix=inbox_prefix,
                                publish=[*PUBLIC_COMMANDS, *PARTITIONED_COMMANDS])

    async def revoke_nats_agent(self, envelope: Envelope) -> Done:
        self._operator(envelope.token)
        if not await self._serial(self.store.revoke_nats_agent, envelope.params.get("agentId", "")):
            raise NotFoundError("no such NATS agent")
        try:
            await self._apply_nats_agents()
        except UnavailableError:
            raise UnavailableError(
                "revoked, but the NATS server has not applied it yet; the next NATS login "
                "change or restart of memgate applies it") from None
        return Done()

    # --- what a member sees and deletes of their own memories; the owner's blind purge (§2.3).
    # These work while agent memories are disabled: they are the member's, not the agent's.

    async def list_own_memories(self, envelope: Envelope) -> ListResult:
        member = await self._serial(self._member, envelope)
        request = parse(ListRequest, envelope.body)
        query = StoreQuery(owner=Owner(tenant=member.workspace_id, subject_id=member.member_id),
                           namespace=request.namespace, key=request.key,
                           collection_id=request.collection_id, as_of=request.as_of,
                           limit=request.limit, cursor=request.cursor)
        return await self._storage.list(query)

    async def delete_own_memories(self, envelope: Envelope) -> ForgetResult:
        member = await self._serial(self._member, envelope)
        request = parse(DeleteOwnMemories, envelope.body)
        purge = StorePurge(tenant=member.workspace_id, subject_id=member.member_id,
                           memory_ids=request.memory_ids)
        return await self._storage.purge(purge)

    async def purge_workspace_memories(self, envelope: Envelope) -> ForgetResult:
        owner = await self._serial(lambda: self._member(envelope, owner=True))
        purge = StorePurge(tenant=owner.workspace_id)
        return await self._storage.purge(purge)
