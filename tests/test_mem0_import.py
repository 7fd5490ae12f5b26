"""`memgate import mem0` (issue 45): a real mem0 open-source 2.2.1 store on disk (qdrant local,
built here with `infer=False` and an offline embedder) and a mem0 platform export, imported
into a running memgate through the CLI, then read back through the unmodified `MemoryClient`."""

from __future__ import annotations

import os
import tempfile

# Before mem0 is imported: no analytics, and its files in a temporary folder.
os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-"))

import asyncio
import hashlib
import json
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from mem0 import Memory, MemoryClient
from typer.testing import CliRunner

from memgate.adapters.cli import app
from tests.conftest import Member, Memgate, eventually, run_memgate
from tests.test_mem0 import Space, enable, new_space

USERS = [f"user-{n}" for n in range(6)]
PER_USER = 40
DIMS = 8
EMAIL = "alex.doe@example.com"
TOPICS = ["food", "travel", "work", "health"]


class Hashed(Embeddings):
    """A deterministic embedder that needs no model and no network."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return [b / 255 for b in hashlib.sha256(text.encode()).digest()[:DIMS]]


def mem0_config(root: Path, embedder: dict[str, Any]) -> dict[str, Any]:
    return {"embedder": embedder,
            "vector_store": {"provider": "qdrant", "config": {
                "path": str(root / "qdrant"), "on_disk": True, "embedding_model_dims": DIMS,
                "collection_name": "memories"}},
            "llm": {"provider": "openai", "config": {"api_key": "not-used"}},
            "history_db_path": str(root / "history.db")}


def build_store(root: Path) -> dict[str, dict[str, Any]]:
    """A mem0 store of several users (some memories also of an agent or a run, or of an agent
    or a run alone), with metadata, categories, past timestamps and updates; answers every
    memory as mem0's own get_all shows it, by id."""
    memory = Memory.from_config(mem0_config(root, {"provider": "langchain",
                                                   "config": {"model": Hashed()}}))
    start = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
    for u, user in enumerate(USERS):
        for i in range(PER_USER):
            n = u * PER_USER + i
            metadata: dict[str, Any] = {"n": n, "topic": TOPICS[n % 4]}
            if n % 2:
                metadata["categories"] = [TOPICS[n % 4], "imported"]
            if n % 3:
                metadata["created_at"] = (start + timedelta(hours=n)).isoformat()
            text = f"{user} note {n}: likes {TOPICS[n % 4]} number {n * 7}"
            if n == 5:
                text += f", write to {EMAIL}"
            added = memory.add(text, user_id=user,
                               agent_id="planner" if n % 7 == 0 else None,
                               run_id=f"run-{n % 3}" if n % 11 == 0 else None,
                               metadata=metadata, infer=False)
            if n % 13 == 0:
                memory.update(added["results"][0]["id"], data=f"{text} (revised)")
    for n in range(10):
        memory.add(f"the support bot answers in English, rule {n}", agent_id="support-bot",
                   metadata={"rule": n}, infer=False)
    memory.add(EMAIL, user_id=USERS[0], infer=False)  # nothing left once masked: refused
    memory.add("a plan for 2099", user_id=USERS[1], expiration_date="2099-01-01", infer=False)
    memory.add("an expired plan", user_id=USERS[1], expiration_date="2020-01-01", infer=False)
    shown: dict[str, dict[str, Any]] = {}
    for filters in [*({"user_id": u} for u in USERS), {"agent_id": "support-bot"}]:
        for found in memory.get_all(filters=filters, top_k=1000)["results"]:
            shown[found["id"]] = found
    memory.vector_store.client.close()
    return shown


@pytest.fixture(scope="module")
def mem0_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The store on disk, the config `memgate import mem0` reads it with (no embedding is
    made while listing: an OpenAI embedder that is never called), and mem0's view of it."""
    root = tmp_path_factory.mktemp("mem0-store")
    shown = build_store(root)
    config = root / "mem0.json"
    config.write_text(json.dumps(mem0_config(root, {"provider": "openai", "config": {
        "api_key": "not-used", "embedding_dims": DIMS}})))
    return config, shown


@pytest.fixture
async def memgate(tmp_path: Path) -> AsyncIterator[Memgate]:
    async with AsyncExitStack() as stack:  # the default limits: an import has its own budget
        yield await run_memgate(tmp_path, stack)


async def memgate_import(memgate: Memgate, token: str, *args: str) -> tuple[int, str]:
    """The CLI, as a user runs it (in a thread: the memgate it talks to runs on this loop)."""
    result = await asyncio.to_thread(CliRunner().invoke, app, [
        "import", "mem0", *args, "--url", str(memgate.http.base_url), "--token", token])
    print(result.output)  # the report, for the note
    return result.exit_code, result.output


def instant(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


async def everything(client: MemoryClient, **filters: str) -> dict[str, dict[str, Any]]:
    page = await asyncio.to_thread(client.get_all, filters=filters, page_size=100)
    found = list(page["results"])
    for number in range(2, -(-page["count"] // 100) + 1):
        found += (await asyncio.to_thread(client.get_all, filters=filters, page=number,
                                          page_size=100))["results"]
    return {m["id"]: m for m in found}


async def test_a_mem0_store_imports_with_its_ids_users_metadata_categories_and_timestamps(
        memgate: Memgate, mem0_store: tuple[Path, dict[str, Any]]) -> None:
    config, shown = mem0_store
    space = await new_space(memgate)
    code, output = await memgate_import(memgate, space.owner.token, "--config", str(config),
                                        "--space", space.id)
    assert code == 0, output
    kept = {i: m for i, m in shown.items() if m["memory"] != EMAIL}
    assert (f"{len(shown)} memories read from mem0 (1 more in the store that mem0 does not "
            "show: expired)") in output
    assert f"imported │ {len(kept)}" in output
    assert "AGENT_MEMORY_EMPTY memory" in output and EMAIL not in output

    client = await space.client()
    for user in USERS:
        theirs = {i: m for i, m in kept.items() if m.get("user_id") == user}
        read = await everything(client, user_id=user)
        assert read.keys() == theirs.keys()
        for memory_id, memory in read.items():
            original = theirs[memory_id]
            assert memory["memory"] == original["memory"].replace(EMAIL, "[EMAIL]")
            for name in ("user_id", "agent_id", "run_id"):
                assert memory[name] == original.get(name)
            assert memory["metadata"] == original.get("metadata")
            assert memory["categories"] == (original.get("metadata") or {}).get("categories", [])
            assert instant(memory["created_at"]) == instant(original["created_at"])
            assert instant(memory["updated_at"]) == instant(original["updated_at"])
    [plan] = [m for m in (await everything(client, user_id=USERS[1])).values()
              if m["memory"] == "a plan for 2099"]
    assert plan["expiration_date"] == "2099-01-01"
    bot = await everything(client, agent_id="support-bot")
    assert len(bot) == 10
    revised = [m for m in kept.values() if m["memory"].endswith("(revised)")]
    assert revised and all(m["updated_at"] > m["created_at"] for m in revised)

    found = await asyncio.to_thread(client.search, "likes travel number 63",
                                    filters={"user_id": USERS[0]})
    assert found["results"] and {m["id"] for m in found["results"]} <= kept.keys()
    assert found["results"][0]["memory"] == "user-0 note 9: likes travel number 63"

    again_code, again = await memgate_import(memgate, space.owner.token, "--config",
                                             str(config), "--space", space.id)
    assert again_code == 0, again
    assert "imported │ 0" in again and f"skipped  │ {len(kept)}" in again
    assert len(await everything(client)) == len(kept)


def platform_export(count: int) -> list[dict[str, Any]]:
    """Memories as mem0's platform shows them (get_all, an export): categories of their own."""
    return [{"id": f"5a0e{n:04d}-9d5c-4c38-9b1a-3f2a8c1e{n:04d}", "memory": f"prefers aisle {n}",
             "user_id": f"traveller-{n % 3}", "agent_id": None, "app_id": "booking",
             "metadata": {"source": "chat"}, "categories": ["travel", "preferences"],
             "immutable": False, "expiration_date": None,
             "created_at": f"2024-07-{1 + n % 28:02d}T08:15:00.123456-07:00",
             "updated_at": f"2024-08-{1 + n % 28:02d}T10:00:00-07:00"} for n in range(count)]


async def test_a_platform_export_cut_short_imports_the_rest_when_run_again(
        memgate: Memgate, tmp_path: Path) -> None:
    space = await new_space(memgate)
    memories = platform_export(50)
    memories.append({"id": "no-one", "memory": "about nobody"})  # refused: no user/agent/run
    partial, whole = tmp_path / "partial.json", tmp_path / "export.json"
    partial.write_text(json.dumps({"memories": memories[:20]}))  # as if killed after 20
    whole.write_text(json.dumps({"memories": memories}))
    code, _ = await memgate_import(memgate, space.owner.token, "--export", str(partial),
                                   "--space", space.id, "--batch", "7")
    assert code == 0
    code, output = await memgate_import(memgate, space.owner.token, "--export", str(whole),
                                        "--space", space.id, "--batch", "7")
    assert code == 0
    assert "imported │ 30" in output and "skipped  │ 20" in output
    assert "VALIDATION_ERROR user_id" in output

    client = await space.client()
    read = await everything(client)
    assert len(read) == 50
    first = read[memories[0]["id"]]
    assert (first["user_id"], first["categories"], first["metadata"]) == (
        "traveller-0", ["travel", "preferences"], {"source": "chat"})
    assert instant(first["created_at"]) == instant("2024-07-01T08:15:00.123456-07:00")
    assert instant(first["updated_at"]) == instant("2024-08-01T10:00:00-07:00")
    history = await asyncio.to_thread(client.history, memories[0]["id"])
    assert [h["event"] for h in history] == ["ADD"]

    # an update is a new version of the same id: its own updated_at, the rest kept
    await asyncio.to_thread(client.update, memories[0]["id"], text="prefers the window seat")
    updated = await asyncio.to_thread(client.get, memories[0]["id"])
    assert instant(updated["updated_at"]) > datetime.now(UTC) - timedelta(minutes=1)
    assert instant(updated["created_at"]) == instant(first["created_at"])
    assert (updated["categories"], updated["metadata"]) == (first["categories"],
                                                            first["metadata"])


async def test_imported_text_metadata_and_categories_are_masked_and_bounds_refused(
        memgate: Memgate, tmp_path: Path) -> None:
    space = await new_space(memgate)
    base = {"user_id": "alex", "created_at": "2024-01-02T03:04:05"}
    future = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    export = tmp_path / "export.json"
    export.write_text(json.dumps([
        {**base, "id": "m-1", "memory": f"mail {EMAIL}", "metadata": {"contact": EMAIL},
         "categories": [f"from {EMAIL}"]},
        {**base, "id": "m-2", "memory": "from the future", "created_at": future},
        {**base, "id": "m-3", "memory": "x" * 1001},
        {**base, "id": "m-1", "memory": "the same id again"},
    ]))
    code, output = await memgate_import(memgate, space.owner.token, "--export", str(export),
                                        "--space", space.id)
    assert code == 0 and EMAIL not in output
    assert counted(output, "imported") == 1
    assert "VALIDATION_ERROR created_at" in output and "VALIDATION_ERROR memory" in output
    assert "VALIDATION_ERROR id" in output
    masked = await asyncio.to_thread((await space.client()).get, "m-1")
    assert (masked["memory"], masked["metadata"], masked["categories"]) == (
        "mail [EMAIL]", {"contact": "[EMAIL]"}, ["from [EMAIL]"])
    assert instant(masked["created_at"]) == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_an_import_is_a_space_owners_only_and_creates_a_space_when_none_is_given(
        memgate: Memgate, tmp_path: Path) -> None:
    space: Space = await new_space(memgate)
    editor: Member = await space.member("editor")
    export = tmp_path / "export.json"
    export.write_text(json.dumps(platform_export(3)))
    code, output = await memgate_import(memgate, editor.token, "--export", str(export),
                                        "--space", space.id)
    assert code == 1 and "FORBIDDEN" in output and "imported │ 0" in output

    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    code, output = await memgate_import(memgate, owner.token, "--export", str(export))
    assert code == 0 and "imported │ 3" in output
    created = output.split("memory space ", 1)[1].split()[0]
    host = f"{str(memgate.http.base_url).rstrip('/')}/memory/{created}"
    client = await asyncio.to_thread(MemoryClient, host=host, api_key=owner.token)
    assert len(await everything(client)) == 3


async def test_an_import_killed_half_way_completes_when_run_again_with_nothing_twice(
        memgate: Memgate, tmp_path: Path) -> None:
    space = await new_space(memgate)
    export = tmp_path / "export.json"
    export.write_text(json.dumps(platform_export(300)))
    command = ["import", "mem0", "--export", str(export), "--space", space.id, "--batch", "5",
               "--url", str(memgate.http.base_url), "--token", space.owner.token]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memgate.adapters", *command,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    client = await space.client()

    async def stored() -> int:
        return int((await asyncio.to_thread(client.get_all, page_size=1))["count"])

    try:
        await eventually(lambda: _at_least(stored, 40), timeout=60)
    finally:
        process.send_signal(signal.SIGKILL)
        await process.wait()
    before = await stored()
    assert 40 <= before < 300  # killed half way

    code, output = await memgate_import(memgate, space.owner.token, *command[2:8])
    assert code == 0, output
    imported, skipped = counted(output, "imported"), counted(output, "skipped")
    # a request the kill cut off may still have been stored: it is skipped now
    assert imported + skipped == 300 and before <= skipped < 300
    assert await stored() == 300


def counted(report: str, outcome: str) -> int:
    found = re.search(rf"{outcome} +│ (\d+)", report)
    assert found is not None, report
    return int(found.group(1))


async def _at_least(count: Any, least: int) -> bool:
    return bool(await count() >= least)


async def test_an_import_stopped_by_its_hourly_budget_says_so_and_leaves_adds_their_own(
        tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, limit_imports_per_hour=30)
        space = await new_space(memgate)
        export = tmp_path / "export.json"
        export.write_text(json.dumps(platform_export(50)))
        code, output = await memgate_import(memgate, space.owner.token, "--export",
                                            str(export), "--space", space.id, "--batch", "20")
        assert code == 1  # the second request: 10 stored, 10 refused, and no third one
        assert counted(output, "imported") == 30
        assert re.search(r"refused +│ 10 +│ AGENT_MEMORY_RATE_LIMITED", output)
        assert "stopped: AGENT_MEMORY_RATE_LIMITED (retry after" in output
        assert f"--space {space.id}" in output
        client = await space.client()
        added = await asyncio.to_thread(client.add, "an add of my own", user_id="traveller-0")
        assert added["results"][0]["event"] == "ADD"  # the member's own budget is untouched


def test_a_config_mem0_refuses_stops_the_import_in_one_line_without_its_values(
        tmp_path: Path) -> None:
    config = tmp_path / "mem0.json"
    config.write_text(json.dumps({"vector_store": {"provider": "nosuch", "config": {
        "api_key": "sk-not-to-be-echoed"}}}))
    result = CliRunner().invoke(app, ["import", "mem0", "--config", str(config), "--url",
                                      "http://127.0.0.1:9", "--token", "unused"])
    assert result.exit_code == 1
    assert "memgate import: mem0 cannot open the store: vector_store" in result.output
    assert "sk-not-to-be-echoed" not in result.output
