"""A LangGraph store over memgate's bus client: `MemgateStore(client)` (`memgate[langgraph]`).

LangGraph (and LangMem's memory tools) keep items in a `BaseStore`: a value (a JSON object)
under a key in a namespace (a tuple of labels). `MemgateStore` keeps each item as one memgate
memory of the agent's credential:

- **Namespace**: the labels joined with `.`, which LangGraph already forbids inside a label, so
  the mapping is one to one: `("memories", "u-1")` is memgate's namespace `memories.u-1`. memgate
  holds 64 characters at most: a longer namespace is an `InvalidNamespaceError`. Names are never
  masked, so a namespace or key holding personal data (an e-mail address as a user id) is
  refused with `AgentMemoryPersonalDataError`; use opaque ids.
- **Key**: memgate's `key` (120 characters at most). A put of an existing key supersedes the
  earlier version (memgate keeps it for `as_of` reads); a put of `None` and a delete forget every
  version of the key. A memory written without a key (by another client) shows its memory id as
  its key.
- **Value**: compact JSON (`ensure_ascii=False`, so masking sees the characters) as the memory's
  text, at most 1,000 characters, else `ValidationFailedError`. memgate masks personal data in
  it before storing, so a value comes back with placeholders (`[EMAIL]`, `[PHONE]`, ...) where
  the personal data was, and a value of nothing but personal data is refused
  (`AgentMemoryEmptyError`). Text that is not a JSON object (written by another client) reads as
  `{"text": ...}`. A long number outside a string (a card, a phone, an id) is masked too and
  comes back as the placeholder's string: `{"n": 4111111111111111}` reads `{"n": "[CARD]"}`.
  `created_at` and `updated_at` are both the current version's creation.
- **Search** with a `query` is memgate's recall (BM25, embeddings and fusion): in the prefix's
  own namespace and across the agent's memories (memgate's best 50), merged by score and kept to
  the prefix. Without a query it lists, newest first. `filter` is applied here on the decoded
  value, with LangGraph's in-memory semantics (equality, nested objects, `$eq $ne $gt $gte $lt
  $lte`); `offset` and `limit` after it. `index` is ignored: memgate indexes the whole text.
- **list_namespaces** reads every memory of the agent (pages of 100): fine for an agent's
  memories, not for millions.
- **TTL** is not supported (`supports_ttl = False`): memgate's retention applies instead.

The client is async. The async methods (`aput`, `aget`, `asearch`, ...) run on the caller's
loop; the sync ones (`put`, `get`, ...) must be called from another thread than the loop that
runs the client (a LangGraph sync graph in a worker thread), and wait for it there.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from memgate.bus.client import MemgateClient
from memgate.contracts.memory import Memory

__all__ = ["MemgateStore", "SEPARATOR", "memgate_namespace", "langgraph_namespace"]

SEPARATOR = "."
MAX_NAMESPACE_CHARS = 64  # RememberRequest.namespace
RECALL_LIMIT = 50  # RecallRequest.limit's maximum
PAGE = 100  # ListRequest.limit's maximum


def memgate_namespace(namespace: tuple[str, ...]) -> str:
    """The memgate namespace of a LangGraph namespace, or `InvalidNamespaceError`."""
    if not namespace:
        raise InvalidNamespaceError("a memgate namespace needs at least one label")
    for label in namespace:
        if not label or SEPARATOR in label:
            raise InvalidNamespaceError(
                f"a label must be non-empty and hold no {SEPARATOR!r} (memgate joins with it)")
    joined = SEPARATOR.join(namespace)
    if len(joined) > MAX_NAMESPACE_CHARS:
        raise InvalidNamespaceError(
            f"memgate holds namespaces of at most {MAX_NAMESPACE_CHARS} characters, "
            f"labels and separators together ({len(joined)} given)")
    return joined


def langgraph_namespace(namespace: str) -> tuple[str, ...]:
    return tuple(namespace.split(SEPARATOR))


def _encode(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


# A masked JSON number: the placeholder and what is left of the number's own characters
_MASKED_NUMBER = re.compile(r"[-+.\deE]*\[[A-Z][A-Z_]*\][-+.\deE]*")


def _quote_masked_numbers(text: str) -> str:
    """Masking replaces a long number (a card, a phone, an id) outside any JSON string with a
    bare placeholder, `{"n":[NUMBER]}`: make each such number the placeholder's string."""
    out: list[str] = []
    at, inside = 0, False
    while at < len(text):
        char = text[at]
        if inside:
            step = 2 if char == "\\" else 1
            inside = char != '"'
        elif char == '"':
            step, inside = 1, True
        elif masked := _MASKED_NUMBER.match(text, at):
            placeholder = re.search(r"\[[A-Z][A-Z_]*\]", masked.group())
            assert placeholder is not None  # the pattern holds one
            out.append(json.dumps(placeholder.group()))
            at = masked.end()
            continue
        else:
            step = 1
        out.append(text[at:at + step])
        at += step
    return "".join(out)


def _decode(text: str) -> dict[str, Any]:
    """The value of a memory's text; text that is no JSON object is `{"text": ...}`."""
    for attempt in (text, _quote_masked_numbers(text)):
        try:
            value = json.loads(attempt)
        except ValueError:
            continue
        return value if isinstance(value, dict) else {"text": text}
    return {"text": text}


def _item(memory: Memory) -> Item:
    return Item(value=_decode(memory.text), key=memory.key or memory.memory_id,
                namespace=langgraph_namespace(memory.namespace),
                created_at=memory.created_at, updated_at=memory.created_at)


def _search_item(memory: Memory, score: float | None) -> SearchItem:
    return SearchItem(langgraph_namespace(memory.namespace), memory.key or memory.memory_id,
                      _decode(memory.text), memory.created_at, memory.created_at, score)


def _under(namespace: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    return namespace[:len(prefix)] == prefix


def _operator(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    if operator not in ("$gt", "$gte", "$lt", "$lte"):
        raise ValueError(f"unsupported filter operator: {operator}")
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False
    return {"$gt": left > right, "$gte": left >= right,
            "$lt": left < right, "$lte": left <= right}[operator]


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's in-memory filter semantics (`langgraph.store.memory`)."""
    if isinstance(wanted, dict):
        if any(str(name).startswith("$") for name in wanted):
            return all(_operator(value, name, operand) for name, operand in wanted.items())
        return isinstance(value, dict) and all(
            _matches(value.get(name), inner) for name, inner in wanted.items())
    if isinstance(wanted, list | tuple):
        return (isinstance(value, list | tuple) and len(value) == len(wanted)
                and all(_matches(v, w) for v, w in zip(value, wanted, strict=True)))
    return bool(value == wanted)


def _condition_holds(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    pairs = (zip(namespace, path, strict=False) if condition.match_type == "prefix"
             else zip(reversed(namespace), reversed(path), strict=False))
    return all(want == "*" or have == want for have, want in pairs)


class MemgateStore(BaseStore):
    """A `langgraph.store.base.BaseStore` whose items are memgate memories (see the module)."""

    supports_ttl = False

    def __init__(self, client: MemgateClient, *,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        """`loop`: the loop that runs `client`, by default the running one (sync calls are
        handed to it from their own thread)."""
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("create MemgateStore inside the event loop that runs the "
                                   "client, or pass loop=") from None
        self._client = client
        self._loop = loop

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise asyncio.InvalidStateError(
                "a sync MemgateStore call on the client's event loop would block it: use the "
                "async methods (aput, aget, asearch, ...) or call from another thread")
        return asyncio.run_coroutine_threadsafe(self.abatch(ops), self._loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:  # in order: a get after a put of the same key sees it
            validate_op_namespace(op)
            results.append(await self._run(op))
        return results

    async def _run(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            return await self._get(op)
        if isinstance(op, PutOp):
            await self._put(op)
            return None
        if isinstance(op, SearchOp):
            return await self._search(op)
        if isinstance(op, ListNamespacesOp):
            return await self._list_namespaces(op)
        raise TypeError(f"unknown store operation: {type(op).__name__}")

    async def _get(self, op: GetOp) -> Item | None:
        page = await self._client.list(namespace=memgate_namespace(op.namespace), key=op.key,
                                       limit=1)
        return _item(page.memories[0]) if page.memories else None

    async def _put(self, op: PutOp) -> None:
        namespace = memgate_namespace(op.namespace)
        if op.value is None:
            await self._client.forget(namespace=namespace, key=op.key)
        else:
            await self._client.remember(namespace, _encode(dict(op.value)), key=op.key)

    async def _memories(self) -> AsyncIterator[Memory]:
        """Every current memory of the agent, newest first."""
        cursor: str | None = None
        while True:
            page = await self._client.list(limit=PAGE, cursor=cursor)
            for memory in page.memories:
                yield memory
            cursor = page.next_cursor
            if cursor is None or not page.memories:
                return

    async def _recalled(self, query: str, prefix: tuple[str, ...]) -> list[SearchItem]:
        asks = [self._client.recall(query, limit=RECALL_LIMIT)]
        if prefix:
            try:
                own = memgate_namespace(prefix)
            except InvalidNamespaceError:
                return []  # too long to hold anything
            asks.append(self._client.recall(query, namespace=own, limit=RECALL_LIMIT))
        best: dict[str, SearchItem] = {}
        for result in await asyncio.gather(*asks):
            for memory in result.memories:
                item = _search_item(memory, memory.score)
                kept = best.get(memory.memory_id)
                if _under(item.namespace, prefix) and (
                        kept is None or (kept.score or 0.0) < memory.score):
                    best[memory.memory_id] = item
        return sorted(best.values(), key=lambda item: -(item.score or 0.0))

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        wanted = op.filter or {}
        offset, limit = max(op.offset, 0), max(op.limit, 0)

        def kept(item: SearchItem) -> bool:
            return all(_matches(item.value.get(name), value) for name, value in wanted.items())

        if op.query:
            found = [item for item in await self._recalled(op.query, op.namespace_prefix)
                     if kept(item)]
            return found[offset:offset + limit]
        listed: list[SearchItem] = []
        async for memory in self._memories():
            item = _search_item(memory, None)
            if _under(item.namespace, op.namespace_prefix) and kept(item):
                listed.append(item)
                if len(listed) >= offset + limit:
                    break
        return listed[offset:offset + limit]

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found: set[tuple[str, ...]] = set()
        async for memory in self._memories():
            namespace = langgraph_namespace(memory.namespace)
            if all(_condition_holds(c, namespace) for c in op.match_conditions or ()):
                found.add(namespace if op.max_depth is None else namespace[:op.max_depth])
        return sorted(found)[op.offset:op.offset + op.limit]
