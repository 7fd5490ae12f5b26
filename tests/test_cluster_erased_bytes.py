"""Deleted means gone on every node (SPEC §5.4, §6): on a three-node cluster, a forgotten
memory's canary word is in no byte of any node's data directory (its DuckDB files and WALs, its
NATS store, its Tantivy indexes in RAM) once the forget is answered — on the store's home and on
its in-sync standby while they run, on a standby that was down during the forget once it is back
(it deletes its stale copy before it follows again), and on every node after a stop. The scan
first sees the canary on every node (a scan that finds nothing proves nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.cluster import EVERY_OTHER, NODES, answered, cluster_stores, in_sync, start_cluster
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

        async def on(node_dir: Path) -> bool:
            return bool(hits(node_dir, wanted))

        async def gone(node_dir: Path) -> bool:
            return not hits(node_dir, wanted)

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

        # and after every node stopped
        for one_node in nodes:
            await one_node.stop()
        for one_node in nodes:
            assert hits(one_node.data_dir, wanted) == [], one_node.name
    finally:
        for one_node in nodes:
            await one_node.stop()
