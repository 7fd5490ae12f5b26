"""The supervisor of `memgate up`: starts each child process (`app.process`) of the layout,
restarts one that dies (with backoff), and stops them in order.

A restarted child loses nothing acknowledged: storage answers a remember only after its commit,
the events stream's durable consumers resume where their last ack left them, and the stateless
groups keep nothing. What a dead child was handling when it died is answered with an error (or
a timeout) and never acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from memgate.app.layout import Group
from memgate.bus.lifetime import die_with_parent

log = logging.getLogger("memgate.supervisor")

BACKOFF_FIRST_S = 0.25
BACKOFF_MAX_S = 8.0
HEALTHY_AFTER_S = 30.0  # a child that ran this long restarts at once again after a crash
START_TIMEOUT_S = 120.0


class ChildFailedError(RuntimeError):
    """A child process exited before it was ready the first time (a setup error, not a crash)."""


@dataclass
class Child:
    """One supervised process: a replica of a group."""

    group: Group
    replica: int
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    first_ready: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def name(self) -> str:
        return f"{self.group.name}.{self.replica}"


class Supervisor:
    """`async with Supervisor(...) as s: await s.start(group, ...)`; on exit, every child is
    stopped, in order."""

    def __init__(self, layout: list[Group], *, replicas: Mapping[str, int], nats_url: str,
                 env: Mapping[str, str], http_socket: socket.socket | None,
                 stop_timeout_s: float, inherit: tuple[int, ...] = ()) -> None:
        self._layout = layout
        self._inherit = inherit  # every child holds these (the data directory's lock)
        self._nats_url = nats_url
        self._env = dict(env)
        self._http = http_socket
        self._stop_timeout_s = stop_timeout_s
        self.children = [Child(group, i) for group in layout
                         for i in range(replicas.get(group.name, 1))]
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, *names: str) -> None:
        """Start every replica of the groups `names`; return once each is ready (else raise
        `ChildFailedError`)."""
        starting = [c for c in self.children if c.group.name in names]
        self._tasks += [asyncio.create_task(self._supervise(c), name=f"supervise.{c.name}")
                        for c in starting]
        await asyncio.wait_for(asyncio.gather(*(c.first_ready for c in starting)),
                               START_TIMEOUT_S)

    @property
    def pids(self) -> dict[str, int]:
        """The running children by name (`front.0`: pid)."""
        return {c.name: c.process.pid for c in self.children
                if c.process is not None and c.process.returncode is None}

    async def _spawn(self, child: Child) -> tuple[asyncio.subprocess.Process, int]:
        read_end, write_end = os.pipe()
        args = ["--group", child.group.name, "--nats", self._nats_url,
                "--ready-fd", str(write_end)]
        keep = [write_end, *self._inherit]
        if child.group.rest and self._http is not None:
            args += ["--http-fd", str(self._http.fileno())]
            keep.append(self._http.fileno())
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "memgate.app.process", *args,
                env={**self._env, "MEMGATE_RESTARTS": str(child.restarts)},
                pass_fds=keep, stdin=asyncio.subprocess.PIPE,
                # its own session: a terminal's Ctrl-C reaches the supervisor only, which then
                # stops the children in order; killed outright, it takes them with it (SIGTERM:
                # they drain), as it does when their standard input closes
                start_new_session=True, preexec_fn=die_with_parent())
        finally:
            os.close(write_end)
        return process, read_end

    async def _supervise(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        backoff = BACKOFF_FIRST_S
        while not self._stopping.is_set():
            started = loop.time()
            process, ready_pipe = await self._spawn(child)
            child.process = process
            if self._stopping.is_set():  # spawned while the others were being stopped
                os.close(ready_pipe)
                await self._stop_child(child)
                return
            announced = await loop.run_in_executor(None, _read_and_close, ready_pipe)
            if announced and not child.first_ready.done():
                child.first_ready.set_result(None)
            if announced:
                log.info("%s ready (pid %d)", child.name, process.pid)
            code = await process.wait()
            if self._stopping.is_set():
                return
            if not child.first_ready.done():
                child.first_ready.set_exception(ChildFailedError(
                    f"the {child.name} process exited ({code}) before it was ready"))
                return
            if loop.time() - started > HEALTHY_AFTER_S:
                backoff = BACKOFF_FIRST_S
            log.warning("%s (pid %d) exited with %d; restarting in %.2f s",
                        child.name, process.pid, code, backoff)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            child.restarts += 1

    async def stop(self) -> None:
        """Stop the last group started (the front door) first and let it drain; then the
        others together: nothing sends them new commands any more."""
        self._stopping.set()
        last = self._layout[-1]
        await asyncio.gather(*(self._stop_child(c) for c in self.children if c.group is last))
        await asyncio.gather(*(self._stop_child(c) for c in self.children if c.group is not last))
        # each task returns once its child has exited (or from its backoff wait)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for child in self.children:
            if not child.first_ready.done():
                child.first_ready.cancel()

    async def _stop_child(self, child: Child) -> None:
        process = child.process
        if process is None or process.returncode is not None:
            return
        loop = asyncio.get_running_loop()
        asked = loop.time()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self._stop_timeout_s)
            log.info("%s stopped in %.2f s (exit %d)", child.name, loop.time() - asked,
                     process.returncode)
        except TimeoutError:
            log.warning("%s did not stop in time; killed", child.name)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if process.stdin is not None:
            process.stdin.close()


def _read_and_close(fd: int) -> bool:
    """Block until the child announces readiness (True) or exits first (False)."""
    try:
        return bool(os.read(fd, 256))
    finally:
        os.close(fd)


__all__ = ["Child", "ChildFailedError", "Supervisor"]
