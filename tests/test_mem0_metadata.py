"""mem0's metadata, expiration_date and timestamp (SPEC §4.4), with the real, unmodified
`mem0ai` client against a running memgate: metadata kept masked like the text (§3.2), shown on
every read, filtered with mem0's operators, bounded (§3.10 errors), and governed like the text:
gone from every byte after a forget or an erasure (§5.4), sealed in backups; an expiration date
honoured by the reaper (§3.9); a timestamp shown as the memory's created_at."""

from __future__ import annotations

import os
import tempfile

# Before mem0 is imported: no analytics, and its config file in a temporary folder.
os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-"))

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mem0 import MemoryClient
from mem0.exceptions import ValidationError

from tests.conftest import Memgate, eventually, run_memgate
from tests.test_backup import ok
from tests.test_erased_bytes import canary, hits, needles, reaper_on
from tests.test_erasure import erase
from tests.test_mem0 import EMAIL, Space, new_space, texts

USER = "64b7f0c2a1b2c3d4e5f607cc"  # an end user of a space, erased below


@pytest.fixture
async def memgate(tmp_path: Path) -> AsyncIterator[Memgate]:
    async with AsyncExitStack() as stack:
        yield await run_memgate(tmp_path, stack)


async def call(function: Any, *args: Any, **kwargs: Any) -> Any:
    """A call of the (blocking) mem0 client, off the loop that serves it."""
    return await asyncio.to_thread(function, *args, **kwargs)


async def add(client: MemoryClient, text: str, user_id: str = "alex", **options: Any) -> str:
    [memory] = (await call(client.add, text, user_id=user_id, **options))["results"]
    return str(memory["id"])


def tomorrow() -> str:
    return (datetime.now(UTC) + timedelta(days=1)).date().isoformat()


async def test_metadata_is_kept_masked_and_shown_on_every_read(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    sent = {"source": "chat", "contact": EMAIL, "tags": ["tea", f"mail {EMAIL}"],
            "score": 3, "private": False, "nested": {"phone": "+972-54-123-4567"}}
    masked = {"source": "chat", "contact": "[EMAIL]", "tags": ["tea", "mail [EMAIL]"],
              "score": 3, "private": False, "nested": {"phone": "[PHONE]"}}
    added = await call(client.add, "I like green tea", user_id="alex", metadata=sent)
    [memory] = added["results"]
    assert memory["metadata"] == masked
    tea = memory["id"]

    assert (await call(client.get, tea))["metadata"] == masked
    [listed] = (await call(client.get_all, filters={"user_id": "alex"}))["results"]
    assert listed["metadata"] == masked
    [found] = (await call(client.search, "green tea", filters={"user_id": "alex"}))["results"]
    assert found["metadata"] == masked
    data = memgate.settings.data_dir
    assert hits(data, [b"I like green tea"]), "the scan sees the stored text"
    assert hits(data, [EMAIL.encode(), b"123-4567"]) == []  # nothing unmasked on disk

    await call(client.update, tea, text="I like jasmine tea")  # metadata kept
    assert (await call(client.get, tea))["metadata"] == masked
    await call(client.update, tea, metadata={"source": "mail", "by": EMAIL})  # replaced
    got = await call(client.get, tea)
    assert (got["memory"], got["metadata"]) == ("I like jasmine tea",
                                                {"source": "mail", "by": "[EMAIL]"})
    history = await call(client.history, tea)
    assert [(h["new_memory"], h["metadata"]) for h in history] == [
        ("I like green tea", masked), ("I like jasmine tea", masked),
        ("I like jasmine tea", {"source": "mail", "by": "[EMAIL]"})]

    bike = await add(client, "I ride a bike")
    assert (await call(client.get, bike))["metadata"] is None
    await call(client.batch_update, [{"memory_id": bike, "metadata": {"source": "batch"}},
                                     {"memory_id": tea, "text": "I like white tea"}])
    assert (await call(client.get, bike))["metadata"] == {"source": "batch"}
    got = await call(client.get, tea)
    assert (got["memory"], got["metadata"]) == ("I like white tea",
                                                {"source": "mail", "by": "[EMAIL]"})


async def tagged(space: Space) -> tuple[MemoryClient, dict[str, str]]:
    """Five memories of two users, with metadata to filter on; their ids by name."""
    client = await space.client()
    ids = {}
    for name, user, metadata in [
            ("tea", "alex", {"kind": "drink", "stars": 5, "note": "Green Tea daily",
                             "tags": ["hot", "morning"]}),
            ("coffee", "alex", {"kind": "drink", "stars": 2, "note": "black coffee"}),
            ("bike", "alex", {"kind": "sport", "stars": 4, "note": "every Sunday"}),
            ("swim", "sam", {"kind": "sport", "stars": 3, "vip": True}),
            ("plain", "sam", None)]:
        options = {} if metadata is None else {"metadata": metadata}
        ids[name] = await add(client, f"the {name} memory", user, **options)
    return client, ids


async def test_each_filter_operator_selects_by_metadata(memgate: Memgate) -> None:
    client, ids = await tagged(await new_space(memgate))
    names = {v: k for k, v in ids.items()}

    async def listed(filters: dict[str, Any]) -> list[str]:
        page = await call(client.get_all, filters=filters)
        assert page["count"] == len(page["results"])
        return sorted(names[r["id"]] for r in page["results"])

    assert await listed({"kind": "drink"}) == ["coffee", "tea"]
    assert await listed({"metadata": {"kind": "drink"}}) == ["coffee", "tea"]
    assert await listed({"kind": {"eq": "sport"}}) == ["bike", "swim"]
    assert await listed({"kind": {"ne": "sport"}}) == ["coffee", "plain", "tea"]
    assert await listed({"kind": {"in": ["sport", "food"]}}) == ["bike", "swim"]
    assert await listed({"kind": {"nin": ["sport"]}}) == ["coffee", "plain", "tea"]
    assert await listed({"stars": {"gt": 3}}) == ["bike", "tea"]
    assert await listed({"stars": {"gte": 3}}) == ["bike", "swim", "tea"]
    assert await listed({"stars": {"lt": 3}}) == ["coffee"]
    assert await listed({"stars": {"lte": 3}}) == ["coffee", "swim"]
    assert await listed({"stars": {"gte": 2, "lt": 5}}) == ["bike", "coffee", "swim"]
    assert await listed({"note": {"contains": "Tea"}}) == ["tea"]
    assert await listed({"note": {"contains": "tea"}}) == []
    assert await listed({"note": {"icontains": "TEA"}}) == ["tea"]
    assert await listed({"tags": {"contains": "hot"}}) == ["tea"]
    assert await listed({"vip": True}) == ["swim"]
    assert await listed({"vip": "*"}) == ["swim"]
    assert await listed({"stars": 5}) == ["tea"]
    assert await listed({"stars": "5"}) == []  # JSON types: a string is not a number
    assert await listed({"user_id": "alex", "kind": "sport"}) == ["bike"]
    assert await listed({"AND": [{"user_id": "sam"}, {"kind": "sport"}]}) == ["swim"]
    assert await listed({"OR": [{"stars": {"gte": 5}}, {"user_id": "sam"}]}) == [
        "plain", "swim", "tea"]
    assert await listed({"NOT": [{"kind": "drink"}]}) == ["bike", "plain", "swim"]
    assert await listed({"AND": [{"user_id": "alex"}, {"NOT": {"stars": {"lt": 3}}}]}) == [
        "bike", "tea"]

    found = await call(client.search, "the memory", filters={"kind": "sport"}, top_k=10)
    assert sorted(names[r["id"]] for r in found["results"]) == ["bike", "swim"]
    found = await call(client.search, "the tea memory",
                       filters={"user_id": "alex", "stars": {"lte": 2}})
    assert [names[r["id"]] for r in found["results"]] == ["coffee"]
    assert (await call(client.search, "tea", filters={"kind": "food"}))["results"] == []

    await call(client.delete_all, filters={"AND": [{"user_id": "alex"}, {"kind": "drink"}]})
    assert await listed({"user_id": "*"}) == ["bike", "plain", "swim"]
    await call(client.delete_all, filters={"stars": {"gte": 3}})
    assert texts((await call(client.get_all))["results"]) == ["the plain memory"]


async def test_a_filter_on_a_masked_value_is_refused_and_placeholders_match(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    mail = await add(client, "write to me", metadata={"contact": EMAIL})
    await add(client, "call me", metadata={"contact": "by phone"})
    for filters in [{"contact": EMAIL}, {"contact": {"in": [EMAIL]}},
                    {"contact": {"icontains": EMAIL}}, {"metadata": {"contact": {"ne": EMAIL}}}]:
        with pytest.raises(ValidationError):  # memgate never kept the value to match
            await call(client.get_all, filters=filters)
        with pytest.raises(ValidationError):
            await call(client.search, "me", filters=filters)
    headers = {"Authorization": f"Token {space.owner.token}"}
    response = await memgate.http.post(f"/memory/{space.id}/v3/memories/", headers=headers,
                                       json={"filters": {"contact": EMAIL}})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "AGENT_MEMORY_PERSONAL_DATA"
    assert EMAIL not in response.text
    [found] = (await call(client.get_all, filters={"contact": {"contains": "[EMAIL]"}}))[
        "results"]
    assert found["id"] == mail
    assert len((await call(client.get_all))["results"]) == 2  # nothing deleted by the refusals


BAD_METADATA: list[tuple[str, Any]] = [
    ("too large", {"note": "x" * 4100}),
    ("too many keys", {f"k{i}": i for i in range(33)}),
    ("too deep", {"a": {"b": {"c": {"d": 1}}}}),
    ("a long key", {"k" * 65: 1}),
    ("an empty key", {"": 1}),
    ("not an object", ["a", "b"]),
    ("a string", "chat"),
]


async def test_oversized_or_malformed_metadata_is_refused_with_the_error_shape(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    tea = await add(client, "I like tea", metadata={"source": "chat"})
    headers = {"Authorization": f"Token {space.owner.token}"}
    base = f"/memory/{space.id}"
    for problem, metadata in BAD_METADATA:
        for method, path, body in [
                ("POST", "/v3/memories/add/", {"messages": [{"role": "user", "content": "hi"}],
                                               "user_id": "alex", "metadata": metadata}),
                ("PUT", f"/v1/memories/{tea}/", {"metadata": metadata}),
                ("PUT", "/v1/batch/", {"memories": [{"memory_id": tea,
                                                     "metadata": metadata}]})]:
            response = await memgate.http.request(method, base + path, headers=headers,
                                                  json=body)
            assert response.status_code == 400, (problem, path, response.text)
            error = response.json()["error"]
            assert error["code"] == "VALIDATION_ERROR", (problem, path)
            assert error["message"] and isinstance(error["details"], dict), (problem, path)
    response = await memgate.http.post(  # NaN is no JSON number: refused, never a 500
        base + "/v3/memories/add/", headers=headers | {"Content-Type": "application/json"},
        content=b'{"messages": [{"content": "hi"}], "user_id": "a", "metadata": {"x": NaN}}')
    assert response.status_code == 400, response.text
    personal = await memgate.http.post(base + "/v3/memories/add/", headers=headers, json={
        "messages": [{"content": "hi"}], "user_id": "a", "metadata": {EMAIL: "x"}})
    assert personal.status_code == 400
    assert personal.json()["error"]["code"] == "AGENT_MEMORY_PERSONAL_DATA"
    assert EMAIL not in personal.text
    with pytest.raises(ValidationError):  # the client's own exception, from the 400
        await call(client.add, "hi", user_id="alex", metadata={"note": "x" * 5000})
    with pytest.raises(ValidationError):
        await call(client.batch_update, [{"memory_id": tea, "metadata": {"a": {"b": {"c": [1]}}}}])
    assert texts((await call(client.get_all))["results"]) == ["I like tea"]
    assert (await call(client.get, tea))["metadata"] == {"source": "chat"}


async def test_an_expiration_date_is_honoured_by_the_reaper(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    soon = await add(client, "a memory for one day", expiration_date=tomorrow())
    kept = await add(client, "a memory kept for the retention")
    got = await call(client.get, soon)
    assert got["expiration_date"] == tomorrow()
    assert (await call(client.get, kept))["expiration_date"] is None

    for bad in ["2026-13-01", "tomorrow", "2026/12/01", "1999-01-01",
                datetime.now(UTC).date().isoformat()]:  # today has begun: in the past
        with pytest.raises(ValidationError):
            await call(client.add, "never stored", user_id="alex", expiration_date=bad)

    now = datetime.now(UTC)
    assert await (await reaper_on(memgate, lambda: now)).sweep() == 0
    later = datetime.now(UTC) + timedelta(days=1, hours=1)  # past the date, within 90 days
    assert await (await reaper_on(memgate, lambda: later)).sweep() == 1
    assert [r["id"] for r in (await call(client.get_all))["results"]] == [kept]

    # an update keeps the date (a new version expires with it), and `None` clears it
    dated = await add(client, "another day", expiration_date=tomorrow())
    await call(client.update, dated, text="another day, changed")
    assert (await call(client.get, dated))["expiration_date"] == tomorrow()
    await call(client.update, dated, expiration_date=None)
    assert (await call(client.get, dated))["expiration_date"] is None
    # the two earlier versions carried the date and go; the current one stays
    assert await (await reaper_on(memgate, lambda: later)).sweep() == 2
    assert len((await call(client.get_all))["results"]) == 2
    assert [h["new_memory"] for h in await call(client.history, dated)] == [
        "another day, changed"]


async def test_a_timestamp_is_shown_as_created_at(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    then = datetime(2024, 3, 1, 12, 30, tzinfo=UTC)
    old = await add(client, "said long ago", timestamp=int(then.timestamp()))
    new = await add(client, "said now")

    def created(memory: dict[str, Any]) -> datetime:
        return datetime.fromisoformat(memory["created_at"])

    got = await call(client.get, old)
    assert created(got) == then
    assert datetime.fromisoformat(got["updated_at"]) > then  # stored now
    assert created(await call(client.get, new)) > then
    listed = {r["id"]: r for r in (await call(client.get_all))["results"]}
    assert created(listed[old]) == then
    [found] = (await call(client.search, "said long ago", top_k=1))["results"]
    assert (found["id"], created(found)) == (old, then)
    await call(client.update, old, text="said long ago, changed")
    assert created(await call(client.get, old)) == then
    assert datetime.fromisoformat((await call(client.history, old))[0]["created_at"]) == then

    future = int((datetime.now(UTC) + timedelta(hours=1)).timestamp())
    for bad in [future, -1, 10**12]:
        with pytest.raises(ValidationError):
            await call(client.add, "never stored", user_id="alex", timestamp=bad)
    headers = {"Authorization": f"Token {space.owner.token}"}
    response = await memgate.http.post(f"/memory/{space.id}/v3/memories/add/", headers=headers,
                                       json={"messages": [{"content": "x"}], "user_id": "a",
                                             "timestamp": "yesterday"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "VALIDATION_ERROR"
    assert len((await call(client.get_all))["results"]) == 2


async def test_a_metadata_canary_leaves_every_byte_after_a_forget(tmp_path: Path) -> None:
    word, kept = canary(), canary()
    data = tmp_path / "data"
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        space = await new_space(memgate)
        client = await space.client()
        gone = await add(client, "a memory about lockers", metadata={"locker": word})
        await add(client, "a memory about doors", metadata={"door": kept})
        assert hits(data, needles(word)), "the scan sees the canary before the forget"
        await call(client.delete, gone)

        async def erased() -> bool:
            return not hits(data, needles(word))

        await eventually(erased)
    assert hits(data, needles(word)) == []
    async with AsyncExitStack() as stack:  # a second start: the rewrite kept the rest
        memgate = await run_memgate(tmp_path, stack)
        client = await Space(memgate, space.owner, space.id).client()
        [left] = (await call(client.get_all))["results"]
        assert left["metadata"] == {"door": kept}
    assert hits(data, needles(word)) == []
    assert hits(data, needles(kept))


async def test_a_metadata_canary_goes_with_an_erasure_and_is_sealed_in_backups(
        tmp_path: Path) -> None:
    word, kept = canary(), canary()
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        space = await new_space(memgate)
        client = await space.client()
        await add(client, "a memory about lockers", USER, metadata={"locker": word})
        await add(client, "a memory about doors", "other-user", metadata={"door": kept})
        data = memgate.settings.data_dir
    backup = tmp_path / "backup.jsonl"
    await ok("backup", "--data-dir", str(data), "--out", str(backup))
    assert hits(data, needles(word))
    assert not any(n in backup.read_bytes().lower() for n in needles(word))  # sealed

    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        await erase(memgate, {"externalId": USER}, space.owner.workspace_id)
        client = await Space(memgate, space.owner, space.id).client()
        assert [r["metadata"] for r in (await call(client.get_all))["results"]] == [
            {"door": kept}]
    assert hits(data, needles(word)) == []

    restored = tmp_path / "restored"
    await ok("restore", "--data-dir", str(restored / "data"), "--from", str(backup),
             "--keys-from", str(data))
    assert hits(restored, needles(word)) == []  # its key is shredded: not restored
    assert hits(restored, needles(kept))
    async with AsyncExitStack() as stack:
        again = await run_memgate(restored, stack)
        found = await again.ok("POST", f"/memory/{space.id}/v3/memories/", space.owner.token,
                               {"filters": {"door": kept}})
        assert [m["metadata"] for m in found["results"]] == [{"door": kept}]
