"""The governance actor: the front door of every agent command (SPEC §3.1, §3.2, §3.10).

Stateless, so any number run in one queue group. For each command on `mem.cmd.*`: resolve the
credential (directory), refuse what the workspace or role forbids, validate, mask, and only then
pass the command to the internal actor that does the work. The unmasked text goes no further.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol, TypeVar, cast
from datetime import UTC, datetime

from pydantic import JsonValue

from memgate.bus import parse, subjects
from memgate.bus.replies import Handler, reply_header
from memgate.bus.logins import PUBLIC_COMMANDS
from memgate.contracts import (
    Envelope, Failure, ForgetRequest, ForgetResult, ListRequest, ListResult, MemgateError,
    Principal, RecallRequest, RecallResult, RememberRequest, RememberResult, Scope,
)
from memgate.contracts.directory import MemberPrincipal, MemberRequest
from memgate.contracts.errors import (
    AgentMemoryEmptyError, ContextSetScopeRefusedError, ForbiddenError, RateLimitedError,
    UnauthenticatedError, ValidationFailedError,
)
from memgate.contracts.internal import (
    Owner, RecallQuery, StoreForget, StoreImport, StoreQuery, StoreRemember,
)
from memgate.contracts.memory import (
    ImportRefusal, ImportRequest, ImportResult, OperatorImportItem,
)
from memgate.contracts.registry import CheckRemember, Citation
from memgate.observe import tracing
from memgate.policy.authorisation import authorise, refuse_personal_data
from memgate.policy.citations import apply, cited
from memgate.policy.masking import mask
from memgate.ports.bus import Requester
from memgate.ports.directory import BusDirectory, Directory, PrincipalCache
from memgate.ports.registry import BusRegistry, Registry
from memgate.ports.storage import BusStorage, Storage
from memgate.ports.services import BusRecall
from memgate.runtime.actor import ActorBase, Endpoint, Listener, Operator
from memgate.storage.directory import hash_token
from memgate.policy.idempotency import digest

R = TypeVar("R", bound=RememberRequest)

QUEUE = "governance"
# Commands handled at once per process: each mostly waits on other actors (directory, storage),
# and one at a time would queue every agent behind the slowest of them.
CONCURRENCY = 256

# The credential the operator's imported versions are stored under.
OPERATOR_CREDENTIAL = "operator"

__all__ = ["GovernanceActor", "authorise", "refuse_personal_data"]


class Members(Protocol):
    async def member(self, request: MemberRequest) -> MemberPrincipal:
        """A member by id within a workspace (`NotFoundError` if there is none)."""
        ...


def _item(model: type[R], item: JsonValue) -> R:
    """An import's item read as `model`, refused as a remember body would be."""
    if not isinstance(item, dict):
        raise ValidationFailedError("the request is not valid", {"problems": [
            {"field": "item", "problem": "must be an object"}]})
    return parse(model, cast(dict[str, object], item))


class GovernanceActor(ActorBase):
    """`partition`: it takes the commands sent for that partition (`subjects.partitioned`), on
    the node that owns it. `partitions` (a cluster's count): each reply to a plain remember,
    list or forget names the agent's partition (`subjects.PARTITION_HEADER`), where its next
    ones go (docs/DECISIONS.md, "An agent's commands go to its partition's node")."""

    def __init__(self, *, directory: Directory, registry: Registry, storage: Storage,
                 recall: BusRecall, serves: Collection[str] = PUBLIC_COMMANDS,
                 partition: str | None = None, partitions: int | None = None,
                 members: Members | None = None,
                 admin_token: Callable[[], str] | None = None) -> None:
        self._directory = directory
        self._members = members
        self._operator = Operator(admin_token) if admin_token is not None else None
        self._operator_loaded = False
        self._registry = registry
        self._storage = storage
        self._recall = recall
        self._serves = frozenset(serves)
        self.partition = partition
        self._partitions = partitions
        self.name = "governance" if partition is None else f"governance.{partition}"

    @classmethod
    def on_bus(cls, bus: Requester, *, partitions: int,
               serves: Collection[str] = PUBLIC_COMMANDS, partition: str | None = None,
               names_partitions: bool = False,
               admin_token: Callable[[], str] | None = None) -> GovernanceActor:
        """Governance whose collaborators are the other actors, reached over `bus`; the
        principals it resolves are kept until the directory announces a change. It takes the
        public commands `serves` (for `partition`, if given); with `names_partitions`, its
        replies name the agent's partition. `admin_token`: the operator's, for its import."""
        return cls(directory=PrincipalCache(BusDirectory(bus)), registry=BusRegistry(bus),
                   storage=BusStorage(bus, partitions=partitions), recall=BusRecall(bus),
                   serves=serves, partition=partition,
                   partitions=partitions if names_partitions else None,
                   members=BusDirectory(bus), admin_token=admin_token)

    def _is_operator(self, token: str | None) -> bool:
        """The operator's token? Read at the first import that asks, not at start: a lone
        governance process (`memgate actors --only governance`) makes no token file."""
        if self._operator is None:
            return False
        if not self._operator_loaded:
            self._operator.load()
            self._operator_loaded = True
        return self._operator.is_token(token)

    def endpoints(self) -> list[Endpoint]:
        """The public commands it takes (`serves`): from the bus, and from the REST and MCP
        adapters of its process (which send the others over the bus)."""
        handlers = self.handlers()
        return [Endpoint(subject if self.partition is None
                         else subjects.partitioned(subject, self.partition),
                         handlers[subject], queue=QUEUE, max_workers=CONCURRENCY)
                for subject in self._serves]

    def handlers(self) -> dict[str, Handler]:
        """Every public command's handler, by subject (whether it `serves` it or not)."""
        return {subjects.REMEMBER: self.remember, subjects.RECALL: self.recall,
                subjects.LIST: self.list_memories, subjects.FORGET: self.forget,
                subjects.IMPORT: self.import_memories}

    def listeners(self) -> dict[str, Listener]:
        return {subjects.PRINCIPALS_CHANGED: self.directory_changed}  # heard by every process

    async def directory_changed(self, payload: bytes) -> None:
        self._directory.changed()

    async def _principal(self, envelope: Envelope, scope: Scope) -> Principal:
        if not envelope.token:
            raise UnauthenticatedError("a credential is required")
        principal = await self._directory.principal(hash_token(envelope.token))
        authorise(principal, scope)
        if self._partitions is not None:
            reply_header(subjects.PARTITION_HEADER,
                         subjects.partition_of(principal.workspace_id, self._partitions))
        return principal

    async def _scope(self, principal: Principal, collection_id: str | None) -> list[str] | None:
        """A bound credential's collections as its context set is now (None when unbound);
        an explicit collection outside the set is refused (SPEC §3.8)."""
        if principal.context_set_id is None:
            return None
        scope = await self._registry.scope(principal.workspace_id, principal.context_set_id)
        if collection_id is not None and collection_id not in scope.collection_ids:
            raise ContextSetScopeRefusedError("the collection is outside the bound context set")
        return scope.collection_ids

    @staticmethod
    def _owner(principal: Principal) -> Owner:
        return Owner(tenant=principal.workspace_id, subject_id=principal.member_id)

    async def remember(self, payload: bytes) -> RememberResult:
        with tracing.span("governance"):
            envelope = parse(Envelope, payload)
            principal = await self._principal(envelope, Scope.WRITE)
            command = await self._governed(principal, parse(RememberRequest, envelope.body))
        return await self._storage.remember(command)

    async def _governed(self, principal: Principal, request: RememberRequest, *,
                        created_at: datetime | None = None) -> StoreRemember:
        """A remember as storage takes it: names free of personal data, the text masked and
        not empty, citations checked; its idempotency key hashed (never sent on)."""
        refuse_personal_data(namespace=request.namespace, key=request.key)
        masked = mask(request.text)
        if masked.only_placeholders:
            raise AgentMemoryEmptyError("nothing is left of the text after masking",
                                        {"masked": masked.counts})
        citations: list[Citation] = []
        if request.collection_id or request.citations or principal.context_set_id:
            citations = await self._registry.check_remember(CheckRemember(
                workspace_id=principal.workspace_id,
                context_set_id=principal.context_set_id,
                collection_id=request.collection_id, passage_ids=request.citations))
        key = request.idempotency_key
        return StoreRemember(
            owner=self._owner(principal), credential_id=principal.credential_id,
            member_id=principal.member_id,
            namespace=request.namespace, key=request.key, collection_id=request.collection_id,
            text=masked.text, masked=masked.counts,
            retention_days=principal.settings.retention_days, citations=citations,
            idempotency=None if key is None else digest(key), created_at=created_at)

    async def import_memories(self, payload: bytes) -> ImportResult:
        """A bulk import: each item governed as a remember and refused alone, the others
        stored in one transaction (docs/DECISIONS.md, "Bulk import: per item"). With the
        operator token and a workspace, each item names its member and may keep its
        `createdAt`; such an import is counted by no hourly budget."""
        with tracing.span("governance"):
            envelope = parse(Envelope, payload)
            operator = self._is_operator(envelope.token)
            principal = None if operator else await self._principal(envelope, Scope.WRITE)
            request = parse(ImportRequest, envelope.body)
            if principal is not None and request.workspace_id is not None:
                raise ForbiddenError("only the operator's import names a workspace")
            if operator and request.workspace_id is None:
                raise ValidationFailedError("the operator's import names its workspace",
                                            {"field": "workspaceId"})
            governed: list[StoreRemember] = []
            at: list[int] = []  # each governed item's position in the request
            refused: list[ImportRefusal] = []
            members: dict[str, Principal | MemgateError] = {}
            for index, item in enumerate(request.items):
                try:
                    if principal is not None:
                        command = await self._governed(principal, _item(RememberRequest, item))
                    else:
                        command = await self._operator_item(request.workspace_id or "", item,
                                                            members)
                except MemgateError as refusal:
                    refused.append(ImportRefusal(index=index, error=Failure.of(refusal).error))
                    continue
                governed.append(command)
                at.append(index)
        result = (await self._storage.import_memories(StoreImport(items=governed,
                                                                  operator=operator))
                  if governed else ImportResult())
        stored = [m.model_copy(update={"index": at[m.index]}) for m in result.stored]
        refused += [r.model_copy(update={"index": at[r.index]}) for r in result.refused]
        if not stored and (budget := [r.error for r in result.refused
                                      if r.error.details.get("limit") == "importsPerHour"]):
            raise RateLimitedError(budget[0].message, budget[0].details)
        return ImportResult(stored=stored, refused=sorted(refused, key=lambda r: r.index))

    async def _operator_item(self, workspace_id: str, item: JsonValue,
                             members: dict[str, Principal | MemgateError]) -> StoreRemember:
        """An item of the operator's import, governed as a remember of its member (who must be
        allowed to write agent memories) made at its `createdAt` (not in the future)."""
        request = _item(OperatorImportItem, item)
        if request.created_at is not None and request.created_at > datetime.now(UTC):
            raise ValidationFailedError("createdAt must not be in the future",
                                        {"field": "createdAt"})
        if request.member_id not in members:
            members[request.member_id] = await self._member(workspace_id, request.member_id)
        member = members[request.member_id]
        if isinstance(member, MemgateError):
            raise member
        remember = RememberRequest.model_validate(
            request.model_dump(exclude={"member_id", "created_at"}))
        return await self._governed(member, remember, created_at=request.created_at)

    async def _member(self, workspace_id: str, member_id: str) -> Principal | MemgateError:
        """A member as the operator's import writes for it: with a write credential's rights,
        refused as such a credential would be (the workspace's settings, the member's role)."""
        assert self._members is not None
        try:
            member = await self._members.member(MemberRequest(workspace_id=workspace_id,
                                                              member_id=member_id))
            principal = Principal(
                workspace_id=member.workspace_id, member_id=member.member_id,
                credential_id=OPERATOR_CREDENTIAL, role=member.role,
                scopes=frozenset({Scope.WRITE}), settings=member.settings)
            authorise(principal, Scope.WRITE)
        except MemgateError as refusal:
            return refusal
        return principal

    async def list_memories(self, payload: bytes) -> ListResult:
        envelope = parse(Envelope, payload)
        principal = await self._principal(envelope, Scope.READ)
        request = parse(ListRequest, envelope.body)
        page = await self._storage.list(StoreQuery(
            owner=self._owner(principal), namespace=request.namespace, key=request.key,
            collection_id=request.collection_id,
            collection_ids=await self._scope(principal, request.collection_id),
            as_of=request.as_of, limit=request.limit, cursor=request.cursor))
        verdict = await self._registry.verify(principal.workspace_id, principal.context_set_id,
                                              cited(page.memories))
        return page.model_copy(update={"memories": apply(verdict, page.memories),
                                       "hidden": len(verdict.hidden)})

    async def forget(self, payload: bytes) -> ForgetResult:
        envelope = parse(Envelope, payload)
        principal = await self._principal(envelope, Scope.WRITE)
        request = parse(ForgetRequest, envelope.body)
        key = request.idempotency_key
        return await self._storage.forget(StoreForget(
            owner=self._owner(principal), memory_id=request.memory_id,
            namespace=request.namespace, key=request.key,
            collection_ids=await self._scope(principal, None),
            member_id=principal.member_id, idempotency=None if key is None else digest(key)))

    async def recall(self, payload: bytes) -> RecallResult:
        with tracing.span("governance"):
            envelope = parse(Envelope, payload)
            principal = await self._principal(envelope, Scope.READ)
            request = parse(RecallRequest, envelope.body)
            query = RecallQuery(
                owner=self._owner(principal), query=mask(request.query).text,
                namespace=request.namespace, collection_id=request.collection_id,
                collection_ids=await self._scope(principal, request.collection_id),
                context_set_id=principal.context_set_id, as_of=request.as_of,
                limit=request.limit)
        return await self._recall.recall(query)
