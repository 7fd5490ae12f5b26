"""Running memgate: `memgate up` (everything) and `memgate actors` (some, scaled out).

`memgate up` is a supervisor: it owns the embedded nats-server, its nats-authority and the REST
listening socket, and runs the actors in supervised child processes by group (`app.layout`,
`app.supervisor`); `single_process` runs everything in this one process instead. Each is an
`AsyncExitStack` of resources plus a signal-driven shutdown: Ctrl-C drains and stops.

Either first checks its data directory's format (`app.dataformat`: a newer one is refused),
locks it (`app.datadir`: a second memgate on it is refused), makes it private to the user and
brings it to this memgate's format; the lock's descriptor is held by the nats-server and every
child too, which die with the supervisor (`bus.lifetime`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from contextlib import AsyncExitStack

import nats
import typer

from memgate.app import dataformat, datadir, ram
from memgate.app.layout import FRONT, groups
from memgate.app.layout import child_environment
from memgate.app.process import http_server, traced
from memgate.app.settings import Settings
from memgate.app.supervisor import Supervisor
from memgate.app.logins import internal_logins
from memgate.app.system import Bus, external_bus, start_actors, start_server, start_system
from memgate.bus.streams import ensure_events_stream
from memgate.cluster.ownership import Disk, owned, settle_homes, until_jetstream_answers
from memgate.cluster.replication import movable
from memgate.observe import exposition
from memgate.runtime.actor import hand_off_the_gil_promptly

STOP_MARGIN_S = 10.0  # beyond the request timeout, for a child to close its files


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _started(settings: Settings, url: str) -> None:
    typer.echo(f"memgate: NATS {url}  HTTP http://{settings.http_host}:{settings.http_port}"
               f"  data {settings.data_dir.resolve()}")


def listening_socket(host: str, port: int) -> socket.socket:
    """The REST adapter's socket, bound here and served by every front process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


async def serve(settings: Settings) -> None:
    """`memgate up`: supervised processes, or one process (`single_process`), on a data
    directory locked for them (else `datadir.StartRefusedError`), in this memgate's format
    (`app.dataformat`: a newer one refused before anything opens it, an older one migrated)."""
    dataformat.check(settings.data_dir, migrates=True)
    datadir.private_files()
    if (settings.nats_url is not None or settings.routes) and settings.admin_token is None:
        # every memgate joined to one NATS must know the same operator: none is made up here
        raise datadir.StartRefusedError(
            "joined to a NATS (--nats) or a cluster (--routes), memgate needs the operator "
            "token: set "
            "MEMGATE_ADMIN_TOKEN (e.g. to the output of `openssl rand -base64 32`)")
    lock = await asyncio.to_thread(datadir.lock, settings.data_dir)
    datadir.make_private(settings.data_dir)
    await asyncio.to_thread(dataformat.migrate, settings.data_dir,
                            say=lambda line: typer.echo(f"memgate: {line}"))
    if settings.text_index_dir is None:
        ram.private_base()  # refused here, with its reason, rather than in a child process
    if settings.single_process:
        await serve_in_process(settings, inherit=(lock,))
    else:
        await serve_supervised(settings, inherit=(lock,))


def _record(settings: Settings, nats_url: str, stack: AsyncExitStack,
            http_port: int | None = None) -> None:
    """Where the command line finds this memgate's NATS and HTTP (`app.datadir.running`)."""
    host = settings.http_host
    if host in ("0.0.0.0", "::", ""):  # every interface: this host's own address
        host = "127.0.0.1" if host != "::" else "::1"
    port = settings.http_port if http_port is None else http_port
    http = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    for what, url in (("nats", nats_url), ("http", http)):
        datadir.record(settings.data_dir, what, url)
        stack.callback(datadir.forget, settings.data_dir, what)


async def serve_supervised(settings: Settings, *, inherit: tuple[int, ...] = ()) -> None:
    """The embedded nats-server (unless `--nats`) and its nats-authority here; the actors and
    the REST adapter in child processes; Ctrl-C stops the children in order, then the server.
    The server and the children hold the descriptors `inherit` while they run."""
    stop = _stop_on_signals()
    async with AsyncExitStack() as stack:
        authority = None
        if settings.nats_url is None:
            server, bus = await start_server(settings, stack, inherit=inherit)
            authority = await start_actors(
                settings, bus, stack, only=frozenset({"nats-authority"}), server=server,
                logins=list(internal_logins(settings).values()))
        else:
            bus = external_bus(settings, settings.nats_url)
        if settings.routes or settings.nats_url is not None:
            # the stores homed on other nodes are run there, not here
            settings = settings.model_copy(update={"elsewhere": await _elsewhere(settings, bus)})
        http = listening_socket(settings.http_host, settings.http_port)
        stack.callback(http.close)
        # both listen from here on (the socket queues what comes before the front accepts):
        # recorded before any child starts, so whoever sees memgate answer finds both
        _record(settings, bus.url, stack, http.getsockname()[1])
        layout = groups(settings)
        # built here once, not by the two children that run the model, at once
        await asyncio.to_thread(settings.compute_model)
        env = child_environment(dict(os.environ), settings)
        # every child records its metrics there; the front adds them up (`observe.exposition`)
        env[exposition.FILES_VARIABLE] = str(exposition.fresh(
            exposition.directory(settings.data_dir)))
        supervisor = await stack.enter_async_context(Supervisor(
            layout, replicas={g.name: g.replicas(settings) for g in layout}, nats_url=bus.url,
            env=env, http_socket=http,
            stop_timeout_s=settings.request_timeout_s + STOP_MARGIN_S, inherit=inherit))
        await supervisor.start(*(g.name for g in layout if g.name != FRONT))
        if authority is not None:
            await authority.sync()  # the agents' NATS logins, before the front door opens
        await supervisor.start(FRONT)
        _started(settings, bus.url)
        await stop.wait()
        typer.echo("memgate: draining and stopping")


async def _elsewhere(settings: Settings, bus: Bus) -> list[str]:
    """The single-writer actors of the layout whose home is another node and that do not move
    (`cluster.ownership`; the others have a standby here, `cluster.replication`): this node
    makes itself the home of those that have none yet."""
    names = [name for group in groups(settings) for name in sorted(group.actors) if owned(name)]
    nc = await nats.connect(bus.url, name="memgate-homes", **bus.login("storage"))
    try:
        js = nc.jetstream(timeout=settings.request_timeout_s)
        homed = await settle_homes(js, Disk.of(settings.data_dir, settings.node), names,
                                   replicas=settings.stream_replicas())
        elsewhere = [name for name in homed if not (settings.routes and movable(name))]
        # the streams with all their copies before any consumer of them starts
        await until_jetstream_answers(
            lambda: ensure_events_stream(js, replicas=settings.stream_replicas()))
    finally:
        await nc.close()
    if elsewhere:
        typer.echo(f"memgate: on other nodes: {', '.join(elsewhere)}")
    return elsewhere


async def serve_in_process(settings: Settings, *, inherit: tuple[int, ...] = ()) -> None:
    """Embedded nats-server (unless `--nats`), every actor, the REST adapter, in this process."""
    async with AsyncExitStack() as stack:
        stack.callback(traced(settings, "memgate"))
        bus = await start_system(settings, stack, inherit=inherit)
        _record(settings, bus.url, stack)
        server = http_server(settings, bus)
        _started(settings, bus.url)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        await server.serve()
        typer.echo("memgate: draining and stopping")


async def run_actors(settings: Settings, only: frozenset[str]) -> None:
    """Some actors, joined to an existing NATS: how memgate scales out, one kind at a time."""
    hand_off_the_gil_promptly()
    stop = _stop_on_signals()

    async def on_lost() -> None:  # a lease gone: commit nothing more, and stop
        stop.set()

    async with AsyncExitStack() as stack:
        stack.callback(traced(settings, "actors"))
        await start_system(settings, stack, only=only, on_lost=on_lost)
        typer.echo(f"memgate: {', '.join(sorted(only))} on {settings.nats_url}")
        await stop.wait()
