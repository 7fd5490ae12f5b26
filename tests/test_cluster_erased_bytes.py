"""Deleted means gone on every node (SPEC §5.4, §6): on a three-node cluster, a forgotten
memory's canary word is in no byte of any node's data directory (its DuckDB files and WALs, its
NATS store, its Tantivy indexes in RAM) once the forget is answered — on the store's home and on
its in-sync standby while they run, on a standby that was down during the forget once it is back
(it deletes its stale copy before it follows again), and on every node after a stop. The same
for an erased member's memory (SPEC §5.2) once the erasure is completed: while the nodes run,
after they stop, and after they start again. The scan first sees each canary on every node (a
scan that finds nothing proves nothing)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.cluster import (
    ADMIN, EVERY_OTHER, NODES, Node, answered, cluster_stores, in_sync, start_cluster,
)
from tests.test_erased_bytes import canary, hits, needles
from tests.test_processes import healthy

pytestmark = pytest.mark.timeout(420)


async def test_a_forgotten_memory_leaves_every_byte_of_every_node(tmp_path: Path) -> None:
    nodes, agent = await start_cluster(tmp_path, EVERY_OTHER)
    try:
        await eventually(lambda: in_sync(nodes[0], ["storage.p0"], NODES - 1), timeout=90)
        stores = await cluster_stores(nodes[0])
        home = next(n for n in nodes if n.name == stores["storage.p0"]["home"])
        up, down = [n for n in nodes if n is not home]
        word = canary()
        wanted = needles(word)
        remembered = await answered(lambda: home.http.post(
            "/api/agent/v1/memories/remember", headers=agent.headers,
            json={"namespace": "n", "text": f"the {word} stays between us"}))
        memory_id = remembered["memoryId"]

        async def on(node_dir: Path, canary: list[bytes] = wanted) -> bool:
            return bool(hits(node_dir, canary))

        async def gone(node_dir: Path, canary: list[bytes] = wanted) -> bool:
            return not hits(node_dir, canary)

        for one_node in nodes:  # the canary reached each node's copy
            await eventually(lambda d=one_node.data_dir: on(d), timeout=30)

        # a standby down during the forget (killed outright: no chance to tidy up)
        await down.kill()
        # (asked again while the standbys record cannot be written: the JetStream leaders the
        # killed node led being elected; a 503 is no answer, and the forget may have been done:
        # asked again, it is then a 404)
        forgotten = await answered(lambda: up.http.post(
            "/api/agent/v1/memories/forget", headers=agent.headers, json={"memoryId": memory_id}),
            done_before=404)
        assert forgotten == {} or forgotten["deleted"] in (0, 1)
        assert memory_id not in await agent.listed(up)
        # answered: gone from the standby's copy at once; from the home's derived stores (text
        # index, vectors) as soon as their consumers delete it, as on one node
        assert hits(up.data_dir, wanted) == [], up.name
        for running in (home, up):
            try:
                await eventually(lambda d=running.data_dir: gone(d), timeout=15)
            except AssertionError as timeout:
                raise AssertionError(f"still on {running.name}: "
                                     f"{hits(running.data_dir, wanted)}") from timeout
        assert hits(down.data_dir, wanted), "the down node's disk still holds its old copy"

        # back, the down node deletes its stale copy and copies the store again
        await down.start()
        await eventually(lambda: healthy(down.http), timeout=150)
        await eventually(lambda: in_sync(up, ["storage.p0"], NODES - 1), timeout=90)
        assert hits(down.data_dir, wanted) == []
        await agent.all_kept(down)

        # an erased member's memory leaves every node too, once the erasure is completed
        erased = needles(canary())
        erase = await a_member_remembering(up, erased)
        for one_node in nodes:
            await eventually(lambda d=one_node.data_dir: on(d, erased), timeout=30)
        await erase()
        for one_node in nodes:
            try:
                await eventually(lambda d=one_node.data_dir: gone(d, erased), timeout=15)
            except AssertionError as timeout:
                raise AssertionError(f"still on {one_node.name}: "
                                     f"{hits(one_node.data_dir, erased)}") from timeout

        # and after every node stopped, and started again
        for one_node in nodes:
            await one_node.stop()
        for one_node in nodes:
            assert hits(one_node.data_dir, wanted + erased) == [], one_node.name
        for one_node in nodes:  # together: JetStream needs a majority
            await one_node.start()
        for one_node in nodes:
            await eventually(lambda n=one_node: healthy(n.http), timeout=150)
        await agent.all_kept(home)
        for one_node in nodes:
            assert hits(one_node.data_dir, wanted + erased) == [], one_node.name
    finally:
        for one_node in nodes:
            await one_node.stop()


async def a_member_remembering(through: Node, wanted: list[bytes]) -> Callable[[], Awaitable[None]]:
    """A member of a new workspace whose agent remembers the canary (`wanted[0]`), and what
    erases the member (SPEC §5.2: verified, discovered, decided, executed) and returns once the
    erasure is completed."""
    created = await answered(lambda: through.http.post(
        "/api/admin/workspaces", json={"name": "erased"}, headers=ADMIN))
    ws = created["workspaceId"]
    owner = {"Authorization": f"Bearer {created['owner']['memberToken']}"}
    await answered(lambda: through.http.put(f"/api/w/{ws}/ask-history/settings", headers=owner,
                                            json={"agentMemoriesEnabled": True}))
    added = await answered(lambda: through.http.post(
        f"/api/w/{ws}/members", headers=owner, json={"name": "Grace", "role": "editor"}))
    member = {"Authorization": f"Bearer {added['memberToken']}"}
    token = (await answered(lambda: through.http.post(
        f"/api/w/{ws}/credentials", headers=member,
        json={"name": "bot", "scopes": ["memory:write"]})))["token"]
    await answered(lambda: through.http.post(
        "/api/agent/v1/memories/remember", headers={"Authorization": f"Bearer {token}"},
        json={"namespace": "n", "text": f"Grace hides the {wanted[0].decode()} key"}))

    async def erase() -> None:
        base = "/api/admin/erasure-requests"
        created = await answered(lambda: through.http.post(base, headers=ADMIN, json={
            "workspaceId": ws, "subject": {"memberId": added["memberId"]}}))
        request = f"{base}/{created['requestId']}"
        for step, body in (("verify", {"method": "id-document", "verifiedBy": "dpo"}),
                           ("discover", None), ("decide", {"holds": [], "reason": "none"}),
                           ("execute", None)):
            await answered(lambda s=step, b=body: through.http.post(
                f"{request}/{s}", headers=ADMIN, json=b))

        async def completed() -> bool:
            status = (await through.http.get(request, headers=ADMIN)).json()["status"]
            assert status != "failed"
            return bool(status == "completed")

        await eventually(completed, timeout=60)

    return erase
