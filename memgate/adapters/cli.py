"""The `memgate` command line: `memgate up` runs everything; `memgate admin …` calls the admin API."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from memgate.app.settings import Settings
from memgate.app.serve import run_actors, serve
from memgate.adapters.mcp_server import serve_stdio

app = typer.Typer(help="memgate: governed long-term memory for AI agents.", no_args_is_help=True)
admin = typer.Typer(help="Workspaces, members, credentials and settings (SPEC §2.4).",
                    no_args_is_help=True)
app.add_typer(admin, name="admin")


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port)


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


@app.command("mcp")
def mcp_stdio(
    nats_url: Annotated[str, typer.Option("--nats", envvar="MEMGATE_NATS_URL",
                                          help="the NATS memgate runs on")] = "nats://127.0.0.1:4222",
    token: Annotated[str | None, typer.Option(envvar="MEMGATE_TOKEN",
                                              help="the agent credential")] = None,
    nats_seed: Annotated[str | None, typer.Option(
        envvar="MEMGATE_NATS_SEED", help="the agent's NATS NKey seed (admin nats-credential)")] = None,
    inbox_prefix: Annotated[str | None, typer.Option(
        envvar="MEMGATE_NATS_INBOX_PREFIX", help="the inbox prefix that goes with the seed")] = None,
) -> None:
    """Serve the memory tools to an MCP client over stdin/stdout (stdout carries only MCP)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    options: dict[str, Any] = {}
    if nats_seed is not None:
        options["nkeys_seed_str"] = nats_seed
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    try:
        asyncio.run(serve_stdio(nats_url, token, nats_options=options))
    except KeyboardInterrupt:
        pass
    except TimeoutError:  # the URL may hold a password: not echoed
        typer.echo("memgate mcp: cannot connect to NATS (unreachable, or login refused)", err=True)
        raise typer.Exit(1) from None


@app.command()
def actors(
    only: Annotated[str, typer.Option(help="comma-separated actor names, e.g. governance,recall")],
    nats_url: Annotated[str, typer.Option("--nats", envvar="MEMGATE_NATS_URL",
                                          help="the NATS that memgate runs on")],
    data_dir: Annotated[Path | None, typer.Option(help="state of stateful actors")] = None,
) -> None:
    """Run more actors against a running memgate (internal login from MEMGATE_NATS_PASSWORD)."""
    overrides: dict[str, Any] = {"nats_url": nats_url}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    asyncio.run(run_actors(Settings(**overrides), frozenset(only.split(","))))


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


@admin.command("nats-credential")
def nats_credential(name: str, url: Url = "http://127.0.0.1:8080") -> None:
    """Issue an agent's NATS login (NKey seed and inbox prefix; operator token)."""
    token = os.environ.get("MEMGATE_ADMIN_TOKEN")
    _call("POST", url, "/api/admin/nats-agents", token, {"name": name})


@admin.command("revoke-nats-credential")
def revoke_nats_credential(agent_id: str, url: Url = "http://127.0.0.1:8080") -> None:
    """Revoke an agent's NATS login at once (operator token)."""
    token = os.environ.get("MEMGATE_ADMIN_TOKEN")
    _call("DELETE", url, f"/api/admin/nats-agents/{agent_id}", token)


@admin.command("request")
def request(method: str, path: str, body: Annotated[str | None, typer.Argument()] = None,
            token: Annotated[str | None, typer.Option(envvar="MEMGATE_TOKEN")] = None,
            url: Url = "http://127.0.0.1:8080") -> None:
    """Any admin call, e.g. `request PUT /api/w/WS/documents/DOC '{"collectionId": ...}'`
    (member token from --token/MEMGATE_TOKEN, else the operator's MEMGATE_ADMIN_TOKEN)."""
    _call(method.upper(), url, path, token or os.environ.get("MEMGATE_ADMIN_TOKEN"),
          json.loads(body) if body else None)


def main() -> None:
    app()
