"""The `memgate` command line: `memgate up` runs everything; `memgate admin …` the admin API."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from memgate.app.settings import Settings
from memgate.app.logins import internal_logins
from memgate.adapters import cli_backup, cli_erasure, import_mem0

# An admin call is a few DuckDB writes, but a workspace's first call may wait for a cold start.
ADMIN_CALL_TIMEOUT_S = 30.0


class ClientSettings(BaseSettings):
    """What the command line reads from the environment when a flag is not given: the same
    `MEMGATE_*` names as the server's `Settings`, seen from the client's side."""

    model_config = SettingsConfigDict(env_prefix="MEMGATE_", frozen=True, extra="ignore")

    # memgate's HTTP address and NATS; None: where the memgate running on `data_dir` said it
    # listens (`app.datadir`), else http://127.0.0.1:8080 and nats://127.0.0.1:4222
    url: str | None = None
    token: SecretStr | None = None  # a member token (admin) or an agent credential (mcp)
    admin_token: SecretStr | None = None  # the operator's token
    data_dir: Path = Path(".memgate")  # the data directory of the memgate the commands talk to
    nats_url: str | None = None
    nats_seed: SecretStr | None = None  # an agent's NATS NKey seed
    nats_inbox_prefix: str | None = None


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def base_url(given: str | None = None) -> str:
    """memgate's HTTP address for an admin command: --url, MEMGATE_URL, where the memgate
    running on MEMGATE_DATA_DIR (default .memgate) serves, http://127.0.0.1:8080."""
    from memgate.app.datadir import http_of

    env = ClientSettings()
    return http_of(env.data_dir, given or env.url)


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
    workers: Annotated[int | None, typer.Option(
        min=1, help="processes of each stateless kind: REST + governance, recall "
                    "(env MEMGATE_WORKERS)")] = None,
    single_process: Annotated[bool | None, typer.Option(
        "--single-process/--processes",
        help="every actor in this one process (env MEMGATE_SINGLE_PROCESS)")] = None,
    nats_port: Annotated[int | None, typer.Option(
        help="the embedded nats-server's client port (env MEMGATE_NATS_PORT)")] = None,
    node: Annotated[str | None, typer.Option(
        help="this node's name in a cluster (env MEMGATE_NODE; default: the host's name)")] = None,
    cluster: Annotated[str | None, typer.Option(
        help="HOST:PORT where this node's nats-server takes the other nodes' routes "
             "(env MEMGATE_CLUSTER)")] = None,
    routes: Annotated[str | None, typer.Option(
        help="every node's route, comma-separated: nats://HOST:PORT,... (env MEMGATE_ROUTES)",
    )] = None,
) -> None:
    """Start memgate: nats-server (embedded), every actor and the REST adapter, the actors in
    supervised processes (a crashed one is restarted); Ctrl-C stops everything. With --cluster
    and --routes, one node of a cluster (README, "Many machines")."""
    overrides: dict[str, Any] = {}
    if nats_port is not None:
        overrides["nats_port"] = nats_port
    if node is not None:
        overrides["node"] = node
    if cluster is not None:
        overrides["cluster"] = cluster
    if routes is not None:
        overrides["routes"] = [route.strip() for route in routes.split(",") if route.strip()]
    if bool(overrides.get("cluster")) != bool(overrides.get("routes")):
        raise typer.BadParameter("give both --cluster and --routes", param_hint="--cluster")
    if workers is not None:
        overrides["workers"] = workers
    if single_process is not None:
        overrides["single_process"] = single_process
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if http is not None:
        overrides["http_host"], overrides["http_port"] = _host_port(http)
    if nats_url is not None:
        overrides["nats_url"] = nats_url
    settings = Settings(**overrides)
    cli_backup.readable(settings.data_dir, migrates=True)  # before the actors' code even loads
    from memgate.app.datadir import StartRefusedError
    from memgate.app.ram import RamDirectoryError
    from memgate.app.serve import serve  # the actors, REST and MCP: for this command only
    from memgate.app.supervisor import ChildFailedError
    from memgate.contracts.errors import UnavailableError  # OwnedElsewhereError, a cluster

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        asyncio.run(serve(settings))
    except (ChildFailedError, StartRefusedError, RamDirectoryError,
            UnavailableError) as failed:
        typer.echo(f"memgate: {failed}", err=True)
        raise typer.Exit(1) from None


@app.command("mcp")
def mcp_stdio(
    nats_url: Annotated[str | None, typer.Option(
        "--nats", help="the NATS memgate runs on (env MEMGATE_NATS_URL; default: the one of the "
                       "memgate running on MEMGATE_DATA_DIR, else nats://127.0.0.1:4222)",
    )] = None,
    token: Annotated[str | None, typer.Option(
        help="the agent credential (env MEMGATE_TOKEN)")] = None,
    nats_seed: Annotated[str | None, typer.Option(
        help="the agent's NATS NKey seed (admin nats-credential) (env MEMGATE_NATS_SEED)")] = None,
    inbox_prefix: Annotated[str | None, typer.Option(
        help="the inbox prefix that goes with the seed (env MEMGATE_NATS_INBOX_PREFIX)")] = None,
) -> None:
    """Serve the memory tools to an MCP client over stdin/stdout (stdout carries only MCP)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    env = ClientSettings()
    from memgate.app.datadir import nats_of

    nats_url = nats_of(env.data_dir, nats_url or env.nats_url)
    token = token or _secret(env.token)
    nats_seed = nats_seed or _secret(env.nats_seed)
    inbox_prefix = inbox_prefix or env.nats_inbox_prefix
    options: dict[str, Any] = {}
    if nats_seed is not None:
        options["nkeys_seed_str"] = nats_seed
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    from memgate.adapters.mcp_server import serve_stdio  # the MCP SDK: for this command only

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
    nats_url: Annotated[str | None, typer.Option(
        "--nats", help="the NATS that memgate runs on (env MEMGATE_NATS_URL)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="state of stateful actors")] = None,
) -> None:
    """Run more actors against a running memgate (internal login from MEMGATE_NATS_PASSWORD)."""
    overrides: dict[str, Any] = {}
    if nats_url is not None:
        overrides["nats_url"] = nats_url
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    settings = Settings(**overrides)
    if settings.nats_url is None:
        raise typer.BadParameter("give --nats or MEMGATE_NATS_URL", param_hint="--nats")
    cli_backup.readable(settings.data_dir)  # a newer format: refused before any actor opens it
    from memgate.app.serve import run_actors
    from memgate.contracts.errors import UnavailableError  # OwnedElsewhereError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        asyncio.run(run_actors(settings, frozenset(only.split(","))))
    except UnavailableError as refused:
        typer.echo(f"memgate actors: {refused}", err=True)
        raise typer.Exit(1) from None


@app.command("nats-login")
def nats_login(
    kind: Annotated[str, typer.Argument(help="the actor kind, e.g. governance or recall")],
    data_dir: Annotated[Path | None, typer.Option(help="the data directory of memgate up")] = None,
) -> None:
    """Print the NATS login of one actor kind of the embedded server, as environment variables,
    for `memgate actors --only KIND` on another machine (the secret is shown on request only)."""
    settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
    if not (settings.data_dir / "nats" / "internal.secret").exists():
        raise typer.BadParameter(f"no memgate has run on {settings.data_dir}",
                                 param_hint="--data-dir")
    logins = internal_logins(settings)
    if kind not in logins:
        raise typer.BadParameter(f"one of {', '.join(sorted(logins))}", param_hint="KIND")
    typer.echo(f"MEMGATE_NATS_USER={logins[kind].user}")
    typer.echo(f"MEMGATE_NATS_PASSWORD={logins[kind].password}")


cluster = typer.Typer(help="Many machines: who keeps and serves each store (SPEC §6).",
                      no_args_is_help=True)
app.add_typer(cluster, name="cluster")


@cluster.command("status")
def cluster_status(
    data_dir: Annotated[Path | None, typer.Option(help="the data directory of memgate up")] = None,
) -> None:
    """Each single-writer actor: its home node, the node and process serving it, its epoch,
    and each standby as its owner sees it (in sync, batches behind, units not yet applied)."""
    settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
    if not (settings.data_dir / "nats" / "internal.secret").exists():
        raise typer.BadParameter(f"no memgate has run on {settings.data_dir}",
                                 param_hint="--data-dir")
    from rich.console import Console
    from rich.table import Table

    from memgate.app.cluster import status

    shown = asyncio.run(status(settings))
    table = Table("store", "home", "served by", "epoch", "process", "standbys")
    for store in shown.stores:
        standbys = ", ".join(
            f"{s.node} {'in sync' if s.in_sync else 'copying'}"
            f"{f' {s.behind} behind' if s.behind else ''}"
            for s in store.standbys or [])
        standbys = ", ".join(filter(None, [standbys, *(f"{node} kept (every acknowledged write)"
                                                       for node in store.kept)]))
        table.add_row(store.name, store.home or "-", store.served_by or "nobody",
                      "-" if store.epoch is None else str(store.epoch), store.process or "-",
                      standbys or "-")
    console = Console()
    console.print(table)
    console.print("servers: " + (", ".join(
        f"{s.name} {'up' if s.up else 'DOWN'}{' (leader)' if s.leader else ''}"
        for s in shown.servers) or "-"))
    if shown.degraded:
        console.print("not readable now: " + ", ".join(shown.degraded))


@cluster.command("drain")
def cluster_drain(
    node: Annotated[str, typer.Argument(help="the node to empty, e.g. n1")],
    data_dir: Annotated[Path | None, typer.Option(help="the data directory of memgate up")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each store")] = 60.0,
) -> None:
    """Hand every store that NODE serves over to an in-sync standby on another node, one
    after another, with progress; then NODE can be stopped without a lost write."""
    settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
    if not (settings.data_dir / "nats" / "internal.secret").exists():
        raise typer.BadParameter(f"no memgate has run on {settings.data_dir}",
                                 param_hint="--data-dir")
    from memgate.app.cluster import drain

    left = asyncio.run(drain(settings, node, timeout_s=timeout, say=typer.echo))
    if left:
        typer.echo(f"memgate: still on {node}: {', '.join(left)}", err=True)
        raise typer.Exit(1)


# --- admin: the same calls as the REST admin API ---

Url = Annotated[str | None, typer.Option(
    help="memgate's HTTP address (env MEMGATE_URL; default: the one of the memgate running on "
         "MEMGATE_DATA_DIR, else http://127.0.0.1:8080)")]
TokenOpt = Annotated[str | None, typer.Option(help="a member token (env MEMGATE_TOKEN)")]


def _member(token: str | None) -> str | None:
    return token or _secret(ClientSettings().token)


def _operator() -> str | None:
    return _secret(ClientSettings().admin_token)


def _call(method: str, url: str | None, path: str, token: str | None,
          body: dict[str, Any] | None = None) -> None:
    base = base_url(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.request(method, base.rstrip("/") + path, json=body, headers=headers,
                             timeout=ADMIN_CALL_TIMEOUT_S)
    typer.echo(json.dumps(response.json(), indent=2))
    if response.is_error:
        raise typer.Exit(1)


@admin.command("create-workspace")
def create_workspace(name: str, url: Url = None, non_retaining: bool = False) -> None:
    """Create a workspace and its owner (operator token from MEMGATE_ADMIN_TOKEN)."""
    _call("POST", url, "/api/admin/workspaces", _operator(),
          {"name": name, "nonRetaining": non_retaining})


@admin.command("add-member")
def add_member(workspace: str, name: str, role: str, token: TokenOpt = None,
               url: Url = None) -> None:
    """Add a member with a role (viewer, editor, owner); owner token."""
    _call("POST", url, f"/api/w/{workspace}/members", _member(token), {"name": name, "role": role})


@admin.command("set-role")
def set_role(workspace: str, member: str, role: str, token: TokenOpt = None,
             url: Url = None) -> None:
    """Change a member's role (takes effect at once); owner token."""
    _call("PATCH", url, f"/api/w/{workspace}/members/{member}", _member(token), {"role": role})


@admin.command("create-credential")
def create_credential(workspace: str, name: str, token: TokenOpt = None,
                      scope: Annotated[list[str] | None, typer.Option()] = None,
                      url: Url = None) -> None:
    """Create an agent credential for yourself with scopes (memory:read, memory:write)."""
    _call("POST", url, f"/api/w/{workspace}/credentials", _member(token),
          {"name": name, "scopes": scope or []})


@admin.command("revoke-credential")
def revoke_credential(workspace: str, credential: str, token: TokenOpt = None,
                      url: Url = None) -> None:
    """Revoke an agent credential at once."""
    _call("DELETE", url, f"/api/w/{workspace}/credentials/{credential}", _member(token))


@admin.command("settings")
def settings(workspace: str, token: TokenOpt = None, url: Url = None,
             agent_memories: Annotated[bool | None, typer.Option(
                 "--agent-memories/--no-agent-memories")] = None,
             retention_days: int | None = None) -> None:
    """Show the workspace settings, or change them (owner token)."""
    changes = {k: v for k, v in {"agentMemoriesEnabled": agent_memories,
                                 "retentionDays": retention_days}.items() if v is not None}
    path = f"/api/w/{workspace}/ask-history/settings"
    _call("PUT" if changes else "GET", url, path, _member(token), changes or None)


@admin.command("nats-credential")
def nats_credential(name: str, url: Url = None) -> None:
    """Issue an agent's NATS login (NKey seed and inbox prefix; operator token)."""
    _call("POST", url, "/api/admin/nats-agents", _operator(), {"name": name})


@admin.command("revoke-nats-credential")
def revoke_nats_credential(agent_id: str, url: Url = None) -> None:
    """Revoke an agent's NATS login at once (operator token)."""
    _call("DELETE", url, f"/api/admin/nats-agents/{agent_id}", _operator())


@admin.command("memory-spaces")
def memory_spaces(workspace: str, member: str, token: TokenOpt = None, url: Url = None,
                  enabled: Annotated[bool, typer.Option("--on/--off")] = True) -> None:
    """Turn a member's memory-space API on or off (SPEC §4.5; at once; owner token)."""
    _call("PATCH", url, f"/api/w/{workspace}/members/{member}", _member(token),
          {"memorySpacesEnabled": enabled})


@admin.command("share")
def share(space: str, member: str, role: str, token: TokenOpt = None, url: Url = None) -> None:
    """Share a memory space with a member as consumer, editor or owner (a space owner's
    member token)."""
    _call("PUT", url, f"/memory/spaces/{space}/shares/{member}", _member(token), {"role": role})


@admin.command("unshare")
def unshare(space: str, member: str, token: TokenOpt = None, url: Url = None) -> None:
    """Revoke a member's access to a memory space: every permission goes at once."""
    _call("DELETE", url, f"/memory/spaces/{space}/shares/{member}", _member(token))


@admin.command("request")
def request(method: str, path: str, body: Annotated[str | None, typer.Argument()] = None,
            token: TokenOpt = None, url: Url = None) -> None:
    """Any admin call, e.g. `request PUT /api/w/WS/documents/DOC '{"collectionId": ...}'`
    (member token from --token/MEMGATE_TOKEN, else the operator's MEMGATE_ADMIN_TOKEN)."""
    _call(method.upper(), url, path, _member(token) or _operator(),
          json.loads(body) if body else None)


cli_erasure.command(admin, base_url, _operator)
cli_backup.command(app, _operator)
import_mem0.command(app, base_url, _member)


def main() -> None:
    from memgate.app.datadir import private_files

    private_files()  # what any command writes (a data directory, a backup) is the user's only
    app()
