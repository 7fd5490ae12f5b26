"""The registry actor: collections, documents, passages and context sets (SPEC §2.4, §3.3, §3.8).

Admin commands arrive on `mem.admin.registry.*` (the workspace owner's token or the operator's;
the directory says which). Governance and recall ask on `mem.int.registry.*`: citations are
resolved when a memory is remembered, and re-verified in one batched request per recall or list.
Changes are announced as events (`mem.evt.registry.*`, ids only), committed with the change in
the registry's outbox and relayed to JetStream (`registry-<seq>-<digest>` message ids).

The store and its in-memory mirror are touched only on the actor's worker thread (`Serial`),
reads included, as the directory actor does: handlers never read the mirror on the event loop.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from memgate.actors.keys import dumps
from memgate.bus.subjects import Admin
from memgate.bus import parse, subjects
from memgate.bus.streams import OutboxRelay
from memgate.contracts import Contract, Done, Envelope
from memgate.contracts.errors import ContextSetScopeRefusedError, NotFoundError
from memgate.contracts.events import CollectionDeleted, DocumentDeleted, DocumentUpserted
from memgate.contracts.internal import OwnerCheck
from memgate.contracts.registry import (
    CheckRemember, Citation, Citations, CollectionCreated, ContextSetIn, ContextSetSaved,
    CreateCollection, DocumentVersion, PutDocument, Scope, ScopeRequest, Verification, Verify,
)
from memgate.policy.entities import names_in
from memgate.policy.authorisation import refuse_personal_data
from memgate.ports.bus import Publisher, Requester
from memgate.ports.directory import BusDirectory
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Serial
from memgate.storage.directory import hash_token
from memgate.storage.registry import ContextSet, Document, RegistryStore, Workspace

AdminHandler = Callable[[Envelope], Awaitable[Contract]]


class RegistryActor(ActorBase):
    name = "registry"
    store = Opened[RegistryStore]()

    def __init__(self, *, path: Path, bus: Requester, publisher: Publisher) -> None:
        self._path = path
        self._directory = BusDirectory(bus)
        self._serial = Serial(self.name)
        self._dumps = dumps(self, self._serial)  # backups
        self._relay = OutboxRelay(publisher, prefix=self.name,
                                  pending=lambda: self._serial(self.store.pending_events),
                                  sent=lambda seq: self._serial(self.store.events_sent, seq))

    async def start(self) -> None:
        self.store = await self._serial(RegistryStore, self._path)
        await self._relay.start()  # publishes what a previous run committed but did not

    async def stop(self) -> None:
        await self._relay.stop()
        if (store := RegistryActor.store.take(self)) is not None:
            await self._serial.unreplicated(store.close)
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        admin: dict[str, AdminHandler] = {
            Admin.REGISTRY_COLLECTIONS_CREATE: self.create_collection,
            Admin.REGISTRY_COLLECTIONS_DELETE: self.delete_collection,
            Admin.REGISTRY_DOCUMENTS_PUT: self.put_document,
            Admin.REGISTRY_DOCUMENTS_DELETE: self.delete_document,
            Admin.REGISTRY_CONTEXT_SETS_SAVE: self.save_context_set,
        }
        internal = {"check_remember": self.check_remember, "scope": self.scope,
                    "verify": self.verify}
        return [*(Endpoint(subject, self._authorised(handler))
                  for subject, handler in admin.items()),
                *(Endpoint(subjects.registry(operation), handler)
                  for operation, handler in internal.items()),
                *self._dumps]

    def _authorised(self, handler: AdminHandler) -> Callable[[bytes], Awaitable[Contract]]:
        async def handle(payload: bytes) -> Contract:
            envelope = parse(Envelope, payload)
            check = OwnerCheck(token_hash=hash_token(envelope.token or ""),
                               workspace_id=envelope.params.get("wsId", ""))
            await self._directory.owner_check(check)
            return await handler(envelope)

        handle.__name__ = handler.__name__
        return handle

    # --- admin ---

    async def create_collection(self, envelope: Envelope) -> CollectionCreated:
        body = parse(CreateCollection, envelope.body)
        refuse_personal_data(name=body.name)
        workspace_id = envelope.params["wsId"]
        collection_id = await self._serial(self.store.create_collection, workspace_id, body.name)
        return CollectionCreated(collection_id=collection_id)

    async def delete_collection(self, envelope: Envelope) -> Done:
        workspace_id, collection_id = envelope.params["wsId"], envelope.params["collectionId"]

        def event(documents: list[str]) -> bytes:
            return CollectionDeleted(workspace_id=workspace_id, collection_id=collection_id,
                                     document_ids=documents).to_json()

        if not await self._serial(lambda: self.store.delete_collection(
                workspace_id, collection_id, event=event,
                event_subject=subjects.registry_event("collection_deleted"))):
            raise NotFoundError("no such collection")
        self._relay.wake()
        return Done()

    async def put_document(self, envelope: Envelope) -> DocumentVersion:
        body = parse(PutDocument, envelope.body)
        workspace_id, document_id = envelope.params["wsId"], envelope.params["documentId"]
        passages = [
            (p.passage_id, hashlib.sha256(p.text.encode()).hexdigest(),
             tuple((e.id, (e.name, *e.aliases)) for e in p.entities))
            for p in body.passages
        ]
        event = DocumentUpserted(workspace_id=workspace_id, document_id=document_id).to_json()

        def put() -> int:
            if not self.store.collection_exists(workspace_id, body.collection_id):
                raise NotFoundError("no such collection", {"field": "collectionId"})
            return self.store.put_document(
                workspace_id, document_id, collection_id=body.collection_id,
                expires_at=body.expires_at, restricted=body.restricted, passages=passages,
                event_subject=subjects.registry_event("doc_upserted"), event=event)

        version = await self._serial(put)
        self._relay.wake()
        return DocumentVersion(document_id=document_id, version=version)

    async def delete_document(self, envelope: Envelope) -> Done:
        workspace_id, document_id = envelope.params["wsId"], envelope.params["documentId"]
        event = DocumentDeleted(workspace_id=workspace_id, document_id=document_id).to_json()
        if not await self._serial(lambda: self.store.delete_document(
                workspace_id, document_id, event=event,
                event_subject=subjects.registry_event("doc_deleted"))):
            raise NotFoundError("no such document")
        self._relay.wake()
        return Done()

    async def save_context_set(self, envelope: Envelope) -> ContextSetSaved:
        body = parse(ContextSetIn, envelope.body)
        refuse_personal_data(name=body.name)
        workspace_id = envelope.params["wsId"]
        existing = envelope.params.get("contextSetId")

        def save() -> str:
            if existing is not None \
                    and existing not in self.store.workspace(workspace_id).context_sets:
                raise NotFoundError("no such context set")
            return self.store.save_context_set(workspace_id, existing, body.name,
                                               body.collection_ids, body.document_ids)

        return ContextSetSaved(context_set_id=await self._serial(save))

    # --- the rules ---

    @staticmethod
    def _live(ws: Workspace, document: Document | None) -> bool:
        now = datetime.now(UTC)
        return (document is not None and not document.deleted
                and ws.collections.get(document.collection_id) is False
                and (document.expires_at is None or document.expires_at > now))

    @staticmethod
    def _in_set(document: Document, bound: ContextSet | None) -> bool:
        return bound is None or (document.collection_id in bound.collection_ids
                                 or document.document_id in bound.document_ids)

    def _bound(self, ws: Workspace, context_set_id: str | None) -> ContextSet | None:
        if context_set_id is None:
            return None
        bound = ws.context_sets.get(context_set_id)
        if bound is None:  # the set was removed: a bound credential may touch nothing
            return ContextSet("", frozenset(), frozenset())
        return bound

    async def check_remember(self, payload: bytes) -> Citations:
        """The citations to store, once every passage is readable and inside the bound set."""
        return await self._serial(self._check_remember, parse(CheckRemember, payload))

    def _check_remember(self, request: CheckRemember) -> Citations:
        ws = self.store.workspace(request.workspace_id)
        bound = self._bound(ws, request.context_set_id)
        if request.collection_id is not None:
            if ws.collections.get(request.collection_id) is not False:
                raise NotFoundError("no such collection", {"field": "collectionId"})
            if bound is not None and request.collection_id not in bound.collection_ids:
                raise ContextSetScopeRefusedError("the collection is outside the bound context set")
        elif bound is not None and not request.passage_ids:
            raise ContextSetScopeRefusedError(
                "a credential bound to a context set remembers inside it: give a collectionId "
                "of the set, or citations")
        citations, unknown = [], []
        for passage_id in request.passage_ids:
            passage = ws.passages.get(passage_id)
            document = None if passage is None else ws.documents.get(passage.document_id)
            if passage is None or document is None or not self._live(ws, document) \
                    or document.restricted:
                unknown.append(passage_id)
                continue
            if not self._in_set(document, bound):
                raise ContextSetScopeRefusedError(
                    "a cited passage is outside the bound context set", {"passageId": passage_id})
            citations.append(Citation(passage_id=passage_id, document_id=document.document_id,
                                      version=document.version, sha256=passage.sha256))
        if unknown:  # unknown and unreadable look alike: never reveal which
            raise NotFoundError("some cited passages cannot be cited", {"passageIds": unknown})
        return Citations(citations=citations)

    async def scope(self, payload: bytes) -> Scope:
        return await self._serial(self._scope, parse(ScopeRequest, payload))

    def _scope(self, request: ScopeRequest) -> Scope:
        ws = self.store.workspace(request.workspace_id)
        bound = self._bound(ws, request.context_set_id)
        assert bound is not None
        return Scope(exists=request.context_set_id in ws.context_sets,
                     collection_ids=sorted(c for c in bound.collection_ids
                                           if ws.collections.get(c) is False),
                     document_ids=sorted(bound.document_ids))

    async def verify(self, payload: bytes) -> Verification:
        """Hide memories whose sources are gone or unreadable; flag changed sources; count the
        entities the query names among each memory's cited passages."""
        return await self._serial(self._verify, parse(Verify, payload))

    def _verify(self, request: Verify) -> Verification:
        ws = self.store.workspace(request.workspace_id)
        bound = self._bound(ws, request.context_set_id)
        hidden, changed, matches = [], [], {}
        for memory_id, citations in request.citations.items():
            state = "current"
            named: set[str] = set()
            for citation in citations:
                document = ws.documents.get(citation.document_id)
                if not self._live(ws, document) or document is None or document.restricted \
                        or not self._in_set(document, bound):
                    state = "hidden"
                    break
                passage = ws.passages.get(citation.passage_id)
                if (document.version != citation.version or passage is None
                        or passage.sha256 != citation.sha256):
                    state = "changed"
                if passage is not None and request.query:
                    named |= {e for e, names in passage.entities if names_in(request.query, names)}
            if state == "hidden":
                hidden.append(memory_id)
                continue
            if state == "changed":
                changed.append(memory_id)
            if named:
                matches[memory_id] = len(named)
        return Verification(hidden=hidden, changed=changed, entity_matches=matches)
