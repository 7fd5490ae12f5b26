"""`memgate up` as a user runs it: a real process with its embedded nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from memgate.bus import MemgateClient
from tests.conftest import ADMIN_TOKEN, free_port
from tests.test_memories import PERSONAL


@asynccontextmanager
async def memgate_up(
    data_dir: Path, http_port: int, nats_port: int
) -> AsyncIterator[httpx.AsyncClient]:
    env = {**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN, "MEMGATE_NATS_PORT": str(nats_port)}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adapters",
        "up",
        "--data-dir",
        str(data_dir),
        "--http",
        f"127.0.0.1:{http_port}",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
        try:
            for _ in range(600):
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.returncode is None, "memgate up exited early"
                await asyncio.sleep(0.05)
            yield http
        finally:
            process.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_up_serves_everything_and_a_restart_finds_every_memory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    http_port, nats_port = free_port(), free_port()
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with memgate_up(data, http_port, nats_port) as http:
        created = (
            await http.post("/api/admin/workspaces", json={"name": "acme"}, headers=auth)
        ).json()
        ws, owner = created["workspaceId"], created["owner"]["memberToken"]
        owner_auth = {"Authorization": f"Bearer {owner}"}
        await http.put(
            f"/api/w/{ws}/ask-history/settings",
            json={"agentMemoriesEnabled": True},
            headers=owner_auth,
        )
        token = (
            await http.post(
                f"/api/w/{ws}/credentials",
                headers=owner_auth,
                json={"name": "bot", "scopes": ["memory:read", "memory:write"]},
            )
        ).json()["token"]
        nats_agent = (
            await http.post("/api/admin/nats-agents", json={"name": "bot"}, headers=auth)
        ).json()
        login = {"nats_seed": nats_agent["seed"], "inbox_prefix": nats_agent["inboxPrefix"]}
        async with await MemgateClient.connect(
            f"nats://127.0.0.1:{nats_port}", token, **login
        ) as agent:
            await agent.remember("contacts", PERSONAL, key="jane")
            await agent.remember("prefs", "deploys on Fridays")
        # REST commands reach the governance of the front process that took the connection
        # without a trip through the server (`BusClient(local=...)`), refusals included
        memories = "/api/agent/v1/memories"
        bearer = {"Authorization": f"Bearer {token}"}
        stored = await http.post(f"{memories}/remember", headers=bearer,
                                 json={"namespace": "prefs", "text": "reviews on Mondays"})
        assert stored.status_code == 200, stored.text
        recalled = (await http.post(f"{memories}/recall", headers=bearer,
                                    json={"query": "when are reviews"})).json()
        assert recalled["memories"][0]["text"] == "reviews on Mondays"
        refused = await http.post(f"{memories}/recall", headers={"Authorization": "Bearer x"},
                                  json={"query": "reviews"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (401, "UNAUTHENTICATED")
        invalid = await http.post(f"{memories}/recall", headers=bearer, json={"query": ""})
        assert (invalid.status_code, invalid.json()["error"]["code"]) == (400, "VALIDATION_ERROR")
        openapi = (await http.get("/openapi.json")).json()
        assert "/api/agent/v1/memories/remember" in openapi["paths"]

    async with memgate_up(data, http_port, nats_port), await MemgateClient.connect(
        f"nats://127.0.0.1:{nats_port}", token, **login
    ) as agent:
        texts = [m.text for m in (await agent.list()).memories]
    assert texts == [
        "reviews on Mondays",
        "deploys on Fridays",
        "Mail [EMAIL] or call [PHONE], card [CARD], IBAN [BANK_ACCOUNT], id [IL_ID]",
    ]

    for path in data.rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            secrets = (token.encode(), owner.encode(), nats_agent["seed"].encode())
            for clear in (
                b"jane.doe",
                b"415 555 0100",
                b"4111 1111",
                b"GB82",
                b"123456782",
                *secrets,
            ):  # tokens and seeds are kept as hashes / public keys only
                assert clear not in content, f"{clear!r} reached {path.relative_to(data)}"


async def test_an_idle_keep_alive_connection_outlives_the_clients_pool_expiry(
    tmp_path: Path,
) -> None:
    """A pooled client (httpx: 5 s) may reuse a connection idle for up to its expiry; had the
    server closed it first (uvicorn's default: also 5 s), the request would meet a reset."""
    http_port = free_port()
    request = (f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{http_port}\r\n"
               "Connection: keep-alive\r\n\r\n").encode()

    async def answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        return head.split(b"\r\n")[0]

    async with memgate_up(tmp_path / "data", http_port, free_port()):
        reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
        assert await answered(reader, writer) == b"HTTP/1.1 200 OK"
        await asyncio.sleep(6)  # past both 5 s defaults
        assert await answered(reader, writer) == b"HTTP/1.1 200 OK"
        writer.close()


def cli(*args: str, token: str | None = None) -> dict[str, object]:
    env = {**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN}
    if token is not None:
        env["MEMGATE_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-m", "memgate.adapters", "admin", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


async def test_the_admin_command_line_sets_up_an_agent_that_works_on_the_bus(
    tmp_path: Path,
) -> None:
    http_port, nats_port = free_port(), free_port()
    async with memgate_up(tmp_path / "data", http_port, nats_port):
        url = f"http://127.0.0.1:{http_port}"
        created = await asyncio.to_thread(cli, "create-workspace", "acme", "--url", url)
        ws = str(created["workspaceId"])
        owner = str(created["owner"]["memberToken"])  # type: ignore[index]
        await asyncio.to_thread(cli, "settings", ws, "--agent-memories", "--url", url, token=owner)
        credential = await asyncio.to_thread(
            cli,
            "create-credential",
            ws,
            "bot",
            "--scope",
            "memory:read",
            "--scope",
            "memory:write",
            "--url",
            url,
            token=owner,
        )
        login = await asyncio.to_thread(cli, "nats-credential", "bot", "--url", url)
        async with await MemgateClient.connect(
            f"nats://127.0.0.1:{nats_port}",
            str(credential["token"]),
            nats_seed=str(login["seed"]),
            inbox_prefix=str(login["inboxPrefix"]),
        ) as agent:
            await agent.remember("prefs", "set up from the command line")
            assert [m.text for m in (await agent.list()).memories] == [
                "set up from the command line"
            ]
