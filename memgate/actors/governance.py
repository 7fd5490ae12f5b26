"""The governance actor: the front door of every agent command (SPEC §3.1, §3.2, §3.10).

Stateless, so any number run in one queue group. For each command on `mem.cmd.*`: resolve the
credential (directory), refuse what the workspace or role forbids, validate, mask, and only then
pass the command to the internal actor that does the work. The unmasked text goes no further.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from memgate.policy.masking import contains_personal_data, mask
from memgate.runtime.actor import partition_of, ready_route
from memgate.bus import BusClient, NatsRouter, parse, replying, subjects
from memgate.contracts import (
    Contract, Envelope, ForgetRequest, ForgetResult, ListRequest, ListResult, Principal,
    RecallRequest, RecallResult, RememberRequest, RememberResult, Scope,
)
from memgate.contracts.errors import (
    AgentMemoryDisabledError, AgentMemoryEmptyError, AgentMemoryPersonalDataError,
    ContextSetScopeRefusedError, InsufficientScopeError, NonRetainingWorkspaceError,
    UnauthenticatedError,
)
from memgate.contracts.internal import (
    Owner, PrincipalRequest, RecallQuery, StoreForget, StoreQuery, StoreRemember,
)
from memgate.ports.registry import reverify
from memgate.contracts.registry import CheckRemember, Citation, Citations, ScopeRequest
from memgate.contracts.registry import Scope as ContextScope
from memgate.storage.directory import hash_token

QUEUE = "governance"


def authorise(principal: Principal, scope: Scope) -> None:
    """The workspace and role rules of SPEC §2.1–§2.2, in the order a caller can fix them."""
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
    for name, value in fields.items():
        if value is not None and contains_personal_data(value):
            raise AgentMemoryPersonalDataError(f"{name} must not contain personal data",
                                               {"field": name})


class GovernanceActor:
    name = "governance"

    def __init__(self, *, bus: BusClient, partitions: int) -> None:
        self._bus = bus
        self._partitions = partitions

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def router(self) -> NatsRouter:
        router = NatsRouter()
        handlers: dict[str, Callable[[bytes], Awaitable[Contract]]] = {
            subjects.REMEMBER: self.remember, subjects.RECALL: self.recall,
            subjects.LIST: self.list_memories, subjects.FORGET: self.forget,
        }
        for subject, handler in handlers.items():
            router.subscriber(subject, queue=QUEUE)(replying(handler))
        ready_route(router, subjects.ready(self.name), self.name)
        return router

    async def _principal(self, envelope: Envelope, scope: Scope) -> Principal:
        if not envelope.token:
            raise UnauthenticatedError("a credential is required")
        principal = await self._bus.request(
            subjects.DIRECTORY_PRINCIPAL, PrincipalRequest(token_hash=hash_token(envelope.token)),
            Principal)
        authorise(principal, scope)
        return principal

    async def _scope(self, principal: Principal, collection_id: str | None) -> list[str] | None:
        """A bound credential's collections as its context set is now (None when unbound);
        an explicit collection outside the set is refused (SPEC §3.8)."""
        if principal.context_set_id is None:
            return None
        scope = await self._bus.request(subjects.registry("scope"), ScopeRequest(
            workspace_id=principal.workspace_id, context_set_id=principal.context_set_id),
            ContextScope)
        if collection_id is not None and collection_id not in scope.collection_ids:
            raise ContextSetScopeRefusedError("the collection is outside the bound context set")
        return scope.collection_ids

    def _store(self, principal: Principal, operation: str) -> str:
        return subjects.store(partition_of(principal.workspace_id, self._partitions), operation)

    @staticmethod
    def _owner(principal: Principal) -> Owner:
        return Owner(tenant=principal.workspace_id, subject_id=principal.member_id)

    async def remember(self, payload: bytes) -> RememberResult:
        envelope = parse(Envelope, payload)
        principal = await self._principal(envelope, Scope.WRITE)
        request = parse(RememberRequest, envelope.body)
        refuse_personal_data(namespace=request.namespace, key=request.key)
        masked = mask(request.text)
        if masked.only_placeholders:
            raise AgentMemoryEmptyError("nothing is left of the text after masking",
                                        {"masked": masked.counts})
        citations: list[Citation] = []
        if request.collection_id or request.citations or principal.context_set_id:
            citations = (await self._bus.request(subjects.registry("check_remember"), CheckRemember(
                workspace_id=principal.workspace_id, context_set_id=principal.context_set_id,
                collection_id=request.collection_id, passage_ids=request.citations),
                Citations)).citations
        command = StoreRemember(
            owner=self._owner(principal), credential_id=principal.credential_id,
            namespace=request.namespace, key=request.key, collection_id=request.collection_id,
            text=masked.text, masked=masked.counts,
            retention_days=principal.settings.retention_days, citations=citations)
        return await self._bus.request(self._store(principal, "remember"), command, RememberResult)

    async def list_memories(self, payload: bytes) -> ListResult:
        envelope = parse(Envelope, payload)
        principal = await self._principal(envelope, Scope.READ)
        request = parse(ListRequest, envelope.body)
        query = StoreQuery(owner=self._owner(principal), namespace=request.namespace,
                           key=request.key, collection_id=request.collection_id,
                           collection_ids=await self._scope(principal, request.collection_id),
                           as_of=request.as_of, limit=request.limit, cursor=request.cursor)
        page = await self._bus.request(self._store(principal, "list"), query, ListResult)
        shown, hidden = await reverify(self._bus, principal.workspace_id,
                                       principal.context_set_id, page.memories)
        return page.model_copy(update={"memories": shown, "hidden": hidden})

    async def forget(self, payload: bytes) -> ForgetResult:
        envelope = parse(Envelope, payload)
        principal = await self._principal(envelope, Scope.WRITE)
        request = parse(ForgetRequest, envelope.body)
        command = StoreForget(owner=self._owner(principal), memory_id=request.memory_id,
                              namespace=request.namespace, key=request.key,
                              collection_ids=await self._scope(principal, None))
        return await self._bus.request(self._store(principal, "forget"), command, ForgetResult)

    async def recall(self, payload: bytes) -> RecallResult:
        envelope = parse(Envelope, payload)
        principal = await self._principal(envelope, Scope.READ)
        request = parse(RecallRequest, envelope.body)
        query = RecallQuery(owner=self._owner(principal), query=mask(request.query).text,
                            namespace=request.namespace, collection_id=request.collection_id,
                            collection_ids=await self._scope(principal, request.collection_id),
                            context_set_id=principal.context_set_id,
                            as_of=request.as_of, limit=request.limit)
        return await self._bus.request(subjects.recall_internal(), query, RecallResult)
