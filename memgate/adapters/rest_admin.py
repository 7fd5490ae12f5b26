"""REST routes: workspaces, members, credentials and settings (SPEC §2.4), the registry (SPEC
§3.3), a member's own agent memories and the owner's purge (SPEC §2.3), and the operator's cluster
view, audit check and agents' NATS logins. Bus clients only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memgate.adapters.http_errors import COMMON, responses
from memgate.adapters.routing import Mark, Send
from memgate.bus.subjects import Admin
from memgate.contracts import (
    AddMember, CreateCredential, CreateNatsAgent, CreateWorkspace, CredentialCreated,
    DeleteOwnMemories, Done, ForgetResult, ListResult, MemberToken, MemberView,
    NatsAgentCreated, PatchMember, SettingsUpdate, WorkspaceCreated, WorkspaceSettings,
)
from memgate.contracts.backup import AuditVerified
from memgate.contracts.base import ID_MAX
from memgate.contracts.cluster import ClusterStatus
from memgate.contracts.directory import Credentials, Me, Members
from memgate.contracts.registry import (
    CollectionCreated, ContextSetIn, ContextSetSaved, CreateCollection, DocumentVersion,
    PutDocument,
)

_bearer = HTTPBearer(auto_error=False, description="an agent credential or a member token")
Token = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
PathId = Annotated[str, Path(min_length=1, max_length=ID_MAX)]


def bearer(token: HTTPAuthorizationCredentials | None) -> str | None:
    return token.credentials if token else None


def router(send: Send, mark: Mark) -> APIRouter:
    """One router (an included router is walked route by route on every request: the parts add
    theirs to it, not routers of their own)."""
    routes = APIRouter()
    for part in (_setup, _registry, _self_service, _operator):
        part(routes, send, mark)
    return routes


def _setup(routes: APIRouter, send: Send, mark: Mark) -> None:
    """Workspaces, members, credentials and settings (SPEC §2.4)."""

    @routes.post("/api/admin/workspaces", tags=["admin"], responses=responses(*COMMON))
    @mark(Admin.WORKSPACES_CREATE, WorkspaceCreated)
    async def create_workspace(body: CreateWorkspace, token: Token) -> WorkspaceCreated:
        return await send(Admin.WORKSPACES_CREATE, WorkspaceCreated, bearer(token), body)

    @routes.get("/api/me", tags=["admin"], responses=responses(*COMMON))
    async def whoami(token: Token) -> Me:
        """Who a member token or the operator token speaks for (the console's first call)."""
        return await send(Admin.SELF_WHOAMI, Me, bearer(token), {})

    @routes.get("/api/w/{wsId}/members", tags=["admin"], responses=responses(*COMMON))
    async def list_members(wsId: PathId, token: Token) -> Members:
        return await send(Admin.MEMBERS_LIST, Members, bearer(token), {}, wsId=wsId)

    @routes.post("/api/w/{wsId}/members", tags=["admin"], responses=responses(*COMMON))
    @mark(Admin.MEMBERS_ADD, MemberToken)
    async def add_member(wsId: PathId, body: AddMember, token: Token) -> MemberToken:
        return await send(Admin.MEMBERS_ADD, MemberToken, bearer(token), body, wsId=wsId)

    @routes.patch("/api/w/{wsId}/members/{memberId}", tags=["admin"], responses=responses(*COMMON))
    @mark(Admin.MEMBERS_PATCH, MemberView)
    async def patch_member(wsId: PathId, memberId: PathId, body: PatchMember,
                           token: Token) -> MemberView:
        return await send(Admin.MEMBERS_PATCH, MemberView, bearer(token), body, wsId=wsId,
                          memberId=memberId)

    @routes.get("/api/w/{wsId}/credentials", tags=["admin"], responses=responses(*COMMON))
    async def list_credentials(wsId: PathId, token: Token) -> Credentials:
        """The credentials that still work, never their tokens (shown once, at creation)."""
        return await send(Admin.CREDENTIALS_LIST, Credentials, bearer(token), {}, wsId=wsId)

    @routes.post("/api/w/{wsId}/credentials", tags=["admin"], responses=responses(*COMMON))
    @mark(Admin.CREDENTIALS_CREATE, CredentialCreated)
    async def create_credential(wsId: PathId, body: CreateCredential,
                                token: Token) -> CredentialCreated:
        return await send(Admin.CREDENTIALS_CREATE, CredentialCreated, bearer(token), body,
                          wsId=wsId)

    @routes.delete("/api/w/{wsId}/credentials/{credentialId}", tags=["admin"],
                responses=responses(*COMMON))
    async def revoke_credential(wsId: PathId, credentialId: PathId, token: Token) -> Done:
        return await send(Admin.CREDENTIALS_REVOKE, Done, bearer(token), {}, wsId=wsId,
                          credentialId=credentialId)

    @routes.get("/api/w/{wsId}/ask-history/settings", tags=["settings"],
             responses=responses(*COMMON))
    async def get_settings(wsId: PathId, token: Token) -> WorkspaceSettings:
        return await send(Admin.SETTINGS_GET, WorkspaceSettings, bearer(token), {}, wsId=wsId)

    @routes.put("/api/w/{wsId}/ask-history/settings", tags=["settings"],
             responses=responses(*COMMON))
    @mark(Admin.SETTINGS_PUT, WorkspaceSettings)
    async def put_settings(wsId: PathId, body: SettingsUpdate, token: Token) -> WorkspaceSettings:
        return await send(Admin.SETTINGS_PUT, WorkspaceSettings, bearer(token), body, wsId=wsId)


def _registry(routes: APIRouter, send: Send, mark: Mark) -> None:
    """The registry: collections, documents, context sets (owner or operator)."""

    @routes.post("/api/w/{wsId}/collections", tags=["registry"], responses=responses(*COMMON))
    @mark(Admin.REGISTRY_COLLECTIONS_CREATE, CollectionCreated)
    async def create_collection(wsId: PathId, body: CreateCollection,
                                token: Token) -> CollectionCreated:
        return await send(Admin.REGISTRY_COLLECTIONS_CREATE, CollectionCreated, bearer(token),
                          body, wsId=wsId)

    @routes.delete("/api/w/{wsId}/collections/{collectionId}", tags=["registry"],
                responses=responses(*COMMON))
    async def delete_collection(wsId: PathId, collectionId: PathId, token: Token) -> Done:
        return await send(Admin.REGISTRY_COLLECTIONS_DELETE, Done, bearer(token), {},
                          wsId=wsId, collectionId=collectionId)

    @routes.put("/api/w/{wsId}/documents/{documentId}", tags=["registry"],
             responses=responses(*COMMON))
    @mark(Admin.REGISTRY_DOCUMENTS_PUT, DocumentVersion)
    async def put_document(wsId: PathId, documentId: PathId, body: PutDocument,
                           token: Token) -> DocumentVersion:
        return await send(Admin.REGISTRY_DOCUMENTS_PUT, DocumentVersion, bearer(token), body,
                          wsId=wsId, documentId=documentId)

    @routes.delete("/api/w/{wsId}/documents/{documentId}", tags=["registry"],
                responses=responses(*COMMON))
    async def delete_document(wsId: PathId, documentId: PathId, token: Token) -> Done:
        return await send(Admin.REGISTRY_DOCUMENTS_DELETE, Done, bearer(token), {},
                          wsId=wsId, documentId=documentId)

    @routes.post("/api/w/{wsId}/context-sets", tags=["registry"], responses=responses(*COMMON))
    @mark(Admin.REGISTRY_CONTEXT_SETS_SAVE, ContextSetSaved)
    async def create_context_set(wsId: PathId, body: ContextSetIn,
                                 token: Token) -> ContextSetSaved:
        return await send(Admin.REGISTRY_CONTEXT_SETS_SAVE, ContextSetSaved, bearer(token),
                          body, wsId=wsId)

    @routes.put("/api/w/{wsId}/context-sets/{contextSetId}", tags=["registry"],
             responses=responses(*COMMON))
    @mark(Admin.REGISTRY_CONTEXT_SETS_SAVE, ContextSetSaved)
    async def update_context_set(wsId: PathId, contextSetId: PathId, body: ContextSetIn,
                                 token: Token) -> ContextSetSaved:
        return await send(Admin.REGISTRY_CONTEXT_SETS_SAVE, ContextSetSaved, bearer(token),
                          body, wsId=wsId, contextSetId=contextSetId)


def _self_service(routes: APIRouter, send: Send, mark: Mark) -> None:
    """A member's own agent memories, and the owner's blind purge (SPEC §2.3)."""

    @routes.get("/api/w/{wsId}/ask-history/agent-memories", tags=["self-service"],
             responses=responses(*COMMON))
    @mark(Admin.SELF_LIST, ListResult)
    async def list_own_memories(
            wsId: PathId, token: Token,
            limit: Annotated[int, Query(ge=1, le=100)] = 20,
            cursor: Annotated[str | None, Query(max_length=200)] = None,
            namespace: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    ) -> ListResult:
        body = {k: v for k, v in {"limit": limit, "cursor": cursor, "namespace": namespace}.items()
                if v is not None}
        return await send(Admin.SELF_LIST, ListResult, bearer(token), body, wsId=wsId)

    @routes.delete("/api/w/{wsId}/ask-history/agent-memories", tags=["self-service"],
                responses=responses(*COMMON))
    @mark(Admin.SELF_DELETE, ForgetResult)
    async def delete_own_memories(wsId: PathId, token: Token,
                                  body: DeleteOwnMemories | None = None) -> ForgetResult:
        return await send(Admin.SELF_DELETE, ForgetResult, bearer(token),
                          body or DeleteOwnMemories(), wsId=wsId)

    @routes.delete("/api/w/{wsId}/ask-history/settings/agent-memories", tags=["settings"],
                responses=responses(*COMMON))
    async def purge_workspace_memories(wsId: PathId, token: Token) -> ForgetResult:
        """The owner deletes every member's agent memories without reading them (a count comes
        back). Members' memory spaces are not touched: a space goes with its own explicit call,
        `DELETE /memory/spaces/{spaceId}` by its owner, or with an erasure."""
        return await send(Admin.OWNER_PURGE, ForgetResult, bearer(token), {}, wsId=wsId)


def _operator(routes: APIRouter, send: Send, mark: Mark) -> None:
    """The operator's cluster view, audit check and agents' NATS logins."""

    @routes.get("/api/admin/cluster", tags=["admin"], responses=responses(*COMMON))
    async def cluster_status(token: Token) -> ClusterStatus:
        """The operator's view (SPEC §6): each store's home node, the node serving it, its
        epoch."""
        return await send(Admin.CLUSTER_STATUS, ClusterStatus, bearer(token), {})

    @routes.post("/api/admin/audit/verify", tags=["admin"], responses=responses(*COMMON))
    async def verify_audit_log(token: Token) -> AuditVerified:
        """The operator checks the audit log's whole hash chain (SPEC §5.5)."""
        return await send(Admin.AUDIT_VERIFY, AuditVerified, bearer(token), {})

    @routes.post("/api/admin/nats-agents", tags=["admin"], responses=responses(*COMMON))
    @mark(Admin.NATS_CREATE, NatsAgentCreated)
    async def create_nats_agent(body: CreateNatsAgent, token: Token) -> NatsAgentCreated:
        return await send(Admin.NATS_CREATE, NatsAgentCreated, bearer(token), body)

    @routes.delete("/api/admin/nats-agents/{agentId}", tags=["admin"],
                responses=responses(*COMMON))
    async def revoke_nats_agent(agentId: PathId, token: Token) -> Done:
        return await send(Admin.NATS_REVOKE, Done, bearer(token), {}, agentId=agentId)


__all__ = ["Token", "bearer", "router"]
