"""The REST adapter (FastAPI): a bus client that holds no state.

Every route turns its request into a bus command and the reply back into JSON; failures keep
the one error shape of SPEC §3.10.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import nats
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memgate.adapters.mcp_server import McpHttpEndpoint
from memgate.bus import BusClient, subjects
from memgate.contracts import (
    AddMember, Contract, CreateCredential, CreateNatsAgent, CreateWorkspace, DeleteOwnMemories,
    NatsAgentCreated, CredentialCreated, Done,
    ForgetRequest, ForgetResult, ListRequest, ListResult, MemberToken, MemberView, MemgateError,
    PatchMember, RecallRequest, RecallResult, RememberRequest, RememberResult, SettingsUpdate,
    WorkspaceCreated, WorkspaceSettings,
)
from memgate.contracts.errors import ErrorCode, ValidationFailedError
from memgate.contracts.internal import Ready
from memgate.contracts.registry import (
    CollectionCreated, ContextSetIn, ContextSetSaved, CreateCollection, DocumentVersion,
    PutDocument,
)

T = TypeVar("T", bound=Contract)
_bearer = HTTPBearer(auto_error=False, description="an agent credential or a member token")
Token = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def error_response(exc: MemgateError) -> JSONResponse:
    headers = {}
    if exc.code is ErrorCode.AGENT_MEMORY_RATE_LIMITED:
        headers["Retry-After"] = str(exc.details.get("retryAfterSeconds", 60))
    body = {"error": {"code": exc.code.value, "message": exc.message, "details": exc.details}}
    return JSONResponse(body, status_code=exc.status, headers=headers)


def create_app(nats_url: str, *, ready_subjects: list[str], timeout: float = 10.0,
               nats_options: dict[str, Any] | None = None) -> FastAPI:
    state: dict[str, BusClient] = {}
    mcp = McpHttpEndpoint()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nc = await nats.connect(nats_url, name="memgate-rest", **(nats_options or {}))
        state["bus"] = BusClient(nc, timeout=timeout)
        try:
            async with mcp.serving(state["bus"]):
                yield
        finally:
            await nc.drain()

    app = FastAPI(title="memgate", version="0.1.0", lifespan=lifespan,
                  description="Governed long-term memory for AI agents.")

    app.add_route("/mcp", mcp, include_in_schema=False)  # the MCP tools (streamable HTTP)

    @app.exception_handler(MemgateError)
    async def on_memgate_error(request: Request, exc: MemgateError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{"field": ".".join(str(p) for p in err["loc"][1:]), "problem": err["msg"]}
                    for err in exc.errors()]
        return error_response(ValidationFailedError("the request is not valid",
                                                    {"problems": problems}))

    async def call(subject: str, result: type[T], token: HTTPAuthorizationCredentials | None,
                   body: Contract | dict[str, Any], **params: str) -> T:
        credential = token.credentials if token else None
        return await state["bus"].command(subject, credential, body, result, params=params)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> JSONResponse:
        bus = state["bus"]
        replies = await asyncio.gather(
            *(bus.request(s, b"{}", Ready, timeout=2.0) for s in ready_subjects),
            return_exceptions=True)
        waiting = [s.removeprefix("mem.int.ready.")
                   for s, r in zip(ready_subjects, replies, strict=True) if isinstance(r, BaseException)]
        status = 200 if not waiting else 503
        return JSONResponse({"status": "ok" if not waiting else "starting", "waiting": waiting},
                            status_code=status)

    # --- agent memory operations (SPEC §3.1) ---

    @app.post("/api/agent/v1/memories/remember", tags=["memories"])
    async def remember(body: RememberRequest, token: Token) -> RememberResult:
        return await call(subjects.REMEMBER, RememberResult, token, body)

    @app.post("/api/agent/v1/memories/recall", tags=["memories"])
    async def recall(body: RecallRequest, token: Token) -> RecallResult:
        return await call(subjects.RECALL, RecallResult, token, body)

    @app.post("/api/agent/v1/memories/list", tags=["memories"])
    async def list_memories(body: ListRequest, token: Token) -> ListResult:
        return await call(subjects.LIST, ListResult, token, body)

    @app.post("/api/agent/v1/memories/forget", tags=["memories"])
    async def forget(body: ForgetRequest, token: Token) -> ForgetResult:
        return await call(subjects.FORGET, ForgetResult, token, body)

    # --- admin and setup (SPEC §2.4) ---

    @app.post("/api/admin/workspaces", tags=["admin"])
    async def create_workspace(body: CreateWorkspace, token: Token) -> WorkspaceCreated:
        return await call(subjects.admin("workspaces.create"), WorkspaceCreated, token, body)

    @app.post("/api/w/{wsId}/members", tags=["admin"])
    async def add_member(wsId: str, body: AddMember, token: Token) -> MemberToken:  # noqa: N803
        return await call(subjects.admin("members.add"), MemberToken, token, body, wsId=wsId)

    @app.patch("/api/w/{wsId}/members/{memberId}", tags=["admin"])
    async def patch_member(wsId: str, memberId: str, body: PatchMember,  # noqa: N803
                           token: Token) -> MemberView:
        return await call(subjects.admin("members.patch"), MemberView, token, body, wsId=wsId, memberId=memberId)

    @app.post("/api/w/{wsId}/credentials", tags=["admin"])
    async def create_credential(wsId: str, body: CreateCredential,  # noqa: N803
                                token: Token) -> CredentialCreated:
        return await call(subjects.admin("credentials.create"), CredentialCreated, token, body, wsId=wsId)

    @app.delete("/api/w/{wsId}/credentials/{credentialId}", tags=["admin"])
    async def revoke_credential(wsId: str, credentialId: str, token: Token) -> Done:  # noqa: N803
        return await call(subjects.admin("credentials.revoke"), Done, token, {}, wsId=wsId, credentialId=credentialId)

    @app.get("/api/w/{wsId}/ask-history/settings", tags=["settings"])
    async def get_settings(wsId: str, token: Token) -> WorkspaceSettings:  # noqa: N803
        return await call(subjects.admin("settings.get"), WorkspaceSettings, token, {}, wsId=wsId)

    @app.put("/api/w/{wsId}/ask-history/settings", tags=["settings"])
    async def put_settings(wsId: str, body: SettingsUpdate,  # noqa: N803
                           token: Token) -> WorkspaceSettings:
        return await call(subjects.admin("settings.put"), WorkspaceSettings, token, body, wsId=wsId)

    # --- the registry: collections, documents, context sets (owner or operator) ---

    @app.post("/api/w/{wsId}/collections", tags=["registry"])
    async def create_collection(wsId: str, body: CreateCollection,  # noqa: N803
                                token: Token) -> CollectionCreated:
        return await call(subjects.admin("registry.collections.create"), CollectionCreated, token,
                          body, wsId=wsId)

    @app.delete("/api/w/{wsId}/collections/{collectionId}", tags=["registry"])
    async def delete_collection(wsId: str, collectionId: str, token: Token) -> Done:  # noqa: N803
        return await call(subjects.admin("registry.collections.delete"), Done, token, {},
                          wsId=wsId, collectionId=collectionId)

    @app.put("/api/w/{wsId}/documents/{documentId}", tags=["registry"])
    async def put_document(wsId: str, documentId: str, body: PutDocument,  # noqa: N803
                           token: Token) -> DocumentVersion:
        return await call(subjects.admin("registry.documents.put"), DocumentVersion, token, body,
                          wsId=wsId, documentId=documentId)

    @app.delete("/api/w/{wsId}/documents/{documentId}", tags=["registry"])
    async def delete_document(wsId: str, documentId: str, token: Token) -> Done:  # noqa: N803
        return await call(subjects.admin("registry.documents.delete"), Done, token, {},
                          wsId=wsId, documentId=documentId)

    @app.post("/api/w/{wsId}/context-sets", tags=["registry"])
    async def create_context_set(wsId: str, body: ContextSetIn,  # noqa: N803
                                 token: Token) -> ContextSetSaved:
        return await call(subjects.admin("registry.context_sets.save"), ContextSetSaved, token,
                          body, wsId=wsId)

    @app.put("/api/w/{wsId}/context-sets/{contextSetId}", tags=["registry"])
    async def update_context_set(wsId: str, contextSetId: str, body: ContextSetIn,  # noqa: N803
                                 token: Token) -> ContextSetSaved:
        return await call(subjects.admin("registry.context_sets.save"), ContextSetSaved, token,
                          body, wsId=wsId, contextSetId=contextSetId)

    # --- a member's own agent memories, and the owner's blind purge (SPEC §2.3) ---

    @app.get("/api/w/{wsId}/ask-history/agent-memories", tags=["self-service"])
    async def list_own_memories(wsId: str, token: Token, limit: int = 20,  # noqa: N803
                                cursor: str | None = None,
                                namespace: str | None = None) -> ListResult:
        body = {k: v for k, v in {"limit": limit, "cursor": cursor, "namespace": namespace}.items()
                if v is not None}
        return await call(subjects.admin("self.list"), ListResult, token, body, wsId=wsId)

    @app.delete("/api/w/{wsId}/ask-history/agent-memories", tags=["self-service"])
    async def delete_own_memories(wsId: str, token: Token,  # noqa: N803
                                  body: DeleteOwnMemories | None = None) -> ForgetResult:
        return await call(subjects.admin("self.delete"), ForgetResult, token,
                          body or DeleteOwnMemories(), wsId=wsId)

    @app.delete("/api/w/{wsId}/ask-history/settings/agent-memories", tags=["settings"])
    async def purge_workspace_memories(wsId: str, token: Token) -> ForgetResult:  # noqa: N803
        return await call(subjects.admin("owner.purge"), ForgetResult, token, {}, wsId=wsId)

    @app.post("/api/admin/nats-agents", tags=["admin"])
    async def create_nats_agent(body: CreateNatsAgent, token: Token) -> NatsAgentCreated:
        return await call(subjects.admin("nats.create"), NatsAgentCreated, token, body)

    @app.delete("/api/admin/nats-agents/{agentId}", tags=["admin"])
    async def revoke_nats_agent(agentId: str, token: Token) -> Done:  # noqa: N803
        return await call(subjects.admin("nats.revoke"), Done, token, {}, agentId=agentId)

    return app
