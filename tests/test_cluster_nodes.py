"""Three `memgate up` nodes on loopback forming one cluster (SPEC §6, "Many machines"): each
runs its embedded nats-server as a member of one NATS cluster, the streams and buckets keep
three copies, every single-writer actor has one home and one owner in the whole cluster, and a
memory remembered through one node is listed and recalled through another."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import nats
import pytest

from memgate.app.logins import internal_logins
from memgate.app.settings import Settings
from memgate.bus import subjects
from memgate.bus.logins import inbox_prefix
from memgate.cluster.lease import BUCKET, holder, lease_bucket
from memgate.cluster.ownership import HOMES, SINGLE_WRITERS, home_of, homes_bucket
from tests.cluster import (
    ADMIN, EVERY_OTHER, NODES, RESUME_WITHIN_S, STANDBYS, cluster_stores, in_sync, nats_agent,
    start_cluster, until,
)
from tests.conftest import ADMIN_TOKEN, close_nats, eventually, free_port
from tests.test_metrics import scrape, value
from tests.test_processes import healthy

pytestmark = pytest.mark.timeout(300)
VIEW_WITHIN_S = 8.0  # the operator's view reads what it can within its bounds (cluster/view.py)



@asynccontextmanager
async def node(tmp_path: Path, n: int, cluster_ports: list[int]) -> AsyncIterator[
        tuple[httpx.AsyncClient, Path, str]]:
    """`memgate up --node nN --cluster ... --routes ...`: its REST client, data dir, NATS URL.
    The routes name only the two other nodes, the standard NATS form (`tests/cluster.py`'s nodes
    name all three): either form makes a cluster of three, with three copies of everything."""
    data_dir, http_port, nats_port = tmp_path / f"n{n}", free_port(), free_port()
    log = (tmp_path / f"n{n}.log").open("wb")
    routes = ",".join(f"nats://127.0.0.1:{port}" for i, port in enumerate(cluster_ports)
                      if i != n)
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
        lines: list[str] = []

        async def status_shows_every_store() -> bool:  # a read past its bound leaves rows out
            status = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "memgate.adapters", "cluster", "status", "--data-dir",
                str(one_dir), stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "COLUMNS": "200"})
            out, _ = await asyncio.wait_for(status.communicate(), 60)
            assert status.returncode == 0, out.decode()
            lines[:] = out.decode().splitlines()
            return all(any(f" {name} " in line for line in lines) for name in writers)

        await eventually(status_shows_every_store, timeout=60)
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

        # each copied store's standbys as its owner sees them: in sync, nothing behind
        async def standbys_in_sync() -> bool:
            shown = (await two.get("/api/admin/cluster", headers=ADMIN)).json()
            lag = {s["name"]: s["standbys"] for s in shown["stores"]}
            assert lag["indexer.p0"] is None  # rebuilt, never copied
            return all(len(lag[name] or []) == STANDBYS and all(
                s["inSync"] and s["behind"] == 0 for s in lag[name] or [])
                for name in ("storage.p0", "embedder.p0", "directory"))

        await eventually(standbys_in_sync, timeout=60)

        async def status_shows_them_in_sync() -> bool:  # a read past its bound (a loaded
            # machine) leaves its rows out and says so: look again
            status = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "memgate.adapters", "cluster", "status", "--data-dir",
                str(one_dir), stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "COLUMNS": "250"})
            out, _ = await asyncio.wait_for(status.communicate(), 60)
            assert status.returncode == 0, out.decode()
            lines = [line for line in out.decode().splitlines() if " storage.p0 " in line]
            return len(lines) == 1 and lines[0].count("in sync") == STANDBYS

        await eventually(status_shows_them_in_sync, timeout=60)

        # an agent's NATS login, issued through node 1, works on every node
        login_made = (await one.post("/api/admin/nats-agents", json={"name": "bot"},
                                     headers=ADMIN)).json()
        agents = []
        for _, _, url in nodes:
            agents.append(await nats_agent(url, token, login_made))
        stored = await agents[2].remember("n", "the gate code changes on Mondays")
        listed_ids = {m.memory_id for m in (await agents[1].list(namespace="n")).memories}
        assert listed_ids == {memory_id, stored.memory_id}

        # an agent's commands are governed on its partition's node once a reply named it:
        # at most each agent's first plain one is governed elsewhere
        homes_of = {name: (await home_of(homes, name) or {})["node"] for name in writers}
        for connected in agents:
            for i in range(10):
                await connected.remember("n", f"reading {i} of the water meter")
            await connected.list(namespace="n")
        governed = {}
        for n, (http, _, _) in enumerate(nodes):
            samples = await scrape(http)
            governed[f"n{n}"] = sum(value(samples, "memgate_commands_total", command=command,
                                          transport="nats", code="OK")
                                    for command in ("remember", "list"))
        assert sum(governed.values()) == 1 + 1 + NODES * 11, governed
        elsewhere = sum(count for node_name, count in governed.items()
                        if node_name != homes_of["storage.p0"])
        assert elsewhere <= NODES, governed
        for connected in agents:
            await connected.close()

        # an erasure's evidence names the node of every layer's owner
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


def _none() -> object:
    raise AssertionError("no lease")


async def test_a_standby_node_killed_outright_leaves_the_owner_writing_and_copies_again(
        tmp_path: Path) -> None:
    """kill -9 of a whole node that serves nothing (it keeps standby copies) mid-load: the owner
    records it out of sync and goes on; back, it copies every store again."""
    nodes, agent = await start_cluster(tmp_path, EVERY_OTHER)
    try:
        await eventually(lambda: in_sync(nodes[0], ["storage.p0"], NODES - 1), timeout=90)
        serving = (await cluster_stores(nodes[0]))["storage.p0"]["servedBy"]
        spare, survivor = [n for n in nodes if n.name != serving]
        stop = asyncio.Event()
        load = asyncio.create_task(agent.load(survivor, stop))
        await asyncio.sleep(1)
        await spare.kill()
        before = len(agent.acked)

        # the operator's view answers at once every time, and shows the dead node down
        async def shown_down() -> bool:
            started = time.monotonic()
            answer = await survivor.http.get("/api/admin/cluster", headers=ADMIN)
            assert answer.status_code == 200, answer.text
            assert time.monotonic() - started < VIEW_WITHIN_S
            servers = {s["name"]: s["up"] for s in answer.json()["servers"]}
            return servers.get(spare.name) is False and servers.get(survivor.name) is True

        await eventually(shown_down, timeout=RESUME_WITHIN_S)

        async def written() -> bool:  # past the apply's timeout and any JetStream election
            return len(agent.acked) > before + 10

        await until(written, RESUME_WITHIN_S)
        stop.set()
        await load
        assert spare.name not in (await cluster_stores(survivor))["storage.p0"]["inSync"]  # type: ignore[operator]
        await agent.all_kept(survivor)

        await spare.start()
        await eventually(lambda: healthy(spare.http), timeout=150)
        await eventually(lambda: in_sync(survivor, ["storage.p0"], NODES - 1), timeout=90)
        await agent.all_kept(spare)
    finally:
        for one_node in nodes:
            await one_node.stop()
