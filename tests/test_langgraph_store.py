"""`memgate.integrations.langgraph.MemgateStore`: LangGraph's store API on a real memgate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from langgraph.store.base import InvalidNamespaceError, PutOp
from langmem import create_manage_memory_tool, create_search_memory_tool

from memgate import AgentMemoryPersonalDataError, MemgateClient
from memgate.integrations.langgraph import MemgateStore
from tests.conftest import Memgate, eventually

COFFEE = {"content": "The user drinks a dark roast espresso every morning", "kind": "habit"}
BUDGET = {"content": "The quarterly budget review moved to Thursday", "kind": "event"}


@pytest.fixture
async def store(memgate: Memgate) -> AsyncIterator[MemgateStore]:
    owner = await memgate.workspace()
    nats_agent = await memgate.nats_agent()
    client = await MemgateClient.connect(memgate.nats_url, await memgate.credential(owner),
                                         nats_seed=nats_agent["seed"],
                                         inbox_prefix=nats_agent["inboxPrefix"])
    try:
        yield MemgateStore(client)
    finally:
        await client.close()


async def test_a_put_reads_back_by_key_and_a_second_put_supersedes_it(
        store: MemgateStore) -> None:
    await store.aput(("memories", "u-1"), "drink", COFFEE)
    item = await store.aget(("memories", "u-1"), "drink")
    assert item is not None
    assert (item.namespace, item.key, item.value) == (("memories", "u-1"), "drink", COFFEE)
    await store.aput(("memories", "u-1"), "drink", BUDGET)
    again = await store.aget(("memories", "u-1"), "drink")
    assert again is not None and again.value == BUDGET
    assert [i.value for i in await store.asearch(("memories",))] == [BUDGET]
    assert await store.aget(("memories", "u-1"), "absent") is None
    assert await store.aget(("memories", "u-2"), "drink") is None


async def test_a_semantic_search_finds_a_value_by_meaning_under_its_prefix(
        store: MemgateStore) -> None:
    await store.aput(("memories", "u-1"), "drink", COFFEE)
    await store.aput(("memories", "u-1"), "meeting", BUDGET)
    await store.aput(("memories", "u-2"), "drink", {"content": "Prefers green tea"})
    await store.aput(("notes",), "drink", {"content": "Coffee machine on floor two"})

    async def coffee_first() -> bool:  # once the embedder has seen them
        found = await store.asearch(("memories", "u-1"), query="what hot beverage do they like")
        return bool(found) and found[0].key == "drink"

    await eventually(coffee_first)
    found = await store.asearch(("memories", "u-1"), query="what hot beverage do they like")
    assert {i.namespace for i in found} == {("memories", "u-1")}
    assert found[0].value == COFFEE and found[0].score is not None
    assert found[0].score >= (found[-1].score or 0.0)
    wide = await store.asearch(("memories",), query="what hot beverage do they like")
    assert {i.namespace for i in wide} == {("memories", "u-1"), ("memories", "u-2")}
    everywhere = await store.asearch((), query="coffee")
    assert ("notes",) in {i.namespace for i in everywhere}


async def test_a_filter_keeps_matching_values_and_offset_and_limit_page_them(
        store: MemgateStore) -> None:
    for n in range(5):
        await store.aput(("docs",), f"d{n}", {"n": n, "kind": "even" if n % 2 == 0 else "odd",
                                              "meta": {"team": "a"}})
    evens = await store.asearch(("docs",), filter={"kind": "even"})
    assert sorted(i.value["n"] for i in evens) == [0, 2, 4]
    assert all(i.score is None for i in evens)
    assert sorted(i.value["n"] for i in await store.asearch(
        ("docs",), filter={"n": {"$gte": 3}, "meta": {"team": "a"}})) == [3, 4]
    assert await store.asearch(("docs",), filter={"meta": {"team": "b"}}) == []
    pages = [await store.asearch(("docs",), limit=2, offset=offset) for offset in (0, 2, 4)]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert len({i.key for p in pages for i in p}) == 5
    assert [i.key for i in await store.asearch(("docs",), query="kind even",
                                               filter={"kind": "odd"})] in (["d1", "d3"],
                                                                            ["d3", "d1"])


async def test_delete_and_a_put_of_none_forget_the_item(store: MemgateStore) -> None:
    await store.aput(("memories", "u-1"), "drink", COFFEE)
    await store.aput(("memories", "u-1"), "meeting", BUDGET)
    await store.adelete(("memories", "u-1"), "drink")
    assert await store.aget(("memories", "u-1"), "drink") is None
    assert await store.abatch([]) == []
    await store.abatch([PutOp(("memories", "u-1"), "meeting", None)])
    assert await store.aget(("memories", "u-1"), "meeting") is None
    assert await store.asearch(("memories",)) == []


async def test_list_namespaces_honours_prefix_suffix_wildcards_and_depth(
        store: MemgateStore) -> None:
    for namespace in [("a", "b", "c"), ("a", "b", "d"), ("a", "x"), ("z",)]:
        await store.aput(namespace, "k", {"v": 1})
    assert await store.alist_namespaces() == [("a", "b", "c"), ("a", "b", "d"), ("a", "x"),
                                              ("z",)]
    assert await store.alist_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d")]
    assert await store.alist_namespaces(suffix=("d",)) == [("a", "b", "d")]
    assert await store.alist_namespaces(prefix=("a", "*", "c")) == [("a", "b", "c")]
    assert await store.alist_namespaces(max_depth=2) == [("a", "b"), ("a", "x"), ("z",)]
    assert await store.alist_namespaces(limit=2, offset=1) == [("a", "b", "d"), ("a", "x")]


async def test_the_sync_methods_work_from_another_thread_not_on_the_loop(
        store: MemgateStore) -> None:
    await asyncio.to_thread(store.put, ("memories", "u-1"), "drink", COFFEE)
    item = await asyncio.to_thread(store.get, ("memories", "u-1"), "drink")
    assert item is not None and item.value == COFFEE
    found = await asyncio.to_thread(store.search, ("memories",), filter={"kind": "habit"})
    assert [i.key for i in found] == ["drink"]
    assert await asyncio.to_thread(store.list_namespaces) == [("memories", "u-1")]
    await asyncio.to_thread(store.delete, ("memories", "u-1"), "drink")
    assert await asyncio.to_thread(store.get, ("memories", "u-1"), "drink") is None
    with pytest.raises(asyncio.InvalidStateError):
        store.get(("memories", "u-1"), "drink")


async def test_values_come_back_masked_and_names_memgate_cannot_hold_are_refused(
        store: MemgateStore) -> None:
    await store.aput(("contacts",), "c1", {"note": "write to jane.doe@example.com on Monday"})
    item = await store.aget(("contacts",), "c1")
    assert item is not None
    assert "@" not in item.value["note"] and "[EMAIL]" in item.value["note"]
    await store.aput(("contacts",), "c2", {"card": 4111111111111111, "ids": [4155550134, 7],
                                           "price": 3.5})
    numbers = await store.aget(("contacts",), "c2")
    assert numbers is not None
    assert numbers.value == {"card": "[CARD]", "ids": ["[NUMBER]", 7], "price": 3.5}
    with pytest.raises(AgentMemoryPersonalDataError):
        await store.aput(("memories",), "jane.doe@example.com", {"v": 1})  # names aren't masked
    with pytest.raises(InvalidNamespaceError):
        await store.aput(("x" * 40, "y" * 40), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        await store.aput(("a.b",), "k", {"v": 1})
    with pytest.raises(NotImplementedError):
        await store.aput(("a",), "k", {"v": 1}, ttl=5)


async def test_langmem_tools_store_and_find_a_memory_through_memgate(
        store: MemgateStore) -> None:
    namespace = ("memories", "u-1")
    manage = create_manage_memory_tool(namespace=namespace, store=store)
    search = create_search_memory_tool(namespace=namespace, store=store)
    created = await manage.ainvoke({"content": "The user is allergic to peanuts"})
    memory_id = str(created).split()[-1]
    item = await store.aget(namespace, memory_id)
    assert item is not None and item.value == {"content": "The user is allergic to peanuts"}

    async def found() -> bool:
        hits = json.loads(await search.ainvoke({"query": "food allergy"}))
        return bool(hits) and hits[0]["key"] == memory_id

    await eventually(found)
    await manage.ainvoke({"action": "delete", "id": memory_id})
    assert await store.aget(namespace, memory_id) is None
