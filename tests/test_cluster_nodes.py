"""Three `memgate up` nodes on loopback forming one cluster (SPEC §6, "Many machines"): each
runs its embedded nats-server as a member of one NATS cluster, the streams and buckets keep
three copies, every single-writer actor has one home and one owner in the whole cluster, and a
memory remembered through one node is listed and recalled through another."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import nats
import pytest

from memgate import MemgateClient
from memgate.app.logins import internal_logins
from memgate.app.settings import Settings
from memgate.bus import subjects
from memgate.bus.logins import inbox_prefix
from memgate.cluster.lease import BUCKET, holder, lease_bucket
from memgate.cluster.ownership import HOMES, SINGLE_WRITERS, home_of, homes_bucket
from tests.conftest import ADMIN_TOKEN, close_nats, eventually, free_port
from tests.test_processes import alive, children, healthy

pytestmark = pytest.mark.timeout(300)

NODES = 3
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@asynccontextmanager
async def node(tmp_path: Path, n: int, cluster_ports: list[int]) -> AsyncIterator[
        tuple[httpx.AsyncClient, Path, str]]:
    """`memgate up --node nN --cluster ... --routes ...`: its REST client, data dir, NATS URL."""
    data_dir, http_port, nats_port = tmp_path / f"n{n}", free_port(), free_port()
    log = (tmp_path / f"n{n}.log").open("wb")
    routes = ",".join(f"nats://127.0.0.1:{port}" for port in cluster_ports)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memgate.adapters", "up", "--data-dir", str(data_dir),
        "--http", f"127.0.0.1:{http_port}", "--nats-port", str(nats_port), "--node", f"n{n}",
        "--cluster", f"127.0.0.1:{cluster_ports[n]}", "--routes", routes,
        env={**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN}, stdout=log, stderr=log)
    log.close()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}",
                                     timeout=30) as http:
            yield http, data_dir, f"nats://127.0.0.1:{nats_port}"
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 60)
            except TimeoutError:
                process.kill()
                await process.wait()


async def test_three_nodes_one_cluster_one_owner_each_and_writes_read_through_another_node(
        tmp_path: Path) -> None:
    cluster_ports = [free_port() for _ in range(NODES)]
    async with AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(node(tmp_path, n, cluster_ports))
                 for n in range(NODES)]
        for http, _, _ in nodes:  # they start together: JetStream needs a majority
            await eventually(lambda http=http: healthy(http), timeout=150)
        (one, one_dir, one_nats), (two, _, _) = nodes[0], nodes[1]

        created = (await one.post("/api/admin/workspaces", json={"name": "acme"},
                                  headers=ADMIN)).json()
        ws, owner = created["workspaceId"], {
            "Authorization": f"Bearer {created['owner']['memberToken']}"}
        assert (await two.put(f"/api/w/{ws}/ask-history/settings", headers=owner,
                              json={"agentMemoriesEnabled": True})).status_code == 200
        token = (await two.post(f"/api/w/{ws}/credentials", headers=owner, json={
            "name": "bot", "scopes": ["memory:read", "memory:write"]})).json()["token"]
        agent = {"Authorization": f"Bearer {token}"}
        remembered = await one.post("/api/agent/v1/memories/remember", headers=agent,
                                    json={"namespace": "n", "text": "the boiler is serviced "
                                                                    "every March"})
        assert remembered.status_code == 200, remembered.text
        memory_id = remembered.json()["memoryId"]
        # read-your-writes through another node
        listed = (await two.post("/api/agent/v1/memories/list", headers=agent,
                                 json={"namespace": "n"})).json()
        assert [m["memoryId"] for m in listed["memories"]] == [memory_id]
        recalled = (await two.post("/api/agent/v1/memories/recall", headers=agent,
                                   json={"namespace": "n", "query": "boiler service"})).json()
        assert [m["memoryId"] for m in recalled["memories"]] == [memory_id]
        assert recalled["degraded"] == []

        login = internal_logins(Settings(data_dir=one_dir))["storage"]
        nc = await nats.connect(one_nats, user=login.user, password=login.password,
                                inbox_prefix=inbox_prefix("storage"))
        stack.push_async_callback(close_nats, nc)
        js = nc.jetstream(timeout=10)
        for stream in (subjects.EVENTS_STREAM, subjects.DLQ_STREAM, f"KV_{BUCKET}",
                       f"KV_{HOMES}"):
            info = await js.stream_info(stream)
            assert info.config.num_replicas == NODES, stream
            assert info.cluster is not None and len(info.cluster.replicas or []) == NODES - 1
        leases, homes = await lease_bucket(js), await homes_bucket(js)
        writers = [*SINGLE_WRITERS, *(f"{kind}.p0" for kind in ("storage", "indexer",
                                                                  "embedder"))]
        for name in writers:
            home, held = await home_of(homes, name), await holder(leases, name)
            assert home is not None and held is not None, name
            assert held.node == home["node"], name  # owned where its files are, once
        homed = {(await home_of(homes, name) or {}).get("node") for name in writers}
        assert homed <= {f"n{n}" for n in range(NODES)}

        # what an operator sees: each store, its home, who serves it
        status = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "memgate.adapters", "cluster", "status", "--data-dir",
            str(one_dir), stdout=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
        out, _ = await asyncio.wait_for(status.communicate(), 60)
        assert status.returncode == 0
        lines = out.decode().splitlines()
        for name in writers:
            [line] = [line for line in lines if f" {name} " in line]
            home = (await home_of(homes, name) or {})["node"]
            assert line.count(f" {home} ") == 2, line  # home, and served by it

        # the same through the REST API, for the operator only
        assert (await two.get("/api/admin/cluster", headers=owner)).status_code == 401
        shown = await two.get("/api/admin/cluster", headers=ADMIN)
        assert shown.status_code == 200, shown.text
        view = {s["name"]: s for s in shown.json()["stores"]}
        assert set(view) == set(writers)
        for name in writers:
            home = (await home_of(homes, name) or {})["node"]
            assert view[name]["home"] == view[name]["servedBy"] == home
            assert view[name]["epoch"] == (await holder(leases, name) or _none()).epoch
        assert set(shown.json()["nodes"]) <= {f"n{n}" for n in range(NODES)}

        # an agent's NATS login, issued through node 1, works on every node
        login_made = (await one.post("/api/admin/nats-agents", json={"name": "bot"},
                                     headers=ADMIN)).json()
        agents = []
        for _, _, url in nodes:
            agents.append(await _eventually_connected(url, token, login_made))
        stored = await agents[2].remember("n", "the gate code changes on Mondays")
        listed_ids = {m.memory_id for m in (await agents[1].list(namespace="n")).memories}
        assert listed_ids == {memory_id, stored.memory_id}
        for connected in agents:
            await connected.close()

        # an erasure's evidence names the node of every layer's owner
        homes_of = {name: (await home_of(homes, name) or {})["node"] for name in writers}
        await erased_on_their_homes(one, two, ws, owner, homes_of)


async def erased_on_their_homes(one: httpx.AsyncClient, two: httpx.AsyncClient, ws: str,
                                 owner: dict[str, str], homes_of: dict[str, str]) -> None:
    """A member with a memory, erased through node 1, the evidence read through node 2."""
    added = (await one.post(f"/api/w/{ws}/members", headers=owner,
                            json={"name": "Grace", "role": "editor"})).json()
    member = {"Authorization": f"Bearer {added['memberToken']}"}
    token = (await one.post(f"/api/w/{ws}/credentials", headers=member, json={
        "name": "bot", "scopes": ["memory:write"]})).json()["token"]
    assert (await one.post("/api/agent/v1/memories/remember", json={
        "namespace": "n", "text": "Grace waters the ferns"},
        headers={"Authorization": f"Bearer {token}"})).status_code == 200
    base = "/api/admin/erasure-requests"
    created = (await one.post(base, headers=ADMIN, json={
        "workspaceId": ws, "subject": {"memberId": added["memberId"]}})).json()
    request = f"{base}/{created['requestId']}"
    for step, body in (("verify", {"method": "id-document", "verifiedBy": "dpo"}),
                       ("discover", None), ("decide", {"holds": [], "reason": "none applies"}),
                       ("execute", None)):
        answered = await one.post(f"{request}/{step}", headers=ADMIN, json=body)
        assert answered.status_code == 200, (step, answered.text)
    view: dict[str, object] = {}

    async def completed() -> bool:
        view.update((await two.get(request, headers=ADMIN)).json())
        assert view["status"] != "failed", view
        return view["status"] == "completed"

    await eventually(completed, timeout=60)
    nodes = {e["layer"]: e["nodes"] for e in view["evidence"]}  # type: ignore[attr-defined]
    assert nodes["memory_store"] == [homes_of["storage.p0"]]
    assert nodes["vector_index"] == sorted({homes_of["indexer.p0"], homes_of["embedder.p0"]})
    assert nodes["eval_exports"] == nodes["backups"] == [homes_of["keys"]]
    assert nodes["traces_logs"] == []


async def _eventually_connected(url: str, token: str,
                                login: dict[str, str]) -> MemgateClient:
    for _ in range(60):
        if (agent := await _agent_on(url, token, login)) is not None:
            return agent
        await asyncio.sleep(0.5)
    raise AssertionError(f"the agent's login never worked on {url}")


def _none() -> object:
    raise AssertionError("no lease")


async def _agent_on(url: str, token: str, login: dict[str, str]) -> MemgateClient | None:
    try:
        return await MemgateClient.connect(url, token, nats_seed=login["seed"],
                                           inbox_prefix=login["inboxPrefix"], timeout=5.0)
    except Exception:  # the node has not loaded the new login yet
        return None


class Node:
    """One `memgate up` node that the test can kill -9 (its whole process tree) and start
    again on the same data directory and ports."""

    def __init__(self, tmp_path: Path, n: int, cluster_ports: list[int],
                 env: dict[str, str] | None = None) -> None:
        self.name = f"n{n}"
        self._env = env or {}
        self.data_dir = tmp_path / self.name
        self.http_port, self.nats_port = free_port(), free_port()
        self._log = tmp_path / f"{self.name}.log"
        self._args = ["--data-dir", str(self.data_dir), "--http", f"127.0.0.1:{self.http_port}",
                      "--nats-port", str(self.nats_port), "--node", self.name,
                      "--cluster", f"127.0.0.1:{cluster_ports[n]}", "--routes",
                      ",".join(f"nats://127.0.0.1:{port}" for port in cluster_ports)]
        self.process: asyncio.subprocess.Process | None = None
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.http_port}", timeout=30)

    async def start(self) -> None:
        if self.http.is_closed:  # stopped before
            self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.http_port}",
                                          timeout=30)
        with self._log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "memgate.adapters", "up", *self._args,
                # the load runs past the hourly remember limit (120) on a fast machine
                env={**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN,
                     "MEMGATE_LIMIT_REMEMBERS_PER_HOUR": "100000", **self._env},
                stdout=log, stderr=log)

    async def kill(self) -> None:
        """kill -9 of the supervisor, its nats-server and every child at once."""
        assert self.process is not None
        tree = [self.process.pid, *children(self.process.pid)]
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await self.process.wait()
        for pid in tree:
            await eventually(lambda pid=pid: _gone(pid), timeout=30)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except TimeoutError:
                await self.kill()
        await self.http.aclose()


async def _gone(pid: int) -> bool:
    return not alive(pid)


async def test_a_node_killed_outright_loses_nothing_acknowledged_and_rejoins(
        tmp_path: Path) -> None:
    cluster_ports = [free_port() for _ in range(NODES)]
    nodes = [Node(tmp_path, n, cluster_ports) for n in range(NODES)]
    try:
        for one_node in nodes:
            await one_node.start()
        for one_node in nodes:
            await eventually(lambda n=one_node: healthy(n.http), timeout=150)
        created = (await nodes[0].http.post("/api/admin/workspaces", json={"name": "acme"},
                                            headers=ADMIN)).json()
        ws, owner = created["workspaceId"], {
            "Authorization": f"Bearer {created['owner']['memberToken']}"}
        await nodes[0].http.put(f"/api/w/{ws}/ask-history/settings", headers=owner,
                                json={"agentMemoriesEnabled": True})
        token = (await nodes[0].http.post(f"/api/w/{ws}/credentials", headers=owner, json={
            "name": "bot", "scopes": ["memory:read", "memory:write"]})).json()["token"]
        agent = {"Authorization": f"Bearer {token}"}
        status = (await nodes[0].http.get("/api/admin/cluster", headers=ADMIN)).json()
        homes = {s["name"]: s["home"] for s in status["stores"]}
        home = next(n for n in nodes if n.name == homes["storage.p0"])
        others = [n for n in nodes if n is not home]
        acked: dict[str, str] = {}

        async def remember_through(through: Node, stop: asyncio.Event) -> int:
            refused = 0
            while not stop.is_set():
                await asyncio.sleep(0.02)
                text = f"note {len(acked)} {refused} through {through.name}"
                try:
                    answer = await through.http.post("/api/agent/v1/memories/remember",
                                                     headers=agent,
                                                     json={"namespace": "n", "text": text},
                                                     timeout=15)
                except httpx.TransportError:
                    refused += 1
                    continue
                if answer.status_code == 200:
                    acked[answer.json()["memoryId"]] = text
                else:
                    refused += 1
            return refused

        async def listed(through: Node) -> dict[str, str]:
            found: dict[str, str] = {}
            cursor = None
            while True:
                page = (await through.http.post(
                    "/api/agent/v1/memories/list", headers=agent,
                    json={"namespace": "n", "limit": 100, "cursor": cursor})).json()
                for memory in page["memories"]:
                    assert memory["memoryId"] not in found  # none twice
                    found[memory["memoryId"]] = memory["text"]
                if not (cursor := page.get("nextCursor")):
                    return found

        async def load_through(through: Node, seconds: float, *,
                               meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
            """Remember through `through` for `seconds`, running `meanwhile` one second in."""
            stop = asyncio.Event()
            load = asyncio.create_task(remember_through(through, stop))
            await asyncio.sleep(1)
            if meanwhile is not None:
                await meanwhile()
            await asyncio.sleep(seconds - 1)
            stop.set()
            await load

        # a node that keeps no store: killed mid-load, the others go on, it comes back
        spare, survivor = others
        await load_through(survivor, 3, meanwhile=spare.kill)
        await spare.start()
        await eventually(lambda: healthy(spare.http), timeout=120)
        assert await listed(spare) == acked

        # the node that keeps the store: killed mid-load, nothing acknowledged is lost, and its
        # store is served again once it is back (its disk is the only copy: no standby yet)
        await load_through(survivor, 2, meanwhile=home.kill)
        await home.start()
        await eventually(lambda: healthy(home.http), timeout=120)
        before = len(acked)
        await load_through(survivor, 1)
        assert len(acked) > before  # writes resumed
        assert await listed(survivor) == acked
        assert await listed(home) == acked
    finally:
        for one_node in nodes:
            await one_node.stop()
