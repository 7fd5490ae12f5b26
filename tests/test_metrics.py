"""`/metrics` of a real `memgate up`: what every process did, added up, for the operator only."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from memgate.app.system import actor_names
from tests.conftest import ADMIN_TOKEN, eventually, run_memgate
from tests.test_processes import Up, memgate_up, new_agent

OPERATOR = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET_WORD = "zanzibarquokka"  # in every text: it must never be a label


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: httpx.AsyncClient) -> Samples:
    response = await http.get("/metrics", headers=OPERATOR)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def labelled(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for sample, labels in samples if sample == name]


async def workspace_agent(http: httpx.AsyncClient) -> tuple[str, str, str]:
    """(workspace id, owner's member token, an agent credential with read and write)."""
    created = (await http.post("/api/admin/workspaces", json={"name": "acme"},
                               headers=OPERATOR)).json()
    ws, member = created["workspaceId"], created["owner"]["memberToken"]
    owner = {"Authorization": f"Bearer {member}"}
    await http.put(f"/api/w/{ws}/ask-history/settings", json={"agentMemoriesEnabled": True},
                   headers=owner)
    token = (await http.post(f"/api/w/{ws}/credentials", headers=owner, json={
        "name": "bot", "scopes": ["memory:read", "memory:write"]})).json()["token"]
    return ws, member, token


async def remember(up: Up, token: str, text: str) -> httpx.Response:
    return await up.http.post("/api/agent/v1/memories/remember", json={
        "namespace": "notes", "text": text}, headers={"Authorization": f"Bearer {token}"})


async def test_metrics_add_up_what_every_process_did_for_each_transport(tmp_path: Path) -> None:
    async with memgate_up(tmp_path / "data", MEMGATE_LIMIT_REMEMBERS_PER_HOUR="4") as up:
        ws, member, token = await workspace_agent(up.http)
        agent = {"Authorization": f"Bearer {token}"}
        stored = [(await remember(up, token, f"{SECRET_WORD} note {i}")).json()["memoryId"]
                  for i in range(4)]
        assert (await remember(up, token, f"{SECRET_WORD} one too many")).status_code == 429
        assert (await remember(up, "not-a-credential", SECRET_WORD)).status_code == 401
        for _ in range(2):
            recalled = await up.http.post("/api/agent/v1/memories/recall", headers=agent,
                                          json={"query": f"{SECRET_WORD} note"})
            assert recalled.status_code == 200
        over_nats = await new_agent(up, up.http)
        await over_nats.remember("notes", f"{SECRET_WORD} over the bus")
        await over_nats.recall(SECRET_WORD)
        await over_nats.close()

        async def all_embedded() -> bool:
            samples = await scrape(up.http)
            return value(samples, "memgate_embedded_after_seconds_count", partition="p0") == 5

        await eventually(all_embedded, timeout=30)
        forgotten = await up.http.post("/api/agent/v1/memories/forget", headers=agent,
                                       json={"memoryId": stored[0]})
        assert forgotten.status_code == 200

        samples = await scrape(up.http)
        commands = "memgate_commands_total"
        assert value(samples, commands, command="remember", transport="rest", code="OK") == 4
        assert value(samples, commands, command="remember", transport="rest",
                     code="AGENT_MEMORY_RATE_LIMITED") == 1
        assert value(samples, commands, command="remember", transport="rest",
                     code="UNAUTHENTICATED") == 1
        assert value(samples, commands, command="recall", transport="rest", code="OK") == 2
        assert value(samples, commands, command="forget", transport="rest", code="OK") == 1
        # an agent's commands over NATS: the remember served by the store process's
        # governance, the recall by the front's
        assert value(samples, commands, command="remember", transport="nats", code="OK") == 1
        assert value(samples, commands, command="recall", transport="nats", code="OK") == 1
        assert value(samples, commands, command="admin.workspaces.create", transport="rest",
                     code="OK") == 2
        assert value(samples, "memgate_command_seconds_count", command="remember",
                     transport="rest") == 6
        assert value(samples, "memgate_command_seconds_bucket", command="recall",
                     transport="rest", le="+Inf") == 2
        # the store process: 6 remembers through group commits (the 429 refused in its
        # group), the rate limit, the file rewritten after the forget
        assert value(samples, "memgate_group_commit_size_sum", actor="storage.p0") == 6
        assert 1 <= value(samples, "memgate_group_commit_size_count", actor="storage.p0") <= 6
        assert value(samples, "memgate_rate_limit_refusals_total",
                     limit="remembersPerHour") == 1
        assert value(samples, "memgate_file_rewrite_seconds_count", file="memories") >= 1
        # the index process: its durable consumers, the embedding
        durables = {labels["durable"] for labels in labelled(samples, "memgate_consumer_pending")}
        assert {"indexer-p0", "embedder-p0"} <= durables

        async def caught_up() -> bool:  # the forget's event applied
            samples = await scrape(up.http)
            return (value(samples, "memgate_embedding_backlog", partition="p0") == 0
                    and value(samples, "memgate_consumer_pending", durable="embedder-p0") == 0
                    and value(samples, "memgate_consumer_pending", durable="indexer-p0") == 0)

        await eventually(caught_up, timeout=30)
        # the erasure KPIs, from the erasure actor at the scrape
        assert value(samples, "memgate_erasure_requests_open") == 0
        assert value(samples, "memgate_erasure_requests_overdue") == 0

        # no label holds a text, a token or an id of a workspace or member
        for (_, labels) in samples:
            for _, label in labels:
                for secret in (SECRET_WORD, token, member, ws, ADMIN_TOKEN, stored[0]):
                    assert secret not in label


async def test_metrics_are_for_the_operator_only(tmp_path: Path) -> None:
    async with memgate_up(tmp_path / "data") as up:
        _, member, token = await workspace_agent(up.http)
        assert (await up.http.get("/metrics")).status_code == 401
        for other in (member, token):  # refused as the erasure KPIs' route refuses them
            headers = {"Authorization": f"Bearer {other}"}
            refused = await up.http.get("/metrics", headers=headers)
            kpis = await up.http.get("/api/admin/erasure-requests/metrics", headers=headers)
            assert refused.status_code == kpis.status_code in (401, 403)
            assert "memgate_" not in refused.text
        assert (await up.http.get("/metrics", headers=OPERATOR)).status_code == 200


async def test_metrics_say_which_actors_answer(tmp_path: Path) -> None:
    """An actor that does not answer (here not started: a store with no owner, in a cluster)
    is 0 in `memgate_actor_ready`, the others 1: what `/healthz` reports as `degraded` is
    seen where the operator's alerts read."""
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, skip=frozenset({"reaper"}))
        samples = await scrape(memgate.http)
    ready = {labels["actor"]: samples[("memgate_actor_ready", frozenset(labels.items()))]
             for labels in labelled(samples, "memgate_actor_ready")}
    assert ready["reaper"] == 0.0
    assert ready["storage.p0"] == ready["governance"] == 1.0
    assert set(ready) == {subject.removeprefix("mem.int.ready.")
                          for subject in actor_names(memgate.settings)}
