"""Running a memgate process: `memgate up` (everything) and `memgate actors` (some, scaled out).

Each is an `AsyncExitStack` of resources plus a signal-driven shutdown: Ctrl-C drains and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from collections.abc import Iterator
from contextlib import AsyncExitStack

import typer
import uvicorn

from memgate.adapters.rest import create_app
from memgate.app.settings import Settings
from memgate.app.system import actor_names, start_system


class _Server(uvicorn.Server):
    """uvicorn, minus its habit of re-raising Ctrl-C after shutdown: `serve` stops everything."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: Settings) -> None:
    """Embedded nats-server (unless `--nats`), every actor, the REST adapter; Ctrl-C drains all."""
    async with AsyncExitStack() as stack:
        bus = await start_system(settings, stack)
        url = bus.url
        api = create_app(url, ready_subjects=actor_names(settings),
                         timeout=settings.request_timeout_s, nats_options=bus.options,
                         max_body_bytes=settings.max_body_bytes)
        config = uvicorn.Config(api, host=settings.http_host, port=settings.http_port,
                                log_level="warning",
                                # in-flight requests wait on the bus at most this long
                                timeout_graceful_shutdown=math.ceil(settings.request_timeout_s))
        typer.echo(f"memgate: NATS {url}  HTTP http://{settings.http_host}:{settings.http_port}"
                   f"  data {settings.data_dir.resolve()}")
        server = _Server(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        await server.serve()
        typer.echo("memgate: draining and stopping")


async def run_actors(settings: Settings, only: frozenset[str]) -> None:
    """Some actors, joined to an existing NATS: how memgate scales out, one kind at a time."""
    async with AsyncExitStack() as stack:
        await start_system(settings, stack, only=only)
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        typer.echo(f"memgate: {', '.join(sorted(only))} on {settings.nats_url}")
        await stopped.wait()
