"""A space's LLM as the space-memories actor sees it: an OpenAI-compatible chat-completions
endpoint (`POST {llmBaseUrl}/chat/completions`), asked for a JSON object.

Any failure of the endpoint (unreachable, timeout, a non-2xx status, an answer that is not a
chat completion, or one too large) is one and the same `UnavailableError`, with no details: the
caller stores nothing and may retry later, and learns nothing of what is at that address (a
closed port, a refusing one, a slow one and an upstream status all read alike). Neither the
request nor the answer is ever logged (they hold conversation text).

The base URL is checked against the operator's allowlist (`policy.llm_origins`) before every
call, not only when the space was created: a space whose origin the operator has since removed
gets 422 UNPROCESSABLE and no request is sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from memgate.contracts.errors import UnavailableError, UnprocessableError

ANSWER_MAX_BYTES = 1024 * 1024


class ChatModel(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def complete(self, base_url: str, model: str, messages: list[dict[str, str]],
                       *, timeout_s: float | None = None) -> str:
        """The content of the first choice's message; raises `UnavailableError`."""
        ...


class HttpChat:
    """`ChatModel` over HTTP (httpx): one connection pool, a deadline per request, no
    redirects followed (the allowlisted host is the only one asked)."""

    def __init__(self, *, timeout_s: float,
                 allowed: Callable[[str], bool] = lambda base_url: False) -> None:
        """`allowed`: whether memgate may post to a base URL (the operator's allowlist,
        `policy.llm_origins`); none without one."""
        self._timeout = timeout_s
        self._allowed = allowed
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False,
                                         trust_env=False)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def complete(self, base_url: str, model: str, messages: list[dict[str, str]],
                       *, timeout_s: float | None = None) -> str:
        assert self._client is not None, "start() first"
        if not self._allowed(base_url):
            raise UnprocessableError("the space's llmBaseUrl is not at an origin the operator "
                                     "allows", {"field": "llmBaseUrl"})
        timeout = timeout_s or self._timeout
        url = base_url.rstrip("/") + "/chat/completions"
        body = {"model": model, "messages": messages, "temperature": 0,
                "response_format": {"type": "json_object"}}
        try:
            async with asyncio.timeout(timeout), \
                    self._client.stream("POST", url, json=body, timeout=timeout) as response:
                if response.status_code // 100 != 2:
                    raise unavailable()
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > ANSWER_MAX_BYTES:
                        raise unavailable()
        except (httpx.HTTPError, TimeoutError):
            raise unavailable() from None
        return _content(bytes(data))


def unavailable() -> UnavailableError:
    """The one failure a caller sees, whatever went wrong at the endpoint."""
    return UnavailableError("the space's LLM did not give a usable answer; try again later")


def _content(data: bytes) -> str:
    try:
        answer: Any = json.loads(data)
        content = answer["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise unavailable() from None
    if not isinstance(content, str):
        raise unavailable()
    return content


__all__ = ["ChatModel", "HttpChat", "unavailable"]
