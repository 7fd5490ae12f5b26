"""One child process of `memgate up`: the actors of one group (`app.layout`), and for the front
group the REST adapter on the listening socket the supervisor holds.

    python -m memgate.app.process --group store --nats nats://127.0.0.1:4222 --ready-fd 5

Settings come from the environment (`MEMGATE_*`, written by the supervisor); the NATS logins are
derived from the same secret the supervisor's embedded server was configured with. The process
writes one line to `--ready-fd` once its actors (and HTTP) serve, and stops (draining) on
SIGTERM or SIGINT, or when its standard input closes: the supervisor holds the other end, so a
child never outlives it, even when the supervisor is killed outright (the kernel then also sends
it SIGTERM: `bus.lifetime`). An orphan does not wait on a drain with nobody to hand over
to (its nats-server died with the supervisor): it exits `ORPHAN_STOP_S` after its parent went,
whatever it was doing, and frees the data directory's lock (`app.datadir`) for the next
`memgate up`; what it had committed is on disk, what it had not was never acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import gc
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AsyncExitStack

import uvicorn

from memgate.app.datadir import private_files
from memgate.app.layout import group_named
from memgate.app.settings import Settings
from memgate.app.logins import internal_logins
from memgate.app.system import (
    Bus, actor_names, external_bus, internal_bus, start_taking_turns, store_names,
)
from memgate.observe import tracing
from memgate.runtime.actor import hand_off_the_gil_promptly

log = logging.getLogger("memgate")
HTTP_START_TIMEOUT_S = 30.0
# An idle keep-alive connection stays open this long. uvicorn's default (5 s) equals the pool
# expiry of httpx and others: a client reusing a connection just as the server closes it gets a
# connection reset (`httpx.ReadError`; seen under load in bench.load). The server's must be
# the longer one; 75 s is nginx's and gunicorn's.
KEEP_ALIVE_S = 75
ORPHAN_STOP_S = 3.0  # an orphan's drain, at most (idle: ~0.2 s)
# Any other stop, at most, past the HTTP front's drain (`request_timeout_s`): a stop still under
# way then waits on something that will not come (a lease lost, the connection refused), and
# the supervisor restarts only a process that exited.
STOP_MARGIN_S = 15.0


class HttpServer(uvicorn.Server):
    """uvicorn, minus its habit of re-raising Ctrl-C after shutdown: its owner stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def http_server(settings: Settings, bus: Bus) -> HttpServer:
    """The REST adapter of `settings`, its requests on the bus `bus`."""
    # FastAPI and the MCP SDK (~1.5 s of imports): only the front's processes serve HTTP
    from memgate.adapters.rest import create_app

    api = create_app(bus.url, ready_subjects=actor_names(settings),
                     cluster_subjects=store_names(settings),
                     timeout=settings.request_timeout_s, nats_options=bus.options,
                     max_body_bytes=settings.max_body_bytes, local=bus.here)
    return HttpServer(uvicorn.Config(
        api, host=settings.http_host, port=settings.http_port, log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_S,
        # in-flight requests wait on the bus at most this long
        timeout_graceful_shutdown=math.ceil(settings.request_timeout_s)))


def exit_soon(loop: asyncio.AbstractEventLoop, after_s: float, code: int) -> None:
    """Exit in `after_s` whatever the event loop is doing (a thread of its own), first saying
    where each task and thread waited (their code lines, never their values)."""
    def stuck() -> None:
        log.error("the stop did not end within %g s; exiting (%d)", after_s, code)
        with contextlib.suppress(Exception):  # the loop's tasks, read from another thread
            for task in list(asyncio.all_tasks(loop)):
                print(f"task {task.get_name()} waits in:", *awaiting(task.get_coro()),
                      sep="\n  ", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(code)

    timer = threading.Timer(after_s, stuck)
    timer.daemon = True
    timer.start()


def awaiting(coro: object) -> Iterator[str]:
    """Where a coroutine waits: each coroutine it awaits, outermost first."""
    while (frame := getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)):
        yield f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def _stop_when_parent_goes(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Standard input is a pipe from the supervisor: end of file means it is gone."""
    fd = sys.stdin.fileno()

    def readable() -> None:
        try:
            gone = not os.read(fd, 4096)
        except OSError:
            gone = True
        if gone:
            loop.remove_reader(fd)
            stop.set()
            exit_soon(loop, ORPHAN_STOP_S, 1)

    loop.add_reader(fd, readable)


async def run_group(settings: Settings, group: str, nats_url: str, *, ready_fd: int | None,
                    http_fd: int | None) -> None:
    """Run the group's actors (and HTTP) until told to stop, then drain: HTTP first."""
    members = group_named(settings, group)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready_fd is not None:  # started by the supervisor, which holds our standard input
        _stop_when_parent_goes(loop, stop)
    bus = (external_bus(settings, nats_url) if settings.nats_url is not None
           else internal_bus(nats_url, internal_logins(settings)))
    lost = asyncio.Event()

    async def on_lost() -> None:  # a lease gone: commit nothing more, and start again
        lost.set()
        stop.set()

    async with AsyncExitStack() as stack:
        await start_taking_turns(settings, bus, stack, only=members.actors,
                                 governs=members.governs, on_lost=on_lost, balance=True)
        http: HttpServer | None = None
        serving: asyncio.Task[None] | None = None
        if members.rest and http_fd is not None:
            http = http_server(settings, bus)
            serving = asyncio.create_task(http.serve(sockets=[socket.socket(fileno=http_fd)]))
            started = loop.time()
            while not http.started:  # uvicorn offers no event to wait on
                if serving.done() or loop.time() - started > HTTP_START_TIMEOUT_S:
                    raise RuntimeError("the REST adapter did not start")
                await asyncio.sleep(0.01)
        # What starting built lives as long as the process: a full collection need not walk it
        # again and again (docs/DECISIONS.md, "REST adapter CPU per request").
        gc.collect()
        gc.freeze()
        if ready_fd is not None:
            os.write(ready_fd, f"{group} {os.getpid()}\n".encode())
            os.close(ready_fd)
        await stop.wait()
        exit_soon(loop, settings.request_timeout_s + STOP_MARGIN_S,
                   LEASE_LOST_EXIT if lost.is_set() else 1)
        if http is not None and serving is not None:  # the front door closes before the actors
            http.should_exit = True
            await serving
    if lost.is_set():
        raise SystemExit(LEASE_LOST_EXIT)


LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: the supervisor starts the process again


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m memgate.app.process",
                                     description="One supervised process of `memgate up`.")
    parser.add_argument("--group", required=True, help="the process group (app/layout.py)")
    parser.add_argument("--nats", required=True, help="the NATS URL the actors join")
    parser.add_argument("--ready-fd", type=int, help="written to once the group serves")
    parser.add_argument("--http-fd", type=int, help="the listening socket of the REST adapter")
    args = parser.parse_args(argv)
    private_files()
    hand_off_the_gil_promptly()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(name)s[{args.group}] %(levelname)s %(message)s")
    settings = Settings()
    stop_tracing = traced(settings, args.group)
    try:
        asyncio.run(run_group(settings, args.group, args.nats, ready_fd=args.ready_fd,
                              http_fd=args.http_fd))
    finally:
        stop_tracing()  # the spans still buffered go out


def traced(settings: Settings, process: str) -> Callable[[], None]:
    """Trace this process if the settings name an exporter; what stops it."""
    return tracing.configure(process, otlp_endpoint=settings.otlp_endpoint,
                             trace_dir=settings.trace_dir,
                             sample_ratio=settings.trace_sample_ratio)


if __name__ == "__main__":
    main()
