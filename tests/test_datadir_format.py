"""A data directory made by the release before formats (`tests/fixtures/datadir-format0.tar.gz`,
made by commit 643fde7 with `tests/fixtures/make_datadir.py`) under today's `memgate up`: migrated
once, with every memory, token, space and session still served; a directory of a newer format
refused in one line with nothing in it touched, by `memgate up` and by the commands that read a
directory themselves; a migration killed half-way finished by the next start."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tarfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from memgate.app import dataformat
from memgate.app.dataformat import FormatError
from tests.conftest import ADMIN_TOKEN, free_port

FIXTURES = Path(__file__).parent / "fixtures"
MADE = json.loads((FIXTURES / "datadir-format0.json").read_text())
START_TIMEOUT_S = 100.0  # under the suite's 120 s: a loaded machine starts slowly


def unpacked(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURES / "datadir-format0.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


def listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under `root` and `root` itself: size, modification time, mode."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_mode)
            for p in [root, *sorted(root.rglob("*"))]}


def env(nats_port: int) -> dict[str, str]:
    return {**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN, "MEMGATE_NATS_PORT": str(nats_port)}


@asynccontextmanager
async def memgate_up(data: Path, log: Path) -> AsyncIterator[httpx.AsyncClient]:
    """`memgate up` on `data`, its output in `log`, until it serves; stopped cleanly."""
    http_port = free_port()
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "memgate.adapters", "up", "--data-dir", str(data), "--http",
            f"127.0.0.1:{http_port}", env=env(free_port()), stdout=out, stderr=out)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while True:
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


async def ok(http: httpx.AsyncClient, method: str, path: str, token: str,
             body: Any = None) -> Any:
    response = await http.request(method, path, json=body,
                                  headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


async def everything_is_served(http: httpx.AsyncClient) -> None:
    """What the old release was given (the fixture's JSON), read back over REST."""
    listed = await ok(http, "POST", "/api/agent/v1/memories/list", MADE["credential"], {})
    assert sorted(m["text"] for m in listed["memories"]) == sorted(MADE["memories"])
    recalled = await ok(http, "POST", "/api/agent/v1/memories/recall", MADE["credential"],
                        {"query": "what is the staging database called"})
    assert recalled["memories"][0]["text"] == "the staging database is called kiwi"
    settings = await ok(http, "GET", f"/api/w/{MADE['workspaceId']}/ask-history/settings",
                        MADE["ownerToken"])
    assert settings["agentMemoriesEnabled"] is True
    space = MADE["spaceId"]
    assert (await ok(http, "GET", f"/memory/spaces/{space}", MADE["memberToken"]))["id"] == space
    page = await ok(http, "POST", f"/memory/{space}/v3/memories/", MADE["memberToken"],
                    {"filters": {"user_id": "alex"}})
    assert [m["memory"] for m in page["results"]] == [MADE["spaceMemory"]]
    session = f"/memory/{space}/sessions/{MADE['sessionId']}"
    assert (await ok(http, "GET", session, MADE["memberToken"]))["id"] == MADE["sessionId"]
    events = (await ok(http, "GET", f"{session}/events", MADE["memberToken"]))["events"]
    assert MADE["event"] in [e["body"].get("content") for e in events]


def said(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("memgate: ")]


async def test_a_directory_of_the_release_before_formats_is_migrated_and_keeps_everything(
        tmp_path: Path) -> None:
    data = unpacked(tmp_path)
    first = tmp_path / "first.log"
    async with memgate_up(data, first) as http:
        await everything_is_served(http)
    assert said(first)[:4] == [
        f"memgate: migrating {data} from data directory format 0 to 1",
        f"memgate: copied 0 files (0.0 MB) that the steps change into {data}/migrating/copy, "
        "kept until the migration is done",
        "memgate: step 1/1: format 1: stamp the format (the files stay as they are)",
        f"memgate: {data} is data directory format 1"]
    assert json.loads((data / "format.json").read_text()) == {"format": 1}
    assert not (data / "migrating").exists()


async def test_a_directory_in_this_format_starts_without_a_migration(tmp_path: Path) -> None:
    data, log = unpacked(tmp_path), tmp_path / "again.log"
    dataformat.migrate(data, say=print)  # as the first start of this memgate left it (above)
    stamped = (data / "format.json").stat().st_mtime_ns
    async with memgate_up(data, log) as http:
        await everything_is_served(http)
    assert not [line for line in said(log) if "format" in line]  # nothing to migrate
    assert (data / "format.json").stat().st_mtime_ns == stamped


async def cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memgate.adapters", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env(free_port()))
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_newer_directory_is_refused_in_one_line_and_left_untouched(
        tmp_path: Path) -> None:
    data = unpacked(tmp_path)
    (data / "format.json").write_text('{"format": 2}')
    before = listing(data)
    refusal = (f"memgate: {data} is data directory format 2, this memgate reads formats up to 1:"
               " upgrade memgate to a release that reads format 2, or restore a backup taken "
               "before the upgrade into a new directory\n")
    route = f"127.0.0.1:{free_port()}"
    commands = (["up", "--data-dir", str(data), "--http", f"127.0.0.1:{free_port()}"],
                ["up", "--data-dir", str(data), "--node", "n1", "--cluster", route, "--routes",
                 f"nats://{route}"],
                ["backup", "--data-dir", str(data), "--out", str(tmp_path / "b.jsonl")],
                ["audit", "verify", "--data-dir", str(data)],
                ["actors", "--only", "audit", "--nats", "nats://127.0.0.1:9", "--data-dir",
                 str(data)])
    answers = await asyncio.gather(*(cli(*command) for command in commands))
    assert answers == [(1, "", refusal)] * len(commands)
    assert listing(data) == before
    assert not (tmp_path / "b.jsonl").exists()


def test_a_migration_killed_half_way_is_finished_by_the_next_start(tmp_path: Path) -> None:
    data = unpacked(tmp_path)
    (data / "migrating" / "copy").mkdir(parents=True)  # copied, then killed before step 1 ended
    (data / "migrating" / "state.json").write_text(
        '{"from": 0, "to": 1, "copied": true, "done": []}')
    with pytest.raises(FormatError, match="did not finish: run `memgate up` on it"):
        dataformat.check(data)  # the commands that read a directory as it is
    said: list[str] = []
    dataformat.migrate(data, say=said.append)  # what `memgate up` does once it holds the lock
    assert said == [f"resuming the migration of {data} from data directory format 0 to 1",
                    "step 1/1: format 1: stamp the format (the files stay as they are)",
                    f"{data} is data directory format 1"]
    assert json.loads((data / "format.json").read_text()) == {"format": 1}
    assert not (data / "migrating").exists()
