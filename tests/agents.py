"""One agent interface over two transports, so every story runs over REST and over the bus."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import httpx

from memgate.bus import MemgateClient
from memgate.contracts.memory import ImportResult
from memgate.contracts import (
    HTTP_STATUS,
    Contract,
    ErrorCode,
    ForgetResult,
    ListResult,
    RecallResult,
    RememberResult,
    error_for,
)

T = TypeVar("T", bound=Contract)


class Agent(Protocol):
    async def remember(self, namespace: str, text: str, **kw: Any) -> RememberResult: ...
    async def recall(self, query: str, **kw: Any) -> RecallResult: ...
    async def list(self, **kw: Any) -> ListResult: ...
    async def forget(self, **kw: Any) -> ForgetResult: ...
    async def import_memories(self, items: list[Any]) -> ImportResult: ...
    async def close(self) -> None: ...


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class RestAgent:
    def __init__(self, http: httpx.AsyncClient, token: str | None) -> None:
        self._http = http
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def _post(self, op: str, body: dict[str, Any], result: type[T]) -> T:
        body = {_camel(k): (v.isoformat() if hasattr(v, "isoformat") else v)
                for k, v in body.items() if v is not None}
        response = await self._http.post(f"/api/agent/v1/memories/{op}", json=body,
                                         headers=self._headers)
        if response.status_code != 200:
            error = response.json()["error"]
            assert set(response.json()) == {"error"}
            assert response.status_code == HTTP_STATUS[ErrorCode(error["code"])]
            raise error_for(error["code"], error["message"], error["details"])
        return result.model_validate(response.json())

    async def remember(self, namespace: str, text: str, **kw: Any) -> RememberResult:
        return await self._post("remember", {"namespace": namespace, "text": text, **kw},
                                RememberResult)

    async def recall(self, query: str, **kw: Any) -> RecallResult:
        return await self._post("recall", {"query": query, **kw}, RecallResult)

    async def list(self, **kw: Any) -> ListResult:
        return await self._post("list", kw, ListResult)

    async def forget(self, **kw: Any) -> ForgetResult:
        return await self._post("forget", kw, ForgetResult)

    async def import_memories(self, items: list[Any]) -> ImportResult:
        return await self._post("import", {"items": items}, ImportResult)

    async def close(self) -> None:
        return None


class BusAgent:
    def __init__(self, client: MemgateClient) -> None:
        self._client = client
        self._closed = False

    @classmethod
    async def connect(cls, url: str, token: str, seed: str, inbox_prefix: str) -> BusAgent:
        return cls(await MemgateClient.connect(url, token, nats_seed=seed,
                                               inbox_prefix=inbox_prefix))

    async def remember(self, namespace: str, text: str, **kw: Any) -> RememberResult:
        return await self._client.remember(namespace, text, **kw)

    async def recall(self, query: str, **kw: Any) -> RecallResult:
        return await self._client.recall(query, **kw)

    async def list(self, **kw: Any) -> ListResult:
        return await self._client.list(**kw)

    async def forget(self, **kw: Any) -> ForgetResult:
        return await self._client.forget(**kw)

    async def import_memories(self, items: list[Any]) -> ImportResult:
        return await self._client.import_memories(items)

    async def close(self) -> None:
        """Idempotent: the fixture closes every agent again after the test."""
        if not self._closed:
            self._closed = True
            await self._client.close()
