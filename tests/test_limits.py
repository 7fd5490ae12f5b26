"""Limits of SPEC §3.9 hold exactly, also with several governance processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from memgate.contracts.errors import AgentMemoryFullError, RateLimitedError
from tests.conftest import Memgate, run_memgate


async def second_governance_process(memgate: Memgate, tmp_path: Path) -> asyncio.subprocess.Process:
    """`memgate actors --only governance`, joined to the test's NATS as a separate process."""
    env = {
        **os.environ,
        "MEMGATE_NATS_USER": memgate.bus.login("governance")["user"],
        "MEMGATE_NATS_PASSWORD": memgate.bus.login("governance")["password"],
        "MEMGATE_DATA_DIR": str(tmp_path / "second"),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "memgate.adapters",
        "actors",
        "--only",
        "governance",
        "--nats",
        memgate.nats_url,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)  # printed once it listens
    assert b"governance" in line
    return process


async def test_the_121st_remember_in_an_hour_is_refused_across_two_governance_processes(
    memgate: Memgate, tmp_path: Path
) -> None:
    second = await second_governance_process(memgate, tmp_path)
    try:
        owner = await memgate.workspace()
        agent = await memgate.agent("bus", await memgate.credential(owner))

        async def remember(i: int) -> str:
            try:
                await agent.remember("load", f"note number {i}")
            except RateLimitedError as refused:
                return "refused" if refused.details["retryAfterSeconds"] > 0 else "no retry-after"
            return "ok"

        outcomes = await asyncio.gather(*(remember(i) for i in range(125)))
        assert outcomes.count("ok") == 120
        assert outcomes.count("refused") == 5
        assert len((await agent.list(limit=100)).memories) == 100
        await agent.close()
    finally:
        second.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(second.wait(), 30) == 0


async def test_rest_says_when_to_retry(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    headers = {"Authorization": f"Bearer {token}"}
    for i in range(120):
        response = await memgate.http.post(
            "/api/agent/v1/memories/remember",
            headers=headers,
            json={"namespace": "n", "text": f"note {i}"},
        )
        assert response.status_code == 200
    refused = await memgate.http.post(
        "/api/agent/v1/memories/remember",
        headers=headers,
        json={"namespace": "n", "text": "one too many"},
    )
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "AGENT_MEMORY_RATE_LIMITED"
    assert 0 < int(refused.headers["Retry-After"]) <= 3600


async def test_versions_are_capped_per_member_and_forgetting_frees_room(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, limit_versions_per_member=3)
        owner = await memgate.workspace()
        agent = await memgate.agent("rest", await memgate.credential(owner))
        first = await agent.remember("n", "v1", key="k")
        await agent.remember("n", "v2", key="k")  # superseded versions count too
        await agent.remember("n", "other")
        with pytest.raises(AgentMemoryFullError):
            await agent.remember("n", "one too many")
        await agent.forget(memory_id=first.memory_id)
        assert (await agent.remember("n", "room again")).memory_id
        other_member = await memgate.agent(
            "rest", await memgate.credential(await memgate.member(owner))
        )
        assert (await other_member.remember("n", "someone else's quota")).memory_id
