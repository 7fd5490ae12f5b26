"""Deleted means gone (SPEC §5.4): after a forget, a purge or a cascade completes, a unique canary
word is in no byte of any file under the data directory — DuckDB files and WALs, Tantivy
segments, vectors, JetStream's storage — while memgate runs, after a graceful stop, and after a
second start and stop. The scan is checked to see the canary before the deletion (a scan that
finds nothing anywhere proves nothing); Tantivy's term dictionary, whose FST need not keep a
term's bytes together, is also asked for the term; the memory's vector is looked for by its
bytes too."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
import tantivy

from memgate.actors.reaper import ReaperActor
from memgate.app.ram import text_index_root
from memgate.bus.connections import KindConnections
from memgate.contracts.errors import MemgateError, NotFoundError
from tests.agents import Agent
from tests.conftest import Member, Memgate, eventually, run_memgate
from tests.test_registry import collection, put_document


def canary() -> str:
    """A unique word: letters only (a run of digits may be masked as a number), short enough
    for Tantivy to index (it drops tokens over 40 bytes)."""
    return "zqxcanary" + uuid.uuid4().hex[:20].translate(str.maketrans("0123456789",
                                                                       "ghijklmnop"))


def needles(word: str) -> list[bytes]:
    """The word, and its first 24 characters (a stemmer may cut its end); matched against
    the bytes as they are and ASCII-lowercased (Tantivy keeps terms lowercase)."""
    return [word.lower().encode(), word[:24].lower().encode()]


def in_ram(data: Path) -> Path:
    """The RAM directory of a data directory's Tantivy indexes (`app/ram.py`; empty when they
    are under the data directory)."""
    return text_index_root(data, "p0", None).parent


def hits(root: Path, wanted: list[bytes]) -> list[str]:
    """The files under `root` holding any of `wanted`; for a data directory, the files of its
    Tantivy indexes in RAM too."""
    found = []
    for path in sorted([*root.rglob("*"), *in_ram(root).rglob("*")]):
        try:
            if not path.is_file():
                continue
            data = path.read_bytes()
        except FileNotFoundError:  # removed while scanned: a rebuild, a compaction
            continue
        if any(n in data or n in data.lower() for n in wanted):
            found.append(str(path.relative_to(root) if root in path.parents else path))
    return found


def indexed(root: Path, word: str, fields: tuple[str, ...] = ("text", "ctx")) -> list[str]:
    """The terms starting with the word's first 24 characters in any live Tantivy index (in
    a memory's own text, or in a conversation turn's context document) of data directory
    `root`."""
    terms: list[str] = []
    for generation in [*root.glob("partitions/*/text-index/*/gen-*"),
                       *in_ram(root).glob("*/*/gen-*")]:
        try:
            if not (generation / "READY").exists():
                continue
            searcher = tantivy.Index.open(str(generation)).searcher()
            terms += [t for field in fields
                      for t, _ in searcher.terms_with_prefix(field, word[:24])]
        except (FileNotFoundError, ValueError, OSError):  # replaced while opened: ask again
            return [f"{generation} (unreadable, retry)"]
    return terms


def vector_of(data: Path, memory_id: str) -> bytes | None:
    """The memory's vector as stored. In this process the embedder's database is open, so
    `connect` joins it; closed at once (a compaction must be able to close the file)."""
    db = duckdb.connect(str(data / "partitions/p0/vectors.duckdb"))
    try:
        row = db.execute("SELECT vec FROM vectors WHERE memory_id = ?", [memory_id]).fetchone()
    finally:
        db.close()
    return None if row is None else bytes(row[0])


@dataclass
class World:
    memgate: Memgate
    owner: Member
    member: Member
    agent: Agent
    word: str
    memory_ids: list[str] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)


Setup = Callable[[World], Awaitable[None]]
Delete = Callable[[World], Awaitable[None]]


async def start(tmp_path: Path, stack: AsyncExitStack) -> Memgate:
    return await run_memgate(tmp_path, stack)


async def remember_one(world: World) -> None:
    result = await world.agent.remember("notes", f"the vault word is {world.word} for now")
    world.memory_ids.append(result.memory_id)


def in_store(world: World) -> list[str]:
    """The memory store's files (DuckDB file, WAL) holding the canary."""
    data = world.memgate.settings.data_dir
    return [f for f in hits(data, needles(world.word)) if "/memories.duckdb" in f]


async def erased(tmp_path: Path, setup: Setup, delete: Delete, *,
                 restart_before_delete: bool = False) -> None:
    """Set up a canary memory (recalled, so it passes the index, the embedder and any cache),
    delete it, and scan every byte while running, after a stop, and after a restart."""
    data = tmp_path / "data"
    word, kept_word = canary(), canary()
    stack = AsyncExitStack()
    try:
        memgate = await start(tmp_path, stack)
        owner = await memgate.workspace()
        member = await memgate.member(owner)
        agent = await memgate.agent("rest", await memgate.credential(member))
        world = World(memgate, owner, member, agent, word)
        await setup(world)
        other = await memgate.workspace()  # untouched by every deletion below
        other_agent = await memgate.agent("rest", await memgate.credential(other))
        kept = await other_agent.remember("notes", f"the other word is {kept_word}")
        recalled = await agent.recall(word)
        assert world.memory_ids[-1] in {m.memory_id for m in recalled.memories}
        vectors: list[bytes] = []

        async def embedded() -> bool:
            vectors[:] = [v for i in world.memory_ids if (v := vector_of(data, i)) is not None]
            return len(vectors) == len(world.memory_ids)

        await eventually(embedded)
        wanted = needles(word) + [v[:64] for v in vectors]
        assert hits(data, needles(word)), "the scan sees the canary before it is deleted"
        assert hits(data, [v[:64] for v in vectors]), "and the vectors"
        assert indexed(data, word)
        assert hits(data / "nats", [world.memory_ids[-1].encode()]), "JetStream is scanned"
        if restart_before_delete:  # the rows now sit in the checkpointed files, not the WALs
            await stack.aclose()
            stack = AsyncExitStack()
            world.memgate = memgate = await start(tmp_path, stack)
            world.agent = await memgate.agent("rest", await memgate.credential(member))
            assert hits(data, needles(word))
        await delete(world)

        async def erased_while_running() -> bool:
            return not hits(data, wanted) and not indexed(data, word)

        try:
            await eventually(erased_while_running)
        except AssertionError as timeout:
            raise AssertionError(f"still there: {hits(data, wanted)}, {indexed(data, word)}"
                                 ) from timeout
    finally:
        await stack.aclose()
    assert hits(data, wanted) == []
    assert indexed(data, word) == []
    async with AsyncExitStack() as stack:  # a second start and stop
        memgate = await start(tmp_path, stack)
        other_agent = await memgate.agent("rest", await memgate.credential(other))
        assert [m.memory_id for m in (await other_agent.recall(kept_word)).memories][:1] == [
            kept.memory_id]  # the rewrites kept what was not deleted
        assert hits(data, wanted) == []
    assert hits(data, wanted) == []
    assert hits(data, needles(kept_word))


async def test_forget_by_id(tmp_path: Path) -> None:
    async def forget(world: World) -> None:
        [memory_id] = world.memory_ids
        assert (await world.agent.forget(memory_id=memory_id)).deleted == 1
        assert in_store(world) == []  # the reply comes once the file is rewritten


    await erased(tmp_path, remember_one, forget)


async def test_a_forget_asked_again_answers_once_the_first_tries_bytes_are_gone(
        tmp_path: Path) -> None:
    """A first try deletes the row but its file's rewrite fails (here a directory stands where
    the fresh copy goes; in a cluster, a standby record that cannot be written answers 503 the
    same way): that try answers an error, and the row is still in the file's bytes. Asked
    again, the forget finds nothing: its 404 comes only once the file is rewritten."""
    async with AsyncExitStack() as stack:
        memgate = await start(tmp_path, stack)
        agent = await memgate.agent("rest", await memgate.credential(await memgate.workspace()))
        word = canary()
        memory_id = (await agent.remember("notes", f"the vault word is {word}")).memory_id
        store = memgate.settings.data_dir / "partitions" / "p0" / "memories.duckdb"

        def in_the_store() -> list[str]:
            return [f for f in hits(store.parent, needles(word)) if "memories.duckdb" in f]

        blocker = store.with_name(store.name + ".compact")
        blocker.mkdir()
        with pytest.raises(MemgateError) as failed:
            await agent.forget(memory_id=memory_id)
        assert not isinstance(failed.value, NotFoundError)
        assert in_the_store(), "the failed rewrite left the row's bytes"
        blocker.rmdir()
        with pytest.raises(NotFoundError):
            await agent.forget(memory_id=memory_id)
        assert in_the_store() == []


async def test_forget_of_a_conversation_turn(tmp_path: Path) -> None:
    """A turn's words are in its neighbours' context documents too (the context channel):
    forgetting it takes them out of those as well."""
    async def turns(world: World) -> None:
        await world.agent.remember("chat", "Alice: Did you pick the vault word?")
        result = await world.agent.remember("chat", f"Bob: Yes, it is {world.word} for now.")
        await world.agent.remember("chat", "Alice: Great, I will write it down.")
        world.memory_ids.append(result.memory_id)

    async def forget(world: World) -> None:
        data = world.memgate.settings.data_dir
        assert indexed(data, world.word, ("ctx",)), "the turns around it hold its words"
        [memory_id] = world.memory_ids
        assert (await world.agent.forget(memory_id=memory_id)).deleted == 1
        assert in_store(world) == []

        async def neighbours_not_found_by_its_word() -> bool:
            recalled = (await world.agent.recall(world.word)).memories
            return all(m.ranks.context is None and m.ranks.bm25 is None for m in recalled)

        await eventually(neighbours_not_found_by_its_word)

    await erased(tmp_path, turns, forget)


async def test_forget_of_a_key_with_superseded_versions(tmp_path: Path) -> None:
    async def versions(world: World) -> None:
        for version in range(3):
            result = await world.agent.remember("notes", f"plan v{version}: {world.word}",
                                                key="plan")
            world.memory_ids.append(result.memory_id)

    async def forget(world: World) -> None:
        assert (await world.agent.forget(namespace="notes", key="plan")).deleted == 3
        assert in_store(world) == []

    await erased(tmp_path, versions, forget, restart_before_delete=True)


async def test_member_self_delete(tmp_path: Path) -> None:
    async def self_delete(world: World) -> None:
        memgate, member = world.memgate, world.member
        done = await memgate.ok("DELETE", f"/api/w/{member.workspace_id}/ask-history/"
                                "agent-memories", member.token)
        assert done["deleted"] == 1
        assert in_store(world) == []

    await erased(tmp_path, remember_one, self_delete, restart_before_delete=True)


async def test_owner_purge(tmp_path: Path) -> None:
    async def purge(world: World) -> None:
        memgate, owner = world.memgate, world.owner
        done = await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/ask-history/settings/"
                                "agent-memories", owner.token)
        assert done["deleted"] == 1
        assert in_store(world) == []

    await erased(tmp_path, remember_one, purge)


async def reaper_on(memgate: Memgate, now: Callable[[], datetime]) -> ReaperActor:
    """A reaper of our own on the real bus (its kind's login), its clock ours; not started:
    the test sweeps."""
    kinds = KindConnections(memgate.bus, timeout=30)
    await kinds.connect("reaper", memgate.stack)
    return ReaperActor(bus=kinds.client("reaper"), partitions=memgate.settings.partitions,
                       interval_s=3600, now=now)


async def test_retention_purge(tmp_path: Path) -> None:
    async def short_retention(world: World) -> None:
        owner = world.owner
        await world.memgate.ok("PUT", f"/api/w/{owner.workspace_id}/ask-history/settings",
                               owner.token, {"retentionDays": 1})
        await remember_one(world)

    async def reap(world: World) -> None:
        later = datetime.now(UTC) + timedelta(days=2)
        reaper = await reaper_on(world.memgate, lambda: later)
        assert await reaper.sweep() == 1  # the other workspace keeps 90 days
        assert in_store(world) == []

    await erased(tmp_path, short_retention, reap, restart_before_delete=True)


async def test_cascade_from_a_deleted_document(tmp_path: Path) -> None:
    async def citing(world: World) -> None:
        memgate, owner = world.memgate, world.owner
        handbook = await collection(memgate, owner)
        await put_document(memgate, owner, "doc1", handbook)
        result = await world.agent.remember("notes", f"releases: {world.word}",
                                            citations=["doc1-p1"])
        world.memory_ids.append(result.memory_id)

    async def delete_document(world: World) -> None:
        memgate, owner = world.memgate, world.owner
        await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/documents/doc1", owner.token)

    await erased(tmp_path, citing, delete_document)
