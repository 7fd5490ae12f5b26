"""The `memgate` command line: `memgate up` runs everything; `memgate admin …` calls the admin API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import uvicorn

from actors.settings import Settings
from actors.system import actor_names, start_actors
from adapters.rest import create_app
from bus import EmbeddedNats

app = typer.Typer(help="memgate: governed long-term memory for AI agents.", no_args_is_help=True)
admin = typer.Typer(help="Workspaces, members, credentials and settings (SPEC §2.4).",
                    no_args_is_help=True)
app.add_typer(admin, name="admin")


class _Server(uvicorn.Server):
    """uvicorn, minus its habit of re-raising Ctrl-C after shutdown: `serve` stops everything."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(settings: Settings) -> None:
    """Embedded nats-server (unless `--nats`), every actor, the REST adapter; Ctrl-C drains all."""
    async with AsyncExitStack() as stack:
        url = settings.nats_url
        if url is None:
            server = EmbeddedNats(settings.data_dir / "nats", port=settings.nats_port)
            url = (await stack.enter_async_context(server)).url
        await start_actors(settings, url, stack)
        api = create_app(url, ready_subjects=actor_names(settings),
                         timeout=settings.request_timeout_s)
        config = uvicorn.Config(api, host=settings.http_host, port=settings.http_port,
                                log_level="warning", timeout_graceful_shutdown=10)
        typer.echo(f"memgate: NATS {url}  HTTP http://{settings.http_host}:{settings.http_port}"
                   f"  data {settings.data_dir.resolve()}")
        server = _Server(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        await server.serve()
        typer.echo("memgate: draining and stopping")


@app.command()
def up(
    data_dir: Annotated[Path | None, typer.Option(help="where all state lives")] = None,
    http: Annotated[str | None, typer.Option(help="HOST:PORT of the REST adapter")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats", help="join this NATS instead")] = None,
) -> None:
    """Start memgate: nats-server (embedded), every actor and the REST adapter."""
    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if http is not None:
        overrides["http_host"], overrides["http_port"] = _host_port(http)
    if nats_url is not None:
        overrides["nats_url"] = nats_url
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(Settings(**overrides)))


# --- admin: the same calls as the REST admin API ---

Url = Annotated[str, typer.Option(envvar="MEMGATE_URL", help="memgate's HTTP address")]
TokenOpt = Annotated[str, typer.Option(envvar="MEMGATE_TOKEN", help="a member token")]


def _call(method: str, url: str, path: str, token: str | None, body: dict[str, Any] | None = None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.request(method, url.rstrip("/") + path, json=body, headers=headers, timeout=30)
    typer.echo(json.dumps(response.json(), indent=2))
    if response.is_error:
        raise typer.Exit(1)


@admin.command("create-workspace")
def create_workspace(name: str, url: Url = "http://127.0.0.1:8080",
                     non_retaining: bool = False) -> None:
    """Create a workspace and its owner (operator token from MEMGATE_ADMIN_TOKEN)."""
    token = os.environ.get("MEMGATE_ADMIN_TOKEN")
    _call("POST", url, "/api/admin/workspaces", token, {"name": name, "nonRetaining": non_retaining})


@admin.command("add-member")
def add_member(workspace: str, name: str, role: str, token: TokenOpt,
               url: Url = "http://127.0.0.1:8080") -> None:
    """Add a member with a role (viewer, editor, owner); owner token."""
    _call("POST", url, f"/api/w/{workspace}/members", token, {"name": name, "role": role})


@admin.command("set-role")
def set_role(workspace: str, member: str, role: str, token: TokenOpt,
             url: Url = "http://127.0.0.1:8080") -> None:
    """Change a member's role (takes effect at once); owner token."""
    _call("PATCH", url, f"/api/w/{workspace}/members/{member}", token, {"role": role})


@admin.command("create-credential")
def create_credential(workspace: str, name: str, token: TokenOpt,
                      scope: Annotated[list[str] | None, typer.Option()] = None,
                      url: Url = "http://127.0.0.1:8080") -> None:
    """Create an agent credential for yourself with scopes (memory:read, memory:write)."""
    _call("POST", url, f"/api/w/{workspace}/credentials", token,
          {"name": name, "scopes": scope or []})


@admin.command("revoke-credential")
def revoke_credential(workspace: str, credential: str, token: TokenOpt,
                      url: Url = "http://127.0.0.1:8080") -> None:
    """Revoke an agent credential at once."""
    _call("DELETE", url, f"/api/w/{workspace}/credentials/{credential}", token)


@admin.command("settings")
def settings(workspace: str, token: TokenOpt, url: Url = "http://127.0.0.1:8080",
             agent_memories: Annotated[bool | None, typer.Option(
                 "--agent-memories/--no-agent-memories")] = None,
             retention_days: int | None = None) -> None:
    """Show the workspace settings, or change them (owner token)."""
    changes = {k: v for k, v in {"agentMemoriesEnabled": agent_memories,
                                 "retentionDays": retention_days}.items() if v is not None}
    path = f"/api/w/{workspace}/ask-history/settings"
    _call("PUT" if changes else "GET", url, path, token, changes or None)


def main() -> None:
    app()
