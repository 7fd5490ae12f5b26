"""`memgate up` runs its actors in supervised processes: a process killed mid-load is restarted,
nothing acknowledged is lost or stored twice, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest

from memgate.bus.lifetime import alive
from memgate.bus import MemgateClient
from memgate.contracts.errors import MemgateError
from tests.conftest import ADMIN_TOKEN, eventually, free_port

GROUPS = ("store", "index", "front")  # every kind of child process
AGENTS = 4
PACE_S = 0.1  # between one agent's remembers: a steady load, not a saturating one


@dataclass
class Up:
    process: asyncio.subprocess.Process
    http: httpx.AsyncClient
    nats_url: str
    log: Path  # what `memgate up` wrote (its children's output too)

    async def interrupted(self) -> None:
        """Ctrl-C: memgate up stops within a minute with status 0 (else its output, shown)."""
        self.process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(self.process.wait(), 60)
        assert code == 0, f"memgate up exited {code}:\n{self.log.read_text()[-4000:]}"


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, each with its command line."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry.name)] = cmdline
    return found


def group_pid(up: Up, group: str) -> int | None:
    for pid, cmdline in children(up.process.pid).items():
        if f"--group {group} " in cmdline:
            return pid
    return None


async def healthy(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


@asynccontextmanager
async def memgate_up(data_dir: Path, **env: str) -> AsyncIterator[Up]:
    http_port, nats_port = free_port(), free_port()
    log = data_dir.parent / "memgate-up.log"  # outside the data directory the tests inspect
    output = log.open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memgate.adapters", "up", "--data-dir", str(data_dir),
        "--http", f"127.0.0.1:{http_port}",
        env={**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN,
             "MEMGATE_NATS_PORT": str(nats_port), **env},
        stdout=output, stderr=output)
    output.close()  # the child holds its own copy
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}",
                                     timeout=30) as http:
            up = Up(process, http, f"nats://127.0.0.1:{nats_port}", log)
            await eventually(lambda: healthy(http), timeout=90)
            yield up
    finally:
        if process.returncode is None:
            process.kill()  # the test failed before its own Ctrl-C
            await process.wait()


async def new_agent(up: Up, http: httpx.AsyncClient) -> MemgateClient:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    created = (await http.post("/api/admin/workspaces", json={"name": "acme"},
                               headers=admin)).json()
    ws, owner = created["workspaceId"], {"Authorization": f"Bearer "
                                                          f"{created['owner']['memberToken']}"}
    await http.put(f"/api/w/{ws}/ask-history/settings", json={"agentMemoriesEnabled": True},
                   headers=owner)
    token = (await http.post(f"/api/w/{ws}/credentials", headers=owner, json={
        "name": "bot", "scopes": ["memory:read", "memory:write"]})).json()["token"]
    login = (await http.post("/api/admin/nats-agents", json={"name": "bot"},
                             headers=admin)).json()
    return await MemgateClient.connect(up.nats_url, token, nats_seed=login["seed"],
                                       inbox_prefix=login["inboxPrefix"], timeout=5.0)


@dataclass
class Load:
    """One agent remembering unique texts until told to stop; what was acknowledged, by id."""

    agent: MemgateClient
    acked: dict[str, str] = field(default_factory=dict)  # memory id → text
    refused: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            text = f"note {uuid.uuid4().hex}"
            try:
                stored = await self.agent.remember("load", text)
            except (MemgateError, TimeoutError):  # in flight when a process died: not acked
                self.refused += 1
            else:
                assert stored.memory_id not in self.acked
                self.acked[stored.memory_id] = text
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PACE_S)

    async def listed(self) -> list[tuple[str, str]]:
        memories, cursor = [], None
        while True:
            page = await self.agent.list(namespace="load", limit=100, cursor=cursor)
            memories += [(m.memory_id, m.text) for m in page.memories]
            if page.next_cursor is None:
                return memories
            cursor = page.next_cursor

    async def recalled(self, memory_id: str) -> bool:
        # by its unique word: every text also says "note", which every other memory matches
        unique = self.acked[memory_id].split()[-1]
        found = await self.agent.recall(unique, namespace="load", limit=10)
        return memory_id in [m.memory_id for m in found.memories]


@pytest.mark.timeout(300)
async def test_killing_each_process_mid_load_loses_and_duplicates_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    async with memgate_up(tmp_path / "data", MEMGATE_REQUEST_TIMEOUT_S="3",
                          MEMGATE_LIMIT_REMEMBERS_PER_HOUR="100000") as up:
        loads = [Load(await new_agent(up, up.http)) for _ in range(AGENTS)]
        stop = asyncio.Event()
        running = [asyncio.create_task(load.run(stop)) for load in loads]
        seen = set(children(up.process.pid))
        for group in GROUPS:
            await eventually(progressed(loads, 20), timeout=60)
            victim = group_pid(up, group)
            assert victim is not None, f"no {group} process"
            os.kill(victim, signal.SIGKILL)

            async def restarted(group: str = group, victim: int = victim) -> bool:
                pid = group_pid(up, group)
                return pid is not None and pid != victim

            await eventually(restarted, timeout=60)
            await eventually(lambda: healthy(up.http), timeout=60)
            seen |= set(children(up.process.pid))
        await eventually(progressed(loads, 20), timeout=60)  # healed: acks again
        stop.set()
        await asyncio.gather(*running)

        for load in loads:
            listed = await load.listed()
            ids = [memory_id for memory_id, _ in listed]
            texts = [text for _, text in listed]
            assert len(ids) == len(set(ids)), "a memory id listed twice"
            assert len(texts) == len(set(texts)), "a remember stored twice"
            assert set(load.acked) <= set(ids), "an acknowledged memory was lost"

        async def every_one_recalled(load: Load) -> None:
            for memory_id in load.acked:
                await eventually(partial(load.recalled, memory_id), timeout=60)
            await load.agent.close()

        await asyncio.gather(*(every_one_recalled(load) for load in loads))

        await up.interrupted()
        left = [pid for pid in seen if alive(pid)]
        assert not left, f"processes outlived memgate up: {left}"
        # the crashes, restarts and retries logged no memory's text
        output = up.log.read_text()
        assert "restarting" in output
        assert not [t for load in loads for t in load.acked.values() if t.split()[-1] in output]


def progressed(loads: list[Load], n: int) -> Callable[[], Awaitable[bool]]:
    """A check: each agent has had `n` more remembers acknowledged than when this was made."""
    marks = [len(load.acked) for load in loads]

    async def check() -> bool:
        return all(len(load.acked) >= mark + n for load, mark in zip(loads, marks, strict=True))

    return check


async def test_workers_run_several_front_processes_and_ctrl_c_stops_them_all(
    tmp_path: Path,
) -> None:
    async with memgate_up(tmp_path / "data", MEMGATE_WORKERS="2") as up:
        groups = [cmdline.split("--group ")[1].split()[0]
                  for cmdline in children(up.process.pid).values() if "--group " in cmdline]
        assert sorted(groups) == ["front", "front", "index", "store"]
        agent = await new_agent(up, up.http)
        stored = await asyncio.gather(*(agent.remember("n", f"note {i}") for i in range(20)))
        listed = (await agent.list(namespace="n", limit=100)).memories
        assert {m.memory_id for m in listed} == {s.memory_id for s in stored}
        for _ in range(10):  # the shared listening socket answers from every front process
            assert await healthy(up.http)
        await agent.close()
        everyone = list(children(up.process.pid))  # the children and the nats-server
        assert len(everyone) == 5
        await up.interrupted()
        assert [pid for pid in everyone if alive(pid)] == []


async def test_an_agents_writes_and_lists_are_governed_beside_storage_without_the_front(
    tmp_path: Path,
) -> None:
    """`app.layout`: remembers, lists and forgets over the bus are governed in the `store`
    process, which hands them to storage in process; recalls go to the `front`."""
    async with memgate_up(tmp_path / "data") as up:
        agent = await new_agent(up, up.http)
        fronts = [pid for pid, cmdline in children(up.process.pid).items()
                  if "--group front" in cmdline]
        assert fronts
        for pid in fronts:
            os.kill(pid, signal.SIGSTOP)
        try:
            kept = await agent.remember("n", "the deploy is on friday")
            dropped = await agent.remember("n", "lunch is at noon")
            assert (await agent.forget(memory_id=dropped.memory_id)).deleted == 1
            listed = (await agent.list(namespace="n")).memories
            assert [m.memory_id for m in listed] == [kept.memory_id]
            with pytest.raises(TimeoutError):  # recall is the front's
                await asyncio.wait_for(agent.recall("deploy"), 1.0)
        finally:
            for pid in fronts:
                os.kill(pid, signal.SIGCONT)

        async def recalled() -> bool:  # the front serves again
            return kept.memory_id in [m.memory_id for m in (await agent.recall("deploy")).memories]

        await eventually(recalled, timeout=30)
        await agent.close()
        await up.interrupted()
