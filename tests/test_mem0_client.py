"""Every public method of mem0 2.2.1's `MemoryClient` and `AsyncMemoryClient` against a real
memgate (SPEC §4.4): each works, or answers mem0's own error, as `TABLE` says. The table is the
one docs/mem0-client.md shows (a test checks they are the same), and the client's methods are
the table's rows (a test enumerates them). User profiles: generated through the space's LLM
(`tests/llm_server.py`) as jobs, masked in and out; `not_enabled` without an LLM."""

from __future__ import annotations

import os
import tempfile

# Before mem0 is imported: no analytics, and its config file in a temporary folder.
os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-"))

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mem0 import AsyncMemoryClient, MemoryClient
from mem0.exceptions import MemoryNotFoundError, RateLimitError, ValidationError

from tests.conftest import Llm, Memgate, eventually, run_memgate
from tests.llm_server import PROFILE_EMAIL
from tests.test_backup import ok
from tests.test_erased_bytes import canary, hits, needles
from tests.test_erasure import erase
from tests.test_mem0 import EMAIL, Space, new_space
from tests.test_mem0_metadata import USER

DOC = Path(__file__).parent.parent / "docs" / "mem0-client.md"
SCHEMA = {"type": "object", "properties": {
    "summary": {"type": "string", "description": f"who the user is (ask {EMAIL})"},
    "likes": {"type": "array", "items": {"type": "string"}, "description": "what they like"}}}

Call = Callable[[Any, dict[str, str]], Any]


@dataclass(frozen=True)
class Row:
    method: str
    answer: str  # as docs/mem0-client.md shows it
    call: Call | None  # None: the client itself refuses before any request
    refused: type[Exception] | None = None  # the client's exception, when refused


def unserved(method: str, call: Call) -> Row:
    return Row(method, "404 `NOT_FOUND`, mem0's `detail` names the call: the client raises "
               "`MemoryNotFoundError`", call, MemoryNotFoundError)


WORKS = "works"
TABLE: tuple[Row, ...] = (
    Row("add", WORKS + " (facts through the space's LLM, or verbatim without one)",
        lambda c, ids: c.add("I like rooibos", user_id="alex")),
    Row("get", WORKS, lambda c, ids: c.get(ids["get"])),
    Row("get_all", WORKS + " (`filters`, `page`, `page_size`)",
        lambda c, ids: c.get_all(filters={"user_id": "alex"})),
    Row("search", WORKS + " (`filters`, `top_k`, `threshold`)",
        lambda c, ids: c.search("tea", filters={"user_id": "alex"})),
    Row("update", WORKS, lambda c, ids: c.update(ids["update"], text="I like green tea")),
    Row("delete", WORKS, lambda c, ids: c.delete(ids["delete"])),
    Row("delete_all", WORKS + " (with `user_id`, `agent_id` or `run_id`)",
        lambda c, ids: c.delete_all(user_id="gone")),
    Row("history", WORKS, lambda c, ids: c.history(ids["history"])),
    Row("users", WORKS + " (each `user_id`, `agent_id`, `run_id` memories are about)",
        lambda c, ids: c.users()),
    Row("delete_users", WORKS + " (every memory about the entity; none: 404)",
        lambda c, ids: c.delete_users(user_id="leaving")),
    Row("batch_update", WORKS, lambda c, ids: c.batch_update(
        [{"memory_id": ids["batch"], "text": "I like black tea"}])),
    Row("batch_delete", WORKS, lambda c, ids: c.batch_delete([{"memory_id": ids["batch"]}])),
    unserved("create_memory_export", lambda c, ids: c.create_memory_export("{}")),
    unserved("get_memory_export", lambda c, ids: c.get_memory_export()),
    unserved("get_summary", lambda c, ids: c.get_summary()),
    Row("get_profile", WORKS + " (status `not_enabled`, 200, in a space without an LLM)",
        lambda c, ids: c.get_profile("alex")),
    Row("generate_profile", WORKS + " (a job; in a space without an LLM 422 `UNPROCESSABLE`, "
        "`details.status: not_enabled`: `ValidationError`)",
        lambda c, ids: c.generate_profile("alex")),
    Row("get_profile_settings", WORKS, lambda c, ids: c.get_profile_settings()),
    Row("update_profile_settings", WORKS + " (a JSON object schema, each property described; "
        "else 400 `VALIDATION_ERROR`: `ValidationError`)",
        lambda c, ids: c.update_profile_settings(schema=SCHEMA)),
    Row("sample_profiles", WORKS + " (as generate_profile)",
        lambda c, ids: c.sample_profiles(limit=2)),
    Row("get_profile_job", WORKS + " (a job id or its `status_url`)",
        lambda c, ids: c.get_profile_job(ids["job"])),
    unserved("get_project", lambda c, ids: c.get_project()),
    unserved("update_project", lambda c, ids: c.update_project(custom_instructions="x")),
    Row("chat", "the client raises `NotImplementedError` itself (no request)", None,
        NotImplementedError),
    unserved("get_webhooks", lambda c, ids: c.get_webhooks("p")),
    unserved("create_webhook", lambda c, ids: c.create_webhook(
        "https://example.org/hook", "hook", "p", ["memory_add"])),
    unserved("update_webhook", lambda c, ids: c.update_webhook(1, name="hook")),
    unserved("delete_webhook", lambda c, ids: c.delete_webhook(1)),
    unserved("feedback", lambda c, ids: c.feedback("m", "POSITIVE")),
    Row("reset", WORKS + " (every memory of the space deleted; walked last)",
        lambda c, ids: c.reset()),
)


def table_markdown() -> str:
    lines = ["| method (`MemoryClient` and `AsyncMemoryClient`) | against memgate |",
             "|---|---|"]
    lines += [f"| `{row.method}` | {row.answer} |" for row in TABLE]
    return "\n".join(lines)


def public_methods(cls: type) -> set[str]:
    return {name for name, value in inspect.getmembers(cls)
            if not name.startswith("_") and callable(value)}


@pytest.fixture
async def memgate(tmp_path: Path) -> AsyncIterator[Memgate]:
    async with AsyncExitStack() as stack:
        yield await run_memgate(tmp_path, stack, mem0_llm_timeout_s=5.0)


async def call(function: Any, *args: Any, **kwargs: Any) -> Any:
    """A call of the (blocking) mem0 client, off the loop that serves it."""
    return await asyncio.to_thread(function, *args, **kwargs)


async def prepared(client: MemoryClient) -> dict[str, str]:
    """The memories (and a profile job) the table's calls use, made with the sync client."""
    ids: dict[str, str] = {}
    for name in ("get", "update", "delete", "history", "batch"):
        [added] = (await call(client.add, f"{name}: I drink tea", user_id="alex",
                              infer=False))["results"]
        ids[name] = added["id"]
    await call(client.add, "I am leaving", user_id="gone", infer=False)
    await call(client.add, "I am leaving too", user_id="leaving", infer=False)
    ids["job"] = (await call(client.generate_profile, "alex"))["job_id"]
    return ids


async def walk(client: Any, ids: dict[str, str]) -> None:
    """Each row's call, then each outcome as the row says."""
    outcomes: dict[str, Any] = {}
    for row in TABLE:
        try:
            outcome = getattr(client, row.method)() if row.call is None else row.call(client, ids)
            outcomes[row.method] = await outcome if inspect.isawaitable(outcome) else outcome
        except Exception as error:  # the row says which, checked below
            outcomes[row.method] = error
    for row in TABLE:
        outcome = outcomes[row.method]
        if row.refused is None:
            assert isinstance(outcome, dict | list), (row.method, outcome)
        else:
            assert isinstance(outcome, row.refused), (row.method, outcome)
            if row.refused is MemoryNotFoundError:
                assert "memgate does not serve" in str(outcome), (row.method, outcome)


def test_the_table_names_every_public_method_of_both_clients() -> None:
    names = {row.method for row in TABLE}
    assert public_methods(MemoryClient) == names
    assert public_methods(AsyncMemoryClient) == names


def test_the_docs_show_the_tests_table() -> None:
    assert table_markdown() in DOC.read_text(), "docs/mem0-client.md: paste table_markdown()"


async def test_the_sync_client_walks_the_table(memgate: Memgate, llm: Llm) -> None:
    space = await new_space(memgate, llm)
    client = await space.client()
    await call(walk_sync, client, await prepared(client))


def walk_sync(client: MemoryClient, ids: dict[str, str]) -> None:
    asyncio.run(walk(client, ids))


async def test_the_async_client_walks_the_table(memgate: Memgate, llm: Llm) -> None:
    space = await new_space(memgate, llm)
    ids = await prepared(await space.client())
    client = await space.async_client()
    await walk(client, ids)


async def finished(client: MemoryClient, status_url: str) -> dict[str, Any]:
    """The job once it has ended."""
    job: dict[str, Any] = {}

    async def done() -> bool:
        job.update((await call(client.get_profile_job, status_url))["job"])
        return job["status"] in ("succeeded", "failed")

    await eventually(done)
    return job


async def test_a_profile_is_built_by_the_spaces_llm_as_a_job_masked_in_and_out(
        memgate: Memgate, llm: Llm) -> None:
    space = await new_space(memgate, llm)
    client = await space.client()
    settings = await call(client.update_profile_settings, schema=SCHEMA,
                          custom_instructions=f"Write to {EMAIL} never")
    user = settings["entities"]["user"]
    assert user["schema"]["properties"]["summary"]["description"] == \
        "who the user is (ask [EMAIL])"
    assert user["custom_instructions"] == "Write to [EMAIL] never"
    assert settings["enabled"] and settings["capabilities"]["llm"]
    assert await call(client.get_profile_settings) == settings
    await call(client.add, f"I like green tea and my mail is {EMAIL}", user_id="alex",
               infer=False)
    await call(client.add, "I ride a bike", user_id="alex", infer=False)
    assert (await call(client.get_profile, "alex"))["status"] == "insufficient_data"

    created = await call(client.generate_profile, "alex", idempotency_key="first-key-1")
    assert created["operation"] == "trigger" and not created["replayed"]
    again = await call(client.generate_profile, "alex", idempotency_key="first-key-1")
    assert (again["job_id"], again["replayed"]) == (created["job_id"], True)
    job = await finished(client, created["status_url"])
    assert (job["status"], job["total"], job["succeeded"]) == ("succeeded", 1, 1)
    assert (await call(client.get_profile_job, created["job_id"]))["job"] == job

    profile = await call(client.get_profile, "alex")
    assert (profile["status"], profile["generation_count"]) == ("succeeded", 1)
    assert sorted(profile["profile"]["likes"]) == ["I like green tea and my mail is [EMAIL]",
                                                   "I ride a bike"]
    assert PROFILE_EMAIL not in json.dumps(profile) and "[EMAIL]" in profile["profile"]["summary"]
    received = await llm.received()
    assert EMAIL not in received and PROFILE_EMAIL not in received.split("written by")[0]
    assert "Write to [EMAIL] never" in received and "who the user is" in received

    with pytest.raises(MemoryNotFoundError):
        await call(client.generate_profile, "nobody")
    await call(client.add, "I swim", user_id="sam", infer=False)
    sampled = await call(client.sample_profiles, limit=5)
    assert sorted(sampled["entity_ids"]) == ["alex", "sam"] and sampled["sampled"] == 2
    assert (await finished(client, sampled["status_url"]))["succeeded"] == 2
    built = await call(client.get_profile, "alex")
    assert built["generation_count"] == 2

    await llm.mode("badjson")  # an answer that is no profile: the job fails, the profile stays
    failed = await call(client.generate_profile, "alex")
    assert (await finished(client, failed["status_url"]))["status"] == "failed"
    assert await call(client.get_profile, "alex") == built


async def test_without_an_llm_profiles_are_not_enabled_never_a_404_or_500(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    await call(client.add, "I like tea", user_id="alex")
    for user in ("alex", "nobody"):
        profile = await call(client.get_profile, user)
        assert (profile["status"], profile["profile"]) == ("not_enabled", {})
    for generate in (lambda: client.generate_profile("alex"),
                     lambda: client.sample_profiles()):
        with pytest.raises(ValidationError, match="not_enabled"):
            await call(generate)
    response = await memgate.http.post(
        f"/memory/{space.id}/v2/profiles/jobs/", headers={
            "Authorization": f"Token {space.owner.token}", "Idempotency-Key": "k" * 12},
        json={"operation": "trigger", "entity_type": "user", "entity_id": "alex"})
    assert response.status_code == 422
    assert response.json()["error"]["details"] == {"status": "not_enabled"}
    settings = await call(client.get_profile_settings)
    assert not settings["capabilities"]["llm"] and not settings["capabilities"]["generation"]


BAD_SCHEMAS: list[Any] = [
    {"type": "array", "items": {"type": "string"}},
    {"type": "object", "properties": {}},
    {"type": "object", "properties": {"summary": {"type": "string"}}},
    {"type": "object", "properties": {"summary": {"type": "strung", "description": "d"}}},
    {"type": "object", "properties": {"a": {"$ref": "https://example.org/s", "description": "d"}}},
    [1, 2],
    "an object",
]


async def test_a_profile_schema_that_is_no_described_object_schema_is_refused(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    for schema in BAD_SCHEMAS:
        with pytest.raises(ValidationError):
            await call(client.update_profile_settings, schema=schema)
        response = await memgate.http.post(
            f"/memory/{space.id}/v2/profiles/settings/",
            headers={"Authorization": f"Token {space.owner.token}"},
            json={"entities": {"user": {"schema": schema}}})
        assert response.status_code == 400, schema
        error = response.json()["error"]
        assert error["code"] == "VALIDATION_ERROR" and error["details"]["field"].endswith(
            "schema"), error
    assert (await call(client.get_profile_settings))["entities"]["user"]["schema"] is None


async def test_a_users_profile_goes_with_their_erasure_or_their_space_and_is_sealed_in_backups(
        tmp_path: Path, llm: Llm) -> None:
    word, kept = canary(), canary()
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        space = await new_space(memgate, llm)
        client = await space.client()
        await call(client.add, f"I collect {word} stamps", user_id=USER, infer=False)
        await call(client.add, f"I collect {kept} coins", user_id="other-user", infer=False)
        for user in (USER, "other-user"):
            job = await call(client.generate_profile, user)
            assert (await finished(client, job["status_url"]))["status"] == "succeeded"
        data = memgate.settings.data_dir
    backup = tmp_path / "backup.jsonl"
    await ok("backup", "--data-dir", str(data), "--out", str(backup))
    assert any(f.endswith("spaces.duckdb") for f in hits(data, needles(word))), \
        "the scan sees the profile"
    assert not any(n in backup.read_bytes().lower() for n in needles(word))  # sealed

    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        await erase(memgate, {"externalId": USER}, space.owner.workspace_id)
        client = await Space(memgate, space.owner, space.id).client()
        with pytest.raises(MemoryNotFoundError):
            await call(client.get_profile, USER)
        assert (await call(client.get_profile, "other-user"))["status"] == "succeeded"
        assert hits(data, needles(word)) == []
        assert any(f.endswith("spaces.duckdb") for f in hits(data, needles(kept)))
        await memgate.ok("DELETE", f"/memory/spaces/{space.id}", space.owner.token)
        assert hits(data, needles(kept)) == []  # the space's profiles left with it


async def test_at_most_four_profile_jobs_of_a_space_are_under_way_at_once(
        memgate: Memgate, llm: Llm) -> None:
    space = await new_space(memgate, llm)
    client = await space.client()
    await call(client.add, "I like tea", user_id="alex", infer=False)
    await llm.mode("slow")  # every job waits on the LLM
    first = await call(client.generate_profile, "alex", idempotency_key="job-key-0")
    for n in range(1, 4):
        await call(client.generate_profile, "alex", idempotency_key=f"job-key-{n}")
    with pytest.raises(RateLimitError):
        await call(client.generate_profile, "alex", idempotency_key="job-key-4")
    response = await memgate.http.post(
        f"/memory/{space.id}/v2/profiles/jobs/", json={"entity_id": "alex"}, headers={
            "Authorization": f"Token {space.owner.token}", "Idempotency-Key": "job-key-5"})
    assert response.status_code == 429 and response.headers["Retry-After"] == "30"
    assert response.json()["error"]["code"] == "MEMORY_SPACE_RATE_LIMITED"
    again = await call(client.generate_profile, "alex", idempotency_key="job-key-0")
    assert (again["job_id"], again["replayed"]) == (first["job_id"], True)  # not refused


async def test_users_lists_who_memories_are_about_and_delete_users_deletes_theirs(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    await call(client.add, "I like tea", user_id="alex")
    await call(client.add, "alex asked the bot", user_id="alex", agent_id="bot")
    await call(client.add, "I swim", user_id="sam", run_id="r1")
    listed = await call(client.users)
    assert listed["count"] == len(listed["results"])
    assert sorted((e["type"], e["name"], e["total_memories"]) for e in listed["results"]) == [
        ("agent", "bot", 1), ("run", "r1", 1), ("user", "alex", 2), ("user", "sam", 1)]

    await call(client.delete_users, user_id="alex")
    assert [m["memory"] for m in (await call(client.get_all))["results"]] == ["I swim"]
    with pytest.raises(MemoryNotFoundError):
        await call(client.delete_users, user_id="nobody")
    await call(client.reset)
    assert (await call(client.get_all))["results"] == []
    assert (await call(client.users))["results"] == []
