"""The space-memories actor: the mem0-compatible API of a memory space (SPEC §4.4).

Stateless (in the `front` group beside governance; any number run in one queue group). For each
`mem.space.memories.<op>` command: the access check first (`mem.int.spaces.access`: CAN_VIEW to
read, CAN_UPDATE to add or update, CAN_DELETE to delete), then the mem0 body, masking, the
entities a filter names resolved to storage namespaces (`mem.int.spaces.scope`), and only then
storage (the partition's single writer) or recall (the same fused ranking as agent memories);
who the memories shown are about comes from `.entities`, for their namespaces only (a space's
whole entity map may not fit in one message).

A space's memories are stored under the owner `space-<spaceId>` of its workspace, in the
namespace of their entity, with the mem0 id as their `key`: an update is a new version of the
key, its history the key's versions, a delete removes every version. Each version names the
member who wrote it, whose version limit counts it (SPEC §3.9: one limit per member, across
their agent memories and every space). A new entity's row is written, pending, before its
memories are stored (an erasure finds it whatever happens next), and settled after
(`mem.int.spaces.settle`): an add that storage refuses leaves no entity.

With an LLM (the space has `llmModelName` and `llmBaseUrl`), `add` extracts facts through it
(`ports.llm`); the LLM sees masked text only. `mem.int.spacemem.extract` does the same for a
session's events (the sessions actor's extract_memories), the facts `derived_from` the events.
Both are all or nothing: an LLM failure stores nothing, and a store that fails half-way takes
back what it stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from memgate.bus import parse, subjects
from memgate.contracts import Contract, Envelope, Memory, RememberResult
from memgate.contracts.base import ID_MAX
from memgate.contracts.errors import (
    AgentMemoryEmptyError, ForbiddenError, MemgateError, NotFoundError, UnavailableError,
    UnprocessableError, ValidationFailedError,
)
from memgate.contracts.internal import (
    Owner, RecallQuery, StoreForget, StoreImport, StoreQuery, StoreRemember, StoreRememberAll,
    space_owner,
)
from memgate.contracts.memory import Extras
from memgate.contracts.reply import ErrorBody
from memgate.contracts.mem0 import (
    BATCH_MAX, MESSAGES_MAX, PAGE_SIZE_MAX, TEXT_MAX, AddMemories, Added, AddResults,
    BatchDelete, BatchUpdate, ExtractEvent, ExtractRequest, Extracted, History, HistoryEntry,
    ImportedMemory, ImportMemories, ImportOutcome, ImportResults, ListMemories, Mem0Memory,
    Mem0Message, MemoryPage, Message, Ping, SearchMemories, SearchResults, UpdateMemory,
)
from memgate.contracts.spaces import Entity, Permission, SpaceAccess, SpaceRole
from memgate.actors.space_entities import SpaceEntities
from memgate.actors.space_profiles import SpaceProfiles
from memgate.policy import extraction
from memgate.policy.imports import Imported, imported
from memgate.policy.masking import Masked, mask
from memgate.policy.mem0 import (
    FIELDS, compile_filters, derived_from, entity_of, query_filters,
)
from memgate.policy.metadata import (
    MemoryFilter, expiry_of, masked_metadata, memory_filter, shown_at,
)
from memgate.ports.bus import Requester
from memgate.policy import idempotency
from memgate.ports.llm import ChatModel, unavailable
from memgate.ports.profiles import BusProfileState
from memgate.ports.spaces import BusSpaces, Spaces
from memgate.ports.storage import BusStorage, Storage
from memgate.ports.services import BusRecall
from memgate.runtime.actor import ActorBase, Endpoint, enveloped

log = logging.getLogger("memgate.space-memories")
QUEUE = "space-memories"
CONCURRENCY = 128  # each command mostly waits on other actors (and the LLM)
READ_MAX = 10_000  # versions one get_all reads (a space holds at most the version limit)
HISTORY_MAX = 100  # versions one history walks back
DEFAULT_TOP_K = 10
EXTRACTED_RETENTION_DAYS = 365  # the longest; the workspace's retentionDays reaps sooner
ONE_MICROSECOND = timedelta(microseconds=1)
# The memories an add under an idempotency key may have stored: one per message or per fact.
ADDED_MAX = max(MESSAGES_MAX, extraction.FACTS_MAX)
B = TypeVar("B", bound=Contract)

__all__ = ["SpaceMemoriesActor"]


def _memory_id(envelope: Envelope) -> str:
    memory_id = envelope.params.get("memoryId", "")
    if not 1 <= len(memory_id) <= ID_MAX:
        raise NotFoundError("no such memory")
    return memory_id


def _body(model: type[B], envelope: Envelope) -> B:
    """The mem0 body, once the caller is known (the adapter marks one that was not JSON)."""
    if "refusedBody" in envelope.params:
        raise ValidationFailedError("the body is not a JSON object", {"field": "body"})
    return parse(model, envelope.body)


def _masked_lines(messages: list[Message]) -> list[str]:
    """What the space's LLM reads: "role: content", the content masked (the role is one of
    the four mem0 roles, checked by the contract)."""
    return [f"{m.role}: {mask(m.content).text}" for m in messages]


def _masked_texts(events: list[ExtractEvent]) -> list[str]:
    return [mask(e.text).text for e in events]


def _verbatim(messages: list[Message]) -> list[str]:
    """The messages stored as memories without an LLM (mem0's infer=False): each of at most
    TEXT_MAX characters, sizes checked before any is masked; system messages left out."""
    kept = [(index, m) for index, m in enumerate(messages) if m.role != "system"]
    for index, message in kept:
        if len(message.content) > TEXT_MAX:
            raise ValidationFailedError(
                f"a message stored verbatim is at most {TEXT_MAX} characters",
                {"field": f"messages.{index}.content"})
    texts: list[str] = []
    for _, message in kept:
        masked = mask(message.content)
        if not masked.only_placeholders:
            texts.append(masked.text)
    return texts


def _int_param(envelope: Envelope, name: str, default: int, high: int) -> int:
    raw = envelope.params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > 6 or not 1 <= int(raw) <= high:
        raise ValidationFailedError(f"{name} must be a whole number from 1 to {high}",
                                    {"field": name})
    return int(raw)


def _keyed(member_id: str, key_hash: str, count: int) -> list[str]:
    """The mem0 ids of the memories an add under an idempotency key stores, by place."""
    return [idempotency.keyed(member_id, key_hash, str(place)) for place in range(count)]


def _ids(entity: Entity | None) -> dict[str, Any]:
    """Who a memory is about, as mem0 shows it."""
    if entity is None:
        return {}
    return {"user_id": entity.user_id, "agent_id": entity.agent_id, "run_id": entity.run_id}


def _extras(memory: Memory) -> Extras:
    return memory.extras or Extras()


def _edited(extras: Extras | None) -> Extras | None:
    """The extras a new version keeps: all but an imported `updated_at` (the version's own
    instant is its updated_at)."""
    if extras is None or extras.updated_at is None:
        return extras
    kept = extras.model_copy(update={"updated_at": None})
    return None if kept == Extras() else kept


def _updated_at(memory: Memory) -> datetime:
    return _extras(memory).updated_at or memory.created_at


def _view(memory: Memory, entity: Entity | None, *, score: float | None = None) -> Mem0Memory:
    extras = _extras(memory)
    return Mem0Memory(id=memory.key or memory.memory_id, memory=memory.text, **_ids(entity),
                      metadata=extras.metadata, categories=extras.categories or [],
                      created_at=extras.timestamp or memory.created_at,
                      updated_at=_updated_at(memory), expiration_date=extras.expiration_date,
                      score=score)


def _imports(items: list[dict[str, Any]], now: datetime) -> list[Imported | ImportOutcome]:
    """Each item checked and masked (`policy.imports`), or its refusal; an id sent twice is
    refused the second time."""
    checked: list[Imported | ImportOutcome] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        field = f"memories.{index}"
        key = item.get("id") if isinstance(item.get("id"), str) else None
        try:
            memory = parse(ImportedMemory, item)
            if memory.id in seen:
                raise ValidationFailedError("an import names each memory once",
                                            {"field": f"{field}.id"})
            seen.add(memory.id)
            checked.append(imported(memory, now, field))
        except MemgateError as refused:
            checked.append(ImportOutcome(id=key, status="refused", code=refused.code,
                                         field=_field_of(refused, field)))
    return checked


def _refused_by(key: str, error: ErrorBody) -> ImportOutcome:
    """An item storage refused (a limit: it may be imported later)."""
    retry = error.details.get("retryAfterSeconds")
    return ImportOutcome(id=key, status="refused", code=str(error.code),
                         retry_after_seconds=retry if isinstance(retry, int) else None)


def _field_of(refused: MemgateError, item: str) -> str | None:
    """The field a refusal names (a parse names it within the item, `policy.imports` whole)."""
    named = refused.details.get("field")
    if isinstance(named, str):
        return named
    problems = refused.details.get("problems")
    if isinstance(problems, list) and problems and isinstance(problems[0], dict):
        return f"{item}.{problems[0].get('field')}"
    return None


def _added_extras(body: AddMemories, now: datetime) -> Extras | None:
    """What an add keeps beside the text: its metadata masked, its timestamp and expiry
    checked (the metadata is masked here: call off the event loop)."""
    extras = Extras(
        metadata=None if body.metadata is None else masked_metadata(body.metadata),
        timestamp=None if body.timestamp is None else shown_at(body.timestamp, now),
        expiration_date=(None if body.expiration_date is None
                         else expiry_of(body.expiration_date, now)))
    return None if extras == Extras() else extras


@dataclass(frozen=True)
class _Update:
    """One update, checked: the key's current version, its new text masked (None: kept) and
    its extras as they will be (the current ones when nothing of them changes)."""

    key: str
    current: Memory
    masked: Masked | None
    extras: Extras | None

    @property
    def changes(self) -> bool:
        return self.masked is not None or self.extras != _edited(self.current.extras)

    @property
    def text(self) -> str:
        return self.current.text if self.masked is None else self.masked.text


def _timed(update: _Update, body: UpdateMemory, now: datetime) -> _Update:
    """The update with the body's timestamp and expiration date, when it gives them
    (`expiration_date: null` clears the date: the retention alone applies)."""
    changes: dict[str, Any] = {}
    if body.timestamp is not None:
        changes["timestamp"] = shown_at(body.timestamp, now)
    if "expiration_date" in body.model_fields_set:
        changes["expiration_date"] = (None if body.expiration_date is None
                                      else expiry_of(body.expiration_date, now))
    if not changes:
        return update
    extras = (update.extras or Extras()).model_copy(update=changes)
    return replace(update, extras=None if extras == Extras() else extras)


def _masked_update(text: str | None, field: str) -> Masked | None:
    if text is None:
        return None
    masked = mask(text)
    if masked.only_placeholders:
        raise AgentMemoryEmptyError("nothing is left of the text after masking",
                                    {"masked": masked.counts, "field": field})
    return masked


def _unique(keys: list[str]) -> None:
    seen: set[str] = set()
    for index, key in enumerate(keys):
        if key in seen:
            raise ValidationFailedError("a batch names each memory once",
                                        {"field": f"memories.{index}.memory_id"})
        seen.add(key)


def _owner(workspace_id: str, space_id: str) -> Owner:
    return Owner(tenant=workspace_id, subject_id=space_owner(space_id))


@dataclass(frozen=True)
class _Writer:
    """Who writes a space's memories: the member whose version limit counts them (one
    member's across all their storage, SPEC §3.9), under the credential whose rate limit they
    take, `space-<spaceId>:<memberId>` (`…:lifecycle` for extract_memories)."""

    owner: Owner
    member_id: str
    credential_id: str
    retention_days: int
    derived_from: tuple[str, ...] = ()

    @classmethod
    def of(cls, workspace_id: str, space_id: str, member_id: str, retention_days: int, *,
           credential: str | None = None, derived_from: tuple[str, ...] = ()) -> _Writer:
        return cls(_owner(workspace_id, space_id), member_id,
                   f"{space_owner(space_id)}:{credential or member_id}", retention_days,
                   derived_from)

    def remember(self, namespace: str, key: str, text: str,
                 masked: dict[str, int] | None = None, extras: Extras | None = None,
                 ) -> StoreRemember:
        return StoreRemember(owner=self.owner, member_id=self.member_id,
                             credential_id=self.credential_id, namespace=namespace, key=key,
                             text=text, masked=masked or {}, retention_days=self.retention_days,
                             derived_from=list(self.derived_from), extras=extras)


class SpaceMemoriesActor(ActorBase):
    name = "space-memories"

    def __init__(self, *, bus: Requester, storage: Storage, chat: ChatModel,
                 extract_timeout_s: float | None = None) -> None:
        self._bus = bus
        self._recall = BusRecall(bus)
        self._spaces: Spaces = BusSpaces(bus)
        self._storage = storage
        self._chat = chat
        self._extract_timeout = extract_timeout_s
        self._profiles = SpaceProfiles(spaces=self._spaces, state=BusProfileState(bus),
                                       storage=storage, chat=chat)
        self._entity_calls = SpaceEntities(spaces=self._spaces, storage=storage,
                                           read_max=READ_MAX)

    @classmethod
    def on_bus(cls, bus: Requester, *, partitions: int, chat: ChatModel,
               extract_timeout_s: float | None = None) -> SpaceMemoriesActor:
        return cls(bus=bus, storage=BusStorage(bus, partitions=partitions), chat=chat,
                   extract_timeout_s=extract_timeout_s)

    async def start(self) -> None:
        await self._chat.start()

    async def stop(self) -> None:
        await self._profiles.stop()
        await self._chat.stop()

    def endpoints(self) -> list[Endpoint]:
        public: dict[str, Callable[[Envelope], Awaitable[Contract]]] = {
            "ping": self.ping, "add": self.add, "get": self.get, "list": self.list_memories,
            "search": self.search, "update": self.update, "delete": self.delete,
            "delete_all": self.delete_all, "history": self.history,
            "batch_update": self.batch_update, "batch_delete": self.batch_delete,
            "import": self.import_memories,
        }
        public.update(self._profiles.public())  # mem0 2.2's user profiles
        public.update(self._entity_calls.public())  # users(), delete_users(), reset()
        handlers = {**{subjects.space(f"memories.{operation}"): enveloped(handler)
                       for operation, handler in public.items()},
                    subjects.space_memories_internal("extract"): self.extract}
        return [Endpoint(subject, handler, queue=QUEUE, max_workers=CONCURRENCY)
                for subject, handler in handlers.items()]

    # --- who may do what, and about whom ---

    async def _access(self, envelope: Envelope, permission: Permission) -> SpaceAccess:
        return await self._spaces.access(envelope, permission)

    async def _entities(self, space_id: str, shown: Sequence[Memory]) -> dict[str, Entity]:
        """Who the memories shown are about, by namespace (only theirs: a space's whole
        entity map may not fit in one message)."""
        if not shown:
            return {}
        found = await self._spaces.entities(space_id, sorted({m.namespace for m in shown}))
        return {e.namespace: e for e in found if e.namespace}

    async def _scope(self, space_id: str, filters: dict[str, Any] | None) -> list[str] | None:
        """The namespaces a filter selects (None: no filter, the whole space), resolved by the
        spaces actor beside the entity map; a malformed filter is refused before any hop."""
        if compile_filters(filters) is None:
            return None
        assert filters is not None
        return await self._spaces.scope(space_id, filters)

    async def _selected(self, access: SpaceAccess, filters: dict[str, Any] | None,
                        ) -> tuple[list[Memory], list[str] | None]:
        """The space's current memories a filter selects, newest first (at most READ_MAX),
        and the namespaces they were read from (None: all). A filter on entities alone is
        resolved to namespaces beside the entity map; one on metadata (or with NOT) reads the
        memories of the namespaces its top-level entity conditions allow, and tests each
        against its entity and its (masked) metadata (`policy.metadata`)."""
        selecting = memory_filter(filters)
        allowed = await self._scope(access.space_id,
                                    filters if selecting is None else selecting.entities)
        if allowed is not None and not allowed:
            return [], allowed
        memories = (await self._storage.list(StoreQuery(
            owner=_owner(access.workspace_id, access.space_id), namespaces=allowed,
            limit=READ_MAX))).memories
        if selecting is not None:
            memories = await self._tested(access.space_id, selecting, memories)
        return memories, allowed

    async def _tested(self, space_id: str, selecting: MemoryFilter,
                      memories: list[Memory]) -> list[Memory]:
        entities = await self._entities(space_id, memories)
        return [m for m in memories
                if selecting.test(entities.get(m.namespace), _extras(m).metadata or {})]

    async def _current(self, owner: Owner, key: str, as_of: datetime | None = None,
                       ) -> Memory | None:
        page = await self._storage.list(StoreQuery(owner=owner, key=key, as_of=as_of, limit=1))
        return page.memories[0] if page.memories else None

    # --- storing, all or nothing ---

    async def _remember_about(self, space_id: str, entity: Entity, writer: _Writer,
                              texts: list[str], keys: list[str] | None = None,
                              extras: Extras | None = None,
                              ) -> list[tuple[str, RememberResult]]:
        """Each text a memory about `entity`, all or nothing. A new entity's row is written,
        pending, before the store, then settled (`mem.int.spaces.settle`): a refused add
        leaves no entity behind. A settle that fails leaves the row pending, which holds: the
        erasure finds it and reads show it with its memories (`storage.spaces`)."""
        issued = await self._spaces.entity(space_id, entity)
        assert issued.namespace is not None, "the spaces actor issues a namespace"

        async def settle(stored: bool) -> None:
            await self._spaces.settle(space_id, entity, stored=stored)

        try:
            stored = await self._remember_all(writer, issued.namespace, texts, keys, extras)
        except Exception:
            with contextlib.suppress(MemgateError):  # left pending, with no memories: unseen
                await settle(stored=False)
            raise
        try:
            await settle(stored=True)
        except MemgateError as error:  # the memories stand, their row stays pending
            log.warning("an entity of space %s stays pending (%s)", space_id, error.code)
        return stored

    async def _remember_all(self, writer: _Writer, namespace: str, texts: list[str],
                            keys: list[str] | None = None, extras: Extras | None = None,
                            ) -> list[tuple[str, RememberResult]]:
        """Each text a memory of its own (`keys`, else new mem0 ids), each with the same
        `extras`; if any is refused, those stored are forgotten again and the first refusal
        is raised."""
        keys = keys or [uuid.uuid4().hex for _ in texts]
        outcomes = await asyncio.gather(*(self._storage.remember(writer.remember(
            namespace, key, text, extras=extras)) for key, text in zip(keys, texts, strict=True)),
            return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if not failures:
            return [(k, o) for k, o in zip(keys, outcomes, strict=True)
                    if isinstance(o, RememberResult)]
        await self._forget(writer.owner, [k for k, o in zip(keys, outcomes, strict=True)
                                          if not isinstance(o, BaseException)])
        failure = failures[0]
        if isinstance(failure, MemgateError):
            raise failure
        raise UnavailableError("the memories could not be stored") from None

    async def _forget(self, owner: Owner, keys: list[str]) -> None:
        await asyncio.gather(*(self._storage.forget(StoreForget(owner=owner, key=key))
                               for key in keys), return_exceptions=True)

    async def _facts(self, model: str, base_url: str, lines: list[str],
                     timeout_s: float | None = None) -> list[str]:
        """Facts the space's LLM finds in the (masked) lines, masked again before use."""
        answer = await self._chat.complete(base_url, model, extraction.prompt(lines),
                                           timeout_s=timeout_s)
        try:
            found = extraction.facts(answer)
        except extraction.MalformedAnswerError:
            raise unavailable() from None  # as any other failure of the LLM reads
        texts: list[str] = []
        for fact in found:
            masked = mask(fact)
            if not masked.only_placeholders:
                texts.append(masked.text[:TEXT_MAX])
        return texts

    # --- the mem0 operations ---

    async def ping(self, envelope: Envelope) -> Ping:
        access = await self._access(envelope, Permission.CAN_VIEW)
        return Ping(org_id=access.workspace_id, project_id=access.space_id)

    async def add(self, envelope: Envelope) -> AddResults:
        """The messages' memories (the facts a model finds in them, or their masked text).
        Under an `Idempotency-Key`, the memories' ids are the member's, the key's and their
        place's (`_keyed`): a retry finds those the first add stored, answers with them and
        writes nothing (nor asks the model again); an add that stored nothing writes now."""
        access = await self._access(envelope, Permission.CAN_UPDATE)
        body = _body(AddMemories, envelope)
        entity = entity_of(body.filters, user_id=body.user_id, agent_id=body.agent_id,
                           run_id=body.run_id)
        key_hash = idempotency.key_hash(envelope.params)
        if key_hash is not None and (first := await self._first_added(
                _owner(access.workspace_id, access.space_id), access.member_id, key_hash)):
            entities = await self._entities(access.space_id, first)
            return AddResults(results=[
                Added(id=m.key or m.memory_id, memory=m.text, metadata=_extras(m).metadata,
                      **_ids(entities.get(m.namespace))) for m in first])
        now = datetime.now(UTC)
        extras = await asyncio.to_thread(_added_extras, body, now)  # masking: off the loop
        llm = access.llm_model_name and access.llm_base_url
        texts: list[str] = []
        if llm and body.infer is not False:
            assert access.llm_model_name and access.llm_base_url
            lines = await asyncio.to_thread(_masked_lines, body.messages)  # CPU: off the loop
            texts = await self._facts(access.llm_model_name, access.llm_base_url, lines)
        else:
            texts = await asyncio.to_thread(_verbatim, body.messages)
            if not texts:
                raise AgentMemoryEmptyError("nothing is left of the messages after masking")
        if not texts:
            return AddResults(results=[])
        stored = await self._remember_about(access.space_id, entity, _Writer.of(
            access.workspace_id, access.space_id, access.member_id, access.retention_days),
            texts, None if key_hash is None else _keyed(access.member_id, key_hash, len(texts)),
            extras=extras)
        return AddResults(results=[
            Added(id=key, memory=text, user_id=entity.user_id, agent_id=entity.agent_id,
                  run_id=entity.run_id, metadata=extras.metadata if extras else None)
            for (key, _), text in zip(stored, texts, strict=True)])

    async def _first_added(self, owner: Owner, member_id: str, key_hash: str) -> list[Memory]:
        """The memories an add under this key stored, in their order (none: no add did)."""
        found: list[Memory] = []
        for key in _keyed(member_id, key_hash, ADDED_MAX):
            if (current := await self._current(owner, key)) is None:
                break
            found.append(current)
        return found

    async def get(self, envelope: Envelope) -> Mem0Memory:
        access = await self._access(envelope, Permission.CAN_VIEW)
        owner = _owner(access.workspace_id, access.space_id)
        current = await self._current(owner, _memory_id(envelope))
        if current is None:
            raise NotFoundError("no such memory")
        entities = await self._entities(access.space_id, [current])
        return _view(current, entities.get(current.namespace))

    async def list_memories(self, envelope: Envelope) -> MemoryPage:
        access = await self._access(envelope, Permission.CAN_VIEW)
        body = _body(ListMemories, envelope)
        page = _int_param(envelope, "page", 1, 100_000)
        size = _int_param(envelope, "page_size", PAGE_SIZE_MAX, PAGE_SIZE_MAX)
        memories, _ = await self._selected(access, body.filters)
        shown = memories[(page - 1) * size: page * size]
        entities = await self._entities(access.space_id, shown)
        base = f"/memory/{access.space_id}/v3/memories/?page_size={size}&page="
        return MemoryPage(
            count=len(memories),
            next=f"{base}{page + 1}" if page * size < len(memories) else None,
            previous=f"{base}{page - 1}" if page > 1 else None,
            results=[_view(m, entities.get(m.namespace)) for m in shown])

    async def search(self, envelope: Envelope) -> SearchResults:
        access = await self._access(envelope, Permission.CAN_VIEW)
        body = _body(SearchMemories, envelope)
        chosen: list[str] | None = None  # the versions a metadata filter selects
        if memory_filter(body.filters) is not None:
            selected, allowed = await self._selected(access, body.filters)
            chosen = [m.memory_id for m in selected]
        else:
            allowed = await self._scope(access.space_id, body.filters)
        if (allowed is not None and not allowed) or chosen == []:
            return SearchResults(results=[])
        found = await self._recall.recall(RecallQuery(
            owner=_owner(access.workspace_id, access.space_id),
            query=mask(body.query).text, namespaces=allowed, memory_ids=chosen,
            limit=body.top_k or body.limit or DEFAULT_TOP_K))
        kept = [m for m in found.memories
                if body.threshold is None or m.score >= body.threshold]
        entities = await self._entities(access.space_id, kept)
        return SearchResults(
            results=[_view(m, entities.get(m.namespace), score=m.score) for m in kept],
            degraded=found.degraded)

    async def _checked(self, owner: Owner,
                       items: list[tuple[str, str | None, dict[str, Any] | None]],
                       fields: list[str]) -> list[_Update]:
        """Each (key, text, metadata) checked before anything is stored: the key's current
        version exists, the text keeps something once masked, the metadata is within its
        bounds (masking off the loop). Metadata given replaces the current one."""
        currents = await asyncio.gather(*(self._current(owner, key) for key, _, _ in items))
        for current, field in zip(currents, fields, strict=True):
            if current is None:
                raise NotFoundError("no such memory", {"field": field} if field else {})

        def masked() -> list[tuple[Masked | None, dict[str, Any] | None]]:
            return [(_masked_update(text, f"{field}.text" if field else "text"),
                     None if metadata is None else masked_metadata(
                         metadata, f"{field}.metadata" if field else "metadata"))
                    for (_, text, metadata), field in zip(items, fields, strict=True)]

        checked = await asyncio.to_thread(masked)
        updates: list[_Update] = []
        for (key, _, _), current, (text, metadata) in zip(items, currents, checked, strict=True):
            assert current is not None
            extras = _edited(current.extras)
            if metadata is not None:
                extras = (extras or Extras()).model_copy(update={"metadata": metadata})
            updates.append(_Update(key, current, text, extras))
        return updates

    async def _store_updates(self, access: SpaceAccess, updates: list[_Update],
                             ) -> list[RememberResult | None]:
        """Each update's new version, stored together (`remember_all`): if a version or rate
        limit refuses one, none is stored. None for an update that changes nothing."""
        writer = _Writer.of(access.workspace_id, access.space_id, access.member_id,
                            access.retention_days)
        writes = [writer.remember(u.current.namespace, u.key, u.text,
                                  u.masked.counts if u.masked else None, u.extras)
                  for u in updates if u.changes]
        if len(writes) == 1:  # a single update: group-committed with other remembers
            results = [await self._storage.remember(writes[0])]
        elif writes:
            results = (await self._storage.remember_all(StoreRememberAll(items=writes))).results
        else:
            results = []
        stored = iter(results)
        return [next(stored) if u.changes else None for u in updates]

    async def update(self, envelope: Envelope) -> Mem0Memory:
        access = await self._access(envelope, Permission.CAN_UPDATE)
        key = _memory_id(envelope)
        body = _body(UpdateMemory, envelope)
        owner = _owner(access.workspace_id, access.space_id)
        [update] = await self._checked(owner, [(key, body.text, body.metadata)], [""])
        update = _timed(update, body, datetime.now(UTC))
        entity = (await self._entities(access.space_id, [update.current])).get(
            update.current.namespace)
        [stored] = await self._store_updates(access, [update])
        if stored is None:  # nothing changes
            return _view(update.current, entity)
        updated = update.current.model_copy(update={
            "text": update.text, "memory_id": stored.memory_id, "extras": update.extras})
        return _view(updated, entity).model_copy(update={"updated_at": stored.created_at})

    async def batch_update(self, envelope: Envelope) -> Mem0Message:
        """mem0's batch_update: every item checked as a single update is, then all stored or
        none (each new version counts against the member's limits like a single update)."""
        access = await self._access(envelope, Permission.CAN_UPDATE)
        body = _body(BatchUpdate, envelope)
        keys = [item.memory_id for item in body.memories]
        _unique(keys)
        owner = _owner(access.workspace_id, access.space_id)
        updates = await self._checked(
            owner, [(item.memory_id, item.text, item.metadata) for item in body.memories],
            [f"memories.{index}" for index in range(len(keys))])
        await self._store_updates(access, updates)
        return Mem0Message(message=f"Successfully updated {len(updates)} memories")

    async def batch_delete(self, envelope: Envelope) -> Mem0Message:
        """mem0's batch_delete: every memory named must exist before any is deleted; all of
        their versions are then deleted together."""
        access = await self._access(envelope, Permission.CAN_DELETE)
        body = _body(BatchDelete, envelope)
        keys = [item.memory_id for item in body.memories]
        _unique(keys)
        owner = _owner(access.workspace_id, access.space_id)
        currents = await asyncio.gather(*(self._current(owner, key) for key in keys))
        for index, current in enumerate(currents):
            if current is None:
                raise NotFoundError("no such memory", {"field": f"memories.{index}.memory_id"})
        with contextlib.suppress(NotFoundError):  # deleted meanwhile: deleted all the same
            await self._storage.forget(StoreForget(owner=owner, keys=keys))  # one transaction
        return Mem0Message(message=f"Successfully deleted {len(keys)} memories")

    async def delete(self, envelope: Envelope) -> Mem0Message:
        """A delete sent again under its `Idempotency-Key` answers as the first did (not a
        404 for the memory it deleted): the forget's own record (`StoreForget.idempotency`)."""
        access = await self._access(envelope, Permission.CAN_DELETE)
        await self._storage.forget(StoreForget(
            owner=_owner(access.workspace_id, access.space_id),
            key=_memory_id(envelope), member_id=access.member_id,
            idempotency=idempotency.key_hash(envelope.params)))
        return Mem0Message(message="Memory deleted successfully!")

    async def delete_all(self, envelope: Envelope) -> Mem0Message:
        access = await self._access(envelope, Permission.CAN_DELETE)
        raw = envelope.params.get("filters")
        filters: dict[str, Any] = (query_filters(raw) if raw is not None else
                                   {k: envelope.params[k] for k in FIELDS
                                    if k in envelope.params})
        if not filters:
            raise ValidationFailedError(
                "give filters (user_id, agent_id or run_id) to delete memories",
                {"field": "filters"})
        owner = _owner(access.workspace_id, access.space_id)
        if memory_filter(filters) is None:
            allowed = await self._scope(access.space_id, filters)
            if allowed:
                with contextlib.suppress(NotFoundError):  # nothing left to delete
                    await self._storage.forget(StoreForget(owner=owner, namespaces=allowed))
            return Mem0Message(message="Memories deleted successfully!")
        selected, _ = await self._selected(access, filters)
        keys = sorted({m.key for m in selected if m.key is not None})
        for start in range(0, len(keys), BATCH_MAX):  # every version of each selected memory
            with contextlib.suppress(NotFoundError):  # deleted meanwhile
                await self._storage.forget(StoreForget(owner=owner,
                                                       keys=keys[start:start + BATCH_MAX]))
        return Mem0Message(message="Memories deleted successfully!")

    async def history(self, envelope: Envelope) -> History:
        access = await self._access(envelope, Permission.CAN_VIEW)
        key = _memory_id(envelope)
        owner = _owner(access.workspace_id, access.space_id)
        current = await self._current(owner, key)
        if current is None:
            raise NotFoundError("no such memory")
        entities = await self._entities(access.space_id, [current])
        chain = [current]  # newest first: each version was current just before the next
        while len(chain) < HISTORY_MAX:
            before = await self._current(owner, key, chain[-1].created_at - ONE_MICROSECOND)
            if before is None:
                break
            chain.append(before)
        chain.reverse()
        entity = entities.get(current.namespace)
        return History(entries=[HistoryEntry(
            id=version.memory_id, memory_id=key,
            old_memory=chain[i - 1].text if i else None, new_memory=version.text,
            event="UPDATE" if i else "ADD", **_ids(entity),
            metadata=_extras(version).metadata, categories=_extras(version).categories or [],
            created_at=_extras(chain[0]).timestamp or chain[0].created_at,
            updated_at=_updated_at(version))
            for i, version in enumerate(chain)])

    async def import_memories(self, envelope: Envelope) -> ImportResults:
        """memgate's own import of mem0 memories (`memgate import mem0`), a space owner's only
        (it keeps the memories' own timestamps): each checked and masked like an add, kept
        under its mem0 id; one whose id the space holds already is skipped, so an import run
        again stores nothing twice. The others go to storage's bulk import: one transaction,
        each stored or refused alone by the member's import budget (`MEMGATE_LIMIT_IMPORTS_
        PER_HOUR`, apart from their adds) and version limit."""
        access = await self._access(envelope, Permission.CAN_UPDATE)
        if access.role is not SpaceRole.OWNER:
            raise ForbiddenError("only an owner of the memory space imports memories",
                                 {"permission": "owner"})
        body = _body(ImportMemories, envelope)
        checked = await asyncio.to_thread(_imports, body.memories, datetime.now(UTC))
        fresh = [c for c in checked if isinstance(c, Imported)]
        there: set[str | None] = set()
        if fresh:  # one read for them all (their ids are unique: one current version each)
            there = {m.key for m in (await self._storage.list(StoreQuery(
                owner=_owner(access.workspace_id, access.space_id),
                keys=[c.key for c in fresh], limit=len(fresh)))).memories}
        todo = [c for c in fresh if c.key not in there]
        refused = await self._import(access, todo) if todo else {}
        return ImportResults(results=[
            c if isinstance(c, ImportOutcome) else
            ImportOutcome(id=c.key, status="skipped") if c.key in there else
            _refused_by(c.key, refused[c.key]) if c.key in refused else
            ImportOutcome(id=c.key, status="imported")
            for c in checked])

    async def _import(self, access: SpaceAccess, memories: list[Imported],
                      ) -> dict[str, ErrorBody]:
        """The memories stored in one transaction, each refused alone by a limit (by key);
        each entity's row written pending first, settled after (as `_remember_about` does)."""
        def who(entity: Entity) -> tuple[str | None, str | None, str | None]:
            return entity.user_id, entity.agent_id, entity.run_id

        entities = list({who(m.entity): m.entity for m in memories}.values())
        issued = await asyncio.gather(*(self._spaces.entity(access.space_id, e)
                                        for e in entities))
        namespaces = {who(e): i.namespace for e, i in zip(entities, issued, strict=True)}
        writer = _Writer.of(access.workspace_id, access.space_id, access.member_id,
                            access.retention_days)
        writes = []
        for memory in memories:
            namespace = namespaces[who(memory.entity)]
            assert namespace is not None, "the spaces actor issues a namespace"
            writes.append(writer.remember(namespace, memory.key, memory.text, memory.masked,
                                          memory.extras))

        async def settle(stored: set[tuple[str | None, str | None, str | None]]) -> None:
            outcomes = await asyncio.gather(*(self._spaces.settle(
                access.space_id, e, stored=who(e) in stored) for e in entities),
                return_exceptions=True)
            if any(isinstance(o, BaseException) for o in outcomes):  # the rows stay pending
                log.warning("entities of space %s stay pending", access.space_id)

        try:
            result = await self._storage.import_memories(StoreImport(items=writes))
        except Exception:
            await settle(set())
            raise
        refused = {memories[r.index].key: r.error for r in result.refused}
        await settle({who(m.entity) for m in memories if m.key not in refused})
        return refused

    # --- the sessions actor's extract_memories ---

    async def extract(self, payload: bytes) -> Extracted:
        """A session's masked events → facts (the space's LLM) → memories of the space, each
        `derived_from` the events. All or nothing; an LLM failure is UNAVAILABLE (retry)."""
        request = parse(ExtractRequest, payload)
        if not request.events:
            return Extracted(memory_ids=[])
        space = await self._spaces.llm(request.space_id)
        if not (space.llm_model_name and space.llm_base_url):
            raise UnprocessableError("the space has no LLM to extract memories with")
        if space.workspace_id != request.workspace_id:
            raise NotFoundError("no such memory space")
        events = sorted(request.events, key=lambda e: e.sequence_id)
        texts = await self._facts(space.llm_model_name, space.llm_base_url,
                                  await asyncio.to_thread(_masked_texts, events),
                                  self._extract_timeout)
        if not texts:
            return Extracted(memory_ids=[])
        entity = Entity(user_id=request.participants[0] if len(request.participants) == 1
                        else None, run_id=request.session_id)
        sources = [derived_from(request.session_id, e.sequence_id) for e in events]
        # The same events give the same keys: an extraction retried after the caller gave up
        # on one that did finish stores new versions of the same memories, not copies.
        run = hashlib.sha256("\n".join(sources).encode()).hexdigest()[:24]
        writer = _Writer.of(request.workspace_id, request.space_id,
                            request.member_id or space.created_by, EXTRACTED_RETENTION_DAYS,
                            credential="lifecycle", derived_from=tuple(sources))
        stored = await self._remember_about(
            request.space_id, entity, writer, texts,
            keys=[f"{run}{index:08x}" for index in range(len(texts))])
        return Extracted(memory_ids=[key for key, _ in stored])
