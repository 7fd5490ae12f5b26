"""The embedded bus only lets agents in through the front door (SPEC §3.1, §6), and each kind
of actor logs in with only the permissions its role needs."""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from memgate.bus import MemgateClient, subjects
from memgate.bus.client import BusClient, Partition
from memgate.contracts import (
    Envelope, ListRequest, ListResult, RememberRequest, RememberResult,
)
from tests.conftest import ADMIN_TOKEN, Memgate, eventually, run_memgate


class Violations:
    """Collects the server's permission errors for one connection."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.changed = asyncio.Event()

    async def callback(self, error: Exception) -> None:
        self.seen.append(str(error))
        self.changed.set()

    async def wait_for(self, fragment: str) -> None:
        while not any(fragment.lower() in seen.lower() for seen in self.seen):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)


async def connect_agent(memgate: Memgate,
                        violations: Violations) -> tuple[NatsClient, dict[str, Any]]:
    credential = await memgate.nats_agent()
    nc = await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                            inbox_prefix=credential["inboxPrefix"], error_cb=violations.callback)
    return nc, credential


async def test_an_agent_connection_cannot_read_events_or_internal_subjects(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    violations = Violations()
    agent_nc, credential = await connect_agent(memgate, violations)
    storage = await nats.connect(memgate.nats_url, **memgate.bus.login("storage"))
    seen_by_agent: list[Msg] = []

    async def collect(msg: Msg) -> None:
        seen_by_agent.append(msg)

    for subject in ("mem.evt.>", "mem.int.>", "$JS.API.>", "_INBOX.>", ">"):
        await agent_nc.subscribe(subject, cb=collect)
        await violations.wait_for(f'subscription to "{subject}"')

    async with await MemgateClient.connect(memgate.nats_url, token, nats_seed=credential["seed"],
                                           inbox_prefix=credential["inboxPrefix"]) as agent:
        remembered = await agent.remember("notes", "the agent may use the front door")
        await eventually(lambda: events_hold(storage, remembered.memory_id))  # the event exists...
        await agent_nc.flush()
        assert seen_by_agent == []  # ...but the agent's subscriptions got nothing

        await agent_nc.publish("mem.int.store.p0.forget", b"{}")
        await violations.wait_for('publish to "mem.int.store.p0.forget"')
        with pytest.raises(nats.errors.Error):
            await agent_nc.jetstream().stream_info("MEM_EVT")
        assert [m.memory_id for m in (await agent.list()).memories] == [remembered.memory_id]
    await agent_nc.close()
    await storage.close()


async def test_a_command_for_a_partition_nobody_serves_is_governed_all_the_same(
        memgate: Memgate) -> None:
    """An agent may send its remember, list and forget for its partition (a cluster's reply
    names it). Told one that nobody serves (it has moved; a single node serves none), the
    command goes to any governance at once, and the agent forgets the name."""
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    credential = await memgate.nats_agent()
    nc = await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                            inbox_prefix=credential["inboxPrefix"])
    with pytest.raises(nats.errors.NoRespondersError):  # allowed, imported, and unserved
        await nc.request(subjects.partitioned(subjects.REMEMBER, "p7"), b"{}", timeout=5)
    partition = Partition()
    bus = BusClient(nc, timeout=5, partition=partition)
    for command, body, result in (
            (subjects.REMEMBER, RememberRequest(namespace="n", text="the moved partition"),
             RememberResult),
            (subjects.LIST, ListRequest(namespace="n"), ListResult)):
        partition.name = "p7"
        answered = await bus.command(command, token, body, result)
        assert partition.name is None  # a single node names no partition
    assert isinstance(answered, ListResult) and len(answered.memories) == 1
    await nc.close()


async def test_without_a_nats_credential_there_is_no_connection(memgate: Memgate) -> None:
    with pytest.raises(nats.errors.Error):
        await nats.connect(memgate.nats_url, allow_reconnect=False, max_reconnect_attempts=0,
                           connect_timeout=2)


async def test_a_revoked_nats_credential_no_longer_connects(memgate: Memgate) -> None:
    credential = await memgate.nats_agent()
    nc = await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                            inbox_prefix=credential["inboxPrefix"])
    await nc.close()
    await memgate.ok("DELETE", f"/api/admin/nats-agents/{credential['agentId']}", ADMIN_TOKEN)
    with pytest.raises(nats.errors.Error):
        await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                           allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)


async def test_only_the_operator_issues_nats_credentials(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    refused = await memgate.admin("POST", "/api/admin/nats-agents", owner.token, {"name": "x"})
    assert refused.status_code == 401


async def stream_messages(nc: NatsClient) -> list[bytes]:
    """Every message in the events stream (read with the storage actor's login)."""
    js = nc.jetstream()
    state = (await js.stream_info("MEM_EVT")).state
    found: list[bytes] = []
    if state.messages == 0:  # an empty stream has no sequence 0 to read
        return found
    for seq in range(max(state.first_seq, 1), state.last_seq + 1):
        try:
            found.append((await js.get_msg("MEM_EVT", seq)).data or b"")
        except NotFoundError:
            continue
    return found


async def events_hold(nc: NatsClient, memory_id: str) -> bool:
    return any(memory_id.encode() in data for data in await stream_messages(nc))


async def embedded_all(nc: NatsClient) -> bool:
    """The embedder has acknowledged every memory event in the stream."""
    js = nc.jetstream()
    last = (await js.stream_info("MEM_EVT")).state.last_seq
    consumer = await js.consumer_info("MEM_EVT", "embedder-p0")
    return consumer.num_ack_pending == 0 and consumer.delivered.stream_seq >= last


async def test_a_forged_reply_subject_is_answered_nowhere(memgate: Memgate) -> None:
    """An agent names an events subject, an internal subject or another agent's inbox as the
    reply subject of its command: the answer reaches none of them (only its own account)."""
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    forger_credential = await memgate.nats_agent()
    forger = await nats.connect(memgate.nats_url, nkeys_seed_str=forger_credential["seed"],
                                inbox_prefix=forger_credential["inboxPrefix"])
    victim_credential = await memgate.nats_agent()
    victim = await nats.connect(memgate.nats_url, nkeys_seed_str=victim_credential["seed"],
                                inbox_prefix=victim_credential["inboxPrefix"])
    stolen = await victim.subscribe(f"{victim_credential['inboxPrefix']}.>")
    await victim.flush()
    storage = await nats.connect(memgate.nats_url, **memgate.bus.login("storage"))

    async def command(text: str, token: str) -> bytes:
        body = {"namespace": "notes", "text": text}
        return Envelope(token=token, body=body).to_json()

    for reply in ("mem.evt.p0.memory", "mem.int.store.p0.remember",
                  f"{victim_credential['inboxPrefix']}.steal"):
        await forger.publish("mem.cmd.remember", await command("forged", "not-a-token"),
                             reply=reply)
        await forger.publish("mem.cmd.remember", await command("forged ok", token), reply=reply)
    answer = await forger.request("mem.cmd.remember", await command("after", token), timeout=10)
    memory_id = json.loads(answer.data)["result"]["memoryId"]

    await eventually(lambda: events_hold(storage, memory_id))
    await eventually(lambda: embedded_all(storage))  # the embedder goes on embedding
    assert [data for data in await stream_messages(storage) if b'"ok"' in data] == []
    await victim.flush()
    with pytest.raises(nats.errors.TimeoutError):
        await stolen.next_msg(timeout=0.2)
    for nc in (forger, victim, storage):
        await nc.close()


# For each kind: subjects outside its role that its login must not publish.
FORBIDDEN = {
    "governance": ["mem.evt.p0.memory", "$JS.API.STREAM.INFO.MEM_EVT", "mem.int.store.p0.purge"],
    "directory": ["mem.evt.p0.memory", "$JS.API.STREAM.INFO.MEM_EVT",
                  "mem.int.store.p0.remember"],
    "registry": ["mem.evt.p0.memory", "mem.int.store.p0.remember", "mem.cmd.remember"],
    "recall": ["mem.evt.p0.memory", "$JS.API.STREAM.INFO.MEM_EVT", "mem.int.dir.principal",
               "mem.int.store.p0.remember", "mem.int.store.p0.purge"],
    "storage": ["mem.cmd.remember", "mem.admin.workspaces.create", "mem.int.nats.reload"],
    "indexer": ["mem.evt.p0.memory", "mem.int.store.p0.remember", "mem.cmd.forget"],
    "embedder": ["mem.evt.p0.memory", "mem.int.store.p0.purge", "mem.cmd.forget"],
    "nats-authority": ["mem.evt.p0.memory", "$JS.API.STREAM.INFO.MEM_EVT",
                       "mem.int.store.p0.remember"],
    "spaces": ["mem.evt.p0.memory", "mem.int.store.p0.remember", "mem.int.recall",
               "mem.int.dir.principal"],
    "erasure": ["mem.evt.p0.memory", "mem.int.store.p0.remember", "mem.int.store.p0.purge",
                "mem.cmd.forget"],
    "sessions": ["mem.evt.p0.memory", "mem.int.store.p0.remember", "mem.int.dir.member",
                 "mem.int.spaces.entity", "mem.cmd.remember"],
    "reaper": ["mem.evt.p0.memory", "mem.int.store.p0.purge", "mem.int.store.p0.forget",
               "mem.int.store.p0.texts", "mem.cmd.forget"],
    "keys": ["mem.evt.p0.memory", "mem.int.store.p0.remember", "mem.int.store.p0.rows",
             "mem.cmd.recall", "mem.int.dir.principal"],
    "audit": ["mem.evt.p0.memory", "mem.int.store.p0.remember", "mem.int.dump.directory.begin",
              "mem.cmd.forget", "mem.int.keys.subject"],
    "space-memories": ["mem.evt.p0.memory", "mem.int.store.p0.purge", "mem.int.dir.principal",
                       "mem.cmd.remember", "mem.int.spaces.subject"],
    "cluster": ["$KV.MEMGATE_LEASES.storage.p0", "$KV.MEMGATE_HOMES.storage.p0",
                "$JS.API.STREAM.INFO.MEM_EVT", "$JS.API.STREAM.DELETE.KV_MEMGATE_LEASES",
                "mem.int.store.p0.remember"],
    "adapter": ["mem.int.store.p0.remember", "mem.evt.p0.memory", "$JS.API.STREAM.INFO.MEM_EVT",
                "mem.int.nats.reload"],
}


async def test_no_kind_of_actor_may_publish_outside_its_role(memgate: Memgate) -> None:
    assert set(FORBIDDEN) == set(memgate.bus.logins)
    for kind, forbidden in FORBIDDEN.items():
        violations = Violations()
        nc = await nats.connect(memgate.nats_url, error_cb=violations.callback,
                                **memgate.bus.login(kind))
        for subject in forbidden:
            await nc.publish(subject, b"{}")
            await violations.wait_for(f'publish to "{subject}"')
        await nc.close()


async def test_a_nats_login_the_server_did_not_apply_is_not_issued(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, skip=frozenset({"nats-authority"}))
        refused = await memgate.admin("POST", "/api/admin/nats-agents", ADMIN_TOKEN,
                                      {"name": "agent"})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "UNAVAILABLE"
        directory = await nats.connect(memgate.nats_url, **memgate.bus.login("nats-authority"))
        known = await directory.request("mem.int.dir.nats_agents", b"{}", timeout=5)
        assert json.loads(known.data)["result"]["agents"] == []  # nothing reported as issued
        await directory.close()


async def test_nats_login_prints_the_login_a_kind_of_actor_uses(memgate: Memgate) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memgate.adapters", "nats-login", "governance",
        "--data-dir", str(memgate.settings.data_dir), stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    printed = dict(line.split("=", 1) for line in out.decode().split())
    login = memgate.bus.login("governance")
    assert printed == {"MEMGATE_NATS_USER": login["user"],
                       "MEMGATE_NATS_PASSWORD": login["password"]}
