"""The REST adapter (FastAPI): a bus client that holds no state.

Every route turns its request into a bus command and the reply back into JSON; failures keep
the one error shape of SPEC §3.10 (`adapters.http_errors`). Bodies over the configured limit are
refused before they are read. Authentication comes first, as on the bus: a request FastAPI
refuses still goes to the bus, with a body every contract refuses, so the caller learns about
its credential (401/403/404) before it learns what is wrong with its input (400).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.telemetry import TelemetryConfig

from memgate.adapters.http_errors import (
    COMMON, REFUSED_BODY, BodyLimit, error_response, install_error_handlers, responses,
)
from memgate.adapters import console, rest_erasure, rest_mem0, rest_sessions, rest_spaces
from memgate.adapters import rest_metrics
from memgate.adapters.mcp_server import McpHttpEndpoint
from memgate.adapters.routing import token_of
from memgate.bus import BusClient, subjects
from memgate.bus.replies import Handler
from memgate.contracts import (
    AddMember, Contract, CreateCredential, CreateNatsAgent, CreateWorkspace, CredentialCreated,
    DeleteOwnMemories, Done, ForgetRequest, ForgetResult, ListRequest, ListResult, MemberToken,
    MemberView, MemgateError, NatsAgentCreated, PatchMember, RecallRequest, RecallResult,
    RememberRequest, RememberResult, SettingsUpdate, WorkspaceCreated, WorkspaceSettings,
)
from memgate.contracts.cluster import ClusterStatus
from memgate.contracts.backup import AuditVerified
from memgate.contracts.base import ID_MAX
from memgate.contracts.directory import Credentials, Me, Members
from memgate.contracts.errors import (
    UnauthenticatedError, ValidationFailedError,
)
from memgate.contracts.internal import Ready
from memgate.contracts.registry import (
    CollectionCreated, ContextSetIn, ContextSetSaved, CreateCollection, DocumentVersion,
    PutDocument,
)

log = logging.getLogger("memgate.rest")

T = TypeVar("T", bound=Contract)
E = TypeVar("E", bound=Callable[..., Any])
_bearer = HTTPBearer(auto_error=False, description="an agent credential or a member token")
Token = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
PathId = Annotated[str, Path(min_length=1, max_length=ID_MAX)]

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


# A ready actor answers in about a millisecond; a probe must not hang on one that is not.
READY_TIMEOUT_S = 2.0

# memgate exports no OpenTelemetry: with these off FastAPI stops asking the global providers
# whether to trace, on every request (docs/DECISIONS.md, "REST adapter CPU").
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False,
                                 "operation_spans": False}


def _problems(exc: RequestValidationError) -> list[dict[str, str]]:
    """What FastAPI found wrong, by field and rule (never the input, which may be personal)."""
    return [{"field": ".".join(str(p) for p in err["loc"][1:]) or str(err["loc"][0]),
             "problem": err["msg"]} for err in exc.errors()]


def create_app(nats_url: str, *, ready_subjects: list[str], timeout: float = 10.0,
               nats_options: dict[str, Any] | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               local: Mapping[str, Handler] | None = None) -> FastAPI:
    """The REST (and MCP) adapter. `local`: the commands an actor of this process answers,
    sent to it without the server (`BusClient`); everything else goes over the bus."""
    state: dict[str, BusClient] = {}
    mcp = McpHttpEndpoint()
    # route name → the bus command it sends, for routes whose bus handler parses a body
    commands: dict[str, tuple[str, type[Contract]]] = {}

    def command(subject: str, result: type[Contract]) -> Callable[[E], E]:
        def mark(endpoint: E) -> E:
            commands[endpoint.__name__] = (subject, result)
            return endpoint

        return mark

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["bus"] = await BusClient.connect(nats_url, name="memgate-rest", timeout=timeout,
                                               local=local, **(nats_options or {}))
        try:
            async with mcp.serving(state["bus"]):
                yield
        finally:
            await state["bus"].close()

    app = FastAPI(title="memgate", version="0.1.0", lifespan=lifespan,
                  description="Governed long-term memory for AI agents.", telemetry=NO_TELEMETRY)

    # The MCP tools (streamable HTTP): Starlette runs an ASGI app given as a route's endpoint.
    app.add_route("/mcp", mcp, include_in_schema=False)  # type: ignore[arg-type]
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    install_error_handlers(app)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        refusal = ValidationFailedError("the request is not valid", {"problems": _problems(exc)})
        token = token_of(request.headers.get("Authorization"))
        route = commands.get(getattr(request.scope.get("route"), "name", ""))
        if route is None:  # no body to refuse on the bus: these routes all need a credential
            return error_response(refusal if token else
                                  UnauthenticatedError("a credential is required"))
        subject, result = route
        try:
            await state["bus"].command(subject, token, REFUSED_BODY, result,
                                       params=dict(request.path_params), transport="rest")
        except ValidationFailedError:
            return error_response(refusal)
        except MemgateError as failure:
            return error_response(failure)
        log.error("the bus accepted a refused body on %s", subject)
        return error_response(refusal)

    async def call(subject: str, result: type[T], token: HTTPAuthorizationCredentials | None,
                   body: Contract | dict[str, Any], **params: str) -> T:
        credential = token.credentials if token else None
        return await state["bus"].command(subject, credential, body, result, params=params,
                                          transport="rest")

    async def send(subject: str, result: type[T], token: str | None,
                   body: Contract | dict[str, Any], **params: str) -> T:
        return await state["bus"].command(subject, token, body, result, params=params,
                                          transport="rest")

    @app.get("/healthz", tags=["operations"], responses=responses(503))
    async def healthz() -> JSONResponse:
        bus = state["bus"]
        replies = await asyncio.gather(
            *(bus.request(s, b"{}", Ready, timeout=READY_TIMEOUT_S) for s in ready_subjects),
            return_exceptions=True)
        names = [s.removeprefix("mem.int.ready.") for s in ready_subjects]
        waiting = [name for name, reply in zip(names, replies, strict=True)
                   if isinstance(reply, BaseException)]
        return JSONResponse({"status": "ok" if not waiting else "starting", "waiting": waiting,
                             "actors": {name: "waiting" if name in waiting else "ready"
                                        for name in names}},
                            status_code=200 if not waiting else 503)

    # --- agent memory operations (SPEC §3.1) ---

    @app.post("/api/agent/v1/memories/remember", tags=["memories"],
              responses=responses(*COMMON, 409, 429))
    @command(subjects.REMEMBER, RememberResult)
    async def remember(body: RememberRequest, token: Token) -> RememberResult:
        return await call(subjects.REMEMBER, RememberResult, token, body)

    @app.post("/api/agent/v1/memories/recall", tags=["memories"], responses=responses(*COMMON))
    @command(subjects.RECALL, RecallResult)
    async def recall(body: RecallRequest, token: Token) -> RecallResult:
        return await call(subjects.RECALL, RecallResult, token, body)

    @app.post("/api/agent/v1/memories/list", tags=["memories"], responses=responses(*COMMON))
    @command(subjects.LIST, ListResult)
    async def list_memories(body: ListRequest, token: Token) -> ListResult:
        return await call(subjects.LIST, ListResult, token, body)

    @app.post("/api/agent/v1/memories/forget", tags=["memories"], responses=responses(*COMMON))
    @command(subjects.FORGET, ForgetResult)
    async def forget(body: ForgetRequest, token: Token) -> ForgetResult:
        return await call(subjects.FORGET, ForgetResult, token, body)

    # --- admin and setup (SPEC §2.4) ---

    @app.post("/api/admin/workspaces", tags=["admin"], responses=responses(*COMMON))
    @command(subjects.admin("workspaces.create"), WorkspaceCreated)
    async def create_workspace(body: CreateWorkspace, token: Token) -> WorkspaceCreated:
        return await call(subjects.admin("workspaces.create"), WorkspaceCreated, token, body)

    @app.get("/api/me", tags=["admin"], responses=responses(*COMMON))
    async def whoami(token: Token) -> Me:
        """Who a member token or the operator token speaks for (the console's first call)."""
        return await call(subjects.admin("self.whoami"), Me, token, {})

    @app.get("/api/w/{wsId}/members", tags=["admin"], responses=responses(*COMMON))
    async def list_members(wsId: PathId, token: Token) -> Members:
        return await call(subjects.admin("members.list"), Members, token, {}, wsId=wsId)

    @app.post("/api/w/{wsId}/members", tags=["admin"], responses=responses(*COMMON))
    @command(subjects.admin("members.add"), MemberToken)
    async def add_member(wsId: PathId, body: AddMember, token: Token) -> MemberToken:
        return await call(subjects.admin("members.add"), MemberToken, token, body, wsId=wsId)

    @app.patch("/api/w/{wsId}/members/{memberId}", tags=["admin"], responses=responses(*COMMON))
    @command(subjects.admin("members.patch"), MemberView)
    async def patch_member(wsId: PathId, memberId: PathId, body: PatchMember,
                           token: Token) -> MemberView:
        return await call(subjects.admin("members.patch"), MemberView, token, body, wsId=wsId,
                          memberId=memberId)

    @app.get("/api/w/{wsId}/credentials", tags=["admin"], responses=responses(*COMMON))
    async def list_credentials(wsId: PathId, token: Token) -> Credentials:
        """The credentials that still work, never their tokens (shown once, at creation)."""
        return await call(subjects.admin("credentials.list"), Credentials, token, {}, wsId=wsId)

    @app.post("/api/w/{wsId}/credentials", tags=["admin"], responses=responses(*COMMON))
    @command(subjects.admin("credentials.create"), CredentialCreated)
    async def create_credential(wsId: PathId, body: CreateCredential,
                                token: Token) -> CredentialCreated:
        return await call(subjects.admin("credentials.create"), CredentialCreated, token, body,
                          wsId=wsId)

    @app.delete("/api/w/{wsId}/credentials/{credentialId}", tags=["admin"],
                responses=responses(*COMMON))
    async def revoke_credential(wsId: PathId, credentialId: PathId, token: Token) -> Done:
        return await call(subjects.admin("credentials.revoke"), Done, token, {}, wsId=wsId,
                          credentialId=credentialId)

    @app.get("/api/w/{wsId}/ask-history/settings", tags=["settings"],
             responses=responses(*COMMON))
    async def get_settings(wsId: PathId, token: Token) -> WorkspaceSettings:
        return await call(subjects.admin("settings.get"), WorkspaceSettings, token, {}, wsId=wsId)

    @app.put("/api/w/{wsId}/ask-history/settings", tags=["settings"],
             responses=responses(*COMMON))
    @command(subjects.admin("settings.put"), WorkspaceSettings)
    async def put_settings(wsId: PathId, body: SettingsUpdate, token: Token) -> WorkspaceSettings:
        return await call(subjects.admin("settings.put"), WorkspaceSettings, token, body, wsId=wsId)

    # --- the registry: collections, documents, context sets (owner or operator) ---

    @app.post("/api/w/{wsId}/collections", tags=["registry"], responses=responses(*COMMON))
    @command(subjects.admin("registry.collections.create"), CollectionCreated)
    async def create_collection(wsId: PathId, body: CreateCollection,
                                token: Token) -> CollectionCreated:
        return await call(subjects.admin("registry.collections.create"), CollectionCreated, token,
                          body, wsId=wsId)

    @app.delete("/api/w/{wsId}/collections/{collectionId}", tags=["registry"],
                responses=responses(*COMMON))
    async def delete_collection(wsId: PathId, collectionId: PathId, token: Token) -> Done:
        return await call(subjects.admin("registry.collections.delete"), Done, token, {},
                          wsId=wsId, collectionId=collectionId)

    @app.put("/api/w/{wsId}/documents/{documentId}", tags=["registry"],
             responses=responses(*COMMON))
    @command(subjects.admin("registry.documents.put"), DocumentVersion)
    async def put_document(wsId: PathId, documentId: PathId, body: PutDocument,
                           token: Token) -> DocumentVersion:
        return await call(subjects.admin("registry.documents.put"), DocumentVersion, token, body,
                          wsId=wsId, documentId=documentId)

    @app.delete("/api/w/{wsId}/documents/{documentId}", tags=["registry"],
                responses=responses(*COMMON))
    async def delete_document(wsId: PathId, documentId: PathId, token: Token) -> Done:
        return await call(subjects.admin("registry.documents.delete"), Done, token, {},
                          wsId=wsId, documentId=documentId)

    @app.post("/api/w/{wsId}/context-sets", tags=["registry"], responses=responses(*COMMON))
    @command(subjects.admin("registry.context_sets.save"), ContextSetSaved)
    async def create_context_set(wsId: PathId, body: ContextSetIn,
                                 token: Token) -> ContextSetSaved:
        return await call(subjects.admin("registry.context_sets.save"), ContextSetSaved, token,
                          body, wsId=wsId)

    @app.put("/api/w/{wsId}/context-sets/{contextSetId}", tags=["registry"],
             responses=responses(*COMMON))
    @command(subjects.admin("registry.context_sets.save"), ContextSetSaved)
    async def update_context_set(wsId: PathId, contextSetId: PathId, body: ContextSetIn,
                                 token: Token) -> ContextSetSaved:
        return await call(subjects.admin("registry.context_sets.save"), ContextSetSaved, token,
                          body, wsId=wsId, contextSetId=contextSetId)

    # --- a member's own agent memories, and the owner's blind purge (SPEC §2.3) ---

    @app.get("/api/w/{wsId}/ask-history/agent-memories", tags=["self-service"],
             responses=responses(*COMMON))
    @command(subjects.admin("self.list"), ListResult)
    async def list_own_memories(
            wsId: PathId, token: Token,
            limit: Annotated[int, Query(ge=1, le=100)] = 20,
            cursor: Annotated[str | None, Query(max_length=200)] = None,
            namespace: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    ) -> ListResult:
        body = {k: v for k, v in {"limit": limit, "cursor": cursor, "namespace": namespace}.items()
                if v is not None}
        return await call(subjects.admin("self.list"), ListResult, token, body, wsId=wsId)

    @app.delete("/api/w/{wsId}/ask-history/agent-memories", tags=["self-service"],
                responses=responses(*COMMON))
    @command(subjects.admin("self.delete"), ForgetResult)
    async def delete_own_memories(wsId: PathId, token: Token,
                                  body: DeleteOwnMemories | None = None) -> ForgetResult:
        return await call(subjects.admin("self.delete"), ForgetResult, token,
                          body or DeleteOwnMemories(), wsId=wsId)

    @app.delete("/api/w/{wsId}/ask-history/settings/agent-memories", tags=["settings"],
                responses=responses(*COMMON))
    async def purge_workspace_memories(wsId: PathId, token: Token) -> ForgetResult:
        """The owner deletes every member's agent memories without reading them (a count comes
        back). Members' memory spaces are not touched: a space goes with its own explicit call,
        `DELETE /memory/spaces/{spaceId}` by its owner, or with an erasure."""
        return await call(subjects.admin("owner.purge"), ForgetResult, token, {}, wsId=wsId)

    @app.get("/api/admin/cluster", tags=["admin"], responses=responses(*COMMON))
    async def cluster_status(token: Token) -> ClusterStatus:
        """The operator's view (SPEC §6): each store's home node, the node serving it, its
        epoch."""
        return await call(subjects.admin("cluster.status"), ClusterStatus, token, {})

    @app.post("/api/admin/audit/verify", tags=["admin"], responses=responses(*COMMON))
    async def verify_audit_log(token: Token) -> AuditVerified:
        """The operator checks the audit log's whole hash chain (SPEC §5.5)."""
        return await call(subjects.admin("audit.verify"), AuditVerified, token, {})

    @app.post("/api/admin/nats-agents", tags=["admin"], responses=responses(*COMMON))
    @command(subjects.admin("nats.create"), NatsAgentCreated)
    async def create_nats_agent(body: CreateNatsAgent, token: Token) -> NatsAgentCreated:
        return await call(subjects.admin("nats.create"), NatsAgentCreated, token, body)

    @app.delete("/api/admin/nats-agents/{agentId}", tags=["admin"],
                responses=responses(*COMMON))
    async def revoke_nats_agent(agentId: PathId, token: Token) -> Done:
        return await call(subjects.admin("nats.revoke"), Done, token, {}, agentId=agentId)

    # Last: a request is matched against the routes in order, and an included router is
    # costly to try (FastAPI walks each of its routes), so the agents' memory routes come first.
    # No path here overlaps another module's; among the modules the order matters
    # (`/memory/spaces` before `/memory/{spaceId}`) and is kept.
    for module in (rest_spaces, rest_sessions, rest_mem0, rest_erasure):
        app.include_router(module.router(send, command))
    app.include_router(rest_metrics.router(send))
    app.include_router(console.router())

    return app
