"""Rules for what a conversation log stores and hands on (SPEC §3.2, §4.2): event bodies masked
like memory text and bounded in size, the text an event gives to fact extraction, and the
version an `If-Match` header names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from pydantic import JsonValue

from memgate.contracts.errors import ValidationFailedError
from memgate.contracts.sessions import EVENT_BODY_MAX_BYTES
from memgate.policy.masking import mask_many

_VERSION = re.compile(r'^(?:W/)?(?:"(\d{1,15})"|(\d{1,15}))$')


def _strings(value: JsonValue, found: list[str]) -> None:
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, list):
        for item in value:
            _strings(item, found)
    elif isinstance(value, dict):
        for key, item in value.items():
            found.append(key)
            _strings(item, found)


def _rebuilt(value: JsonValue, masked: Iterator[str]) -> JsonValue:
    if isinstance(value, str):
        return next(masked)
    if isinstance(value, list):
        return [_rebuilt(item, masked) for item in value]
    if isinstance(value, dict):
        rebuilt: dict[str, JsonValue] = {}
        for item in value.values():
            key = next(masked)  # keys and values in the order _strings found them
            rebuilt[key] = _rebuilt(item, masked)
        return rebuilt
    return value


def mask_json(value: JsonValue) -> JsonValue:
    """Every string in a JSON value masked like memory text, object keys included, all in one
    masking (`mask_many`). Depth is bounded by the contracts (`EventIn`, `EditEvent`), so
    recursion is safe."""
    found: list[str] = []
    _strings(value, found)
    return _rebuilt(value, iter(mask_many(found)))


def masked_body(body: JsonValue, field: str = "body") -> str:
    """The body as it is stored: masked, compact JSON, at most EVENT_BODY_MAX_BYTES."""
    text = json.dumps(mask_json(body), ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) > EVENT_BODY_MAX_BYTES:
        raise ValidationFailedError("the request is not valid", {"problems": [
            {"field": field, "problem": f"at most {EVENT_BODY_MAX_BYTES} bytes of JSON"}]})
    return text


def extract_text(emitter_type: str, stored_body: str) -> str:
    """What fact extraction reads of a (masked) event: `<emitter type>: <content>`, the body's
    `content` when it is a string, else the body's JSON."""
    body = json.loads(stored_body)
    content = body.get("content") if isinstance(body, dict) else None
    return f"{emitter_type}: {content if isinstance(content, str) else stored_body}"


def if_match(header: str | None) -> int | None:
    """The version an `If-Match` header names (`3`, `"3"`, `W/"3"`); None for none or `*`."""
    if header is None or header.strip() == "*":
        return None
    found = _VERSION.match(header.strip())
    if found is None:
        raise ValidationFailedError("the request is not valid", {"problems": [
            {"field": "If-Match", "problem": "must name a session version"}]})
    return int(found.group(1) or found.group(2))


__all__ = ["extract_text", "if_match", "mask_json", "masked_body"]
