"""A mem0 memory's metadata (SPEC §4.4), as pure rules: its bounds, its masking, and the
filters that select memories by it.

Metadata is a JSON object given on add and update. It is bounded as sent (at most
METADATA_MAX_BYTES of compact JSON, METADATA_MAX_KEYS keys, METADATA_MAX_DEPTH levels of
objects and lists, keys of at most KEY_MAX characters) and every string in it is masked like
memory text (SPEC §3.2) before it is stored; a key holding personal data is refused (400
AGENT_MEMORY_PERSONAL_DATA), like a namespace: keys are names that filters match.

Filters are mem0's: beside `user_id` / `agent_id` / `run_id` (`policy.mem0`), any other field
is a metadata key (`{"food": "tea"}`, as mem0's open-source filters write it), or the keys sit
in a `metadata` object (`{"metadata": {"food": "tea"}}`, as its platform writes them). A
condition is a value (equality), `"*"` (the key is present) or an object of operators, all of
which must hold: `eq`, `ne`, `in`, `nin`, `gt`, `gte`, `lt`, `lte`, `contains`, `icontains`.
`AND` and `OR` take lists of filters; `NOT` a filter or a list of them (none may hold).

Stored values are masked, so a filter is matched against what memgate kept: a string operand
holding personal data (`{"email": "alex@example.com"}`) is refused (400
AGENT_MEMORY_PERSONAL_DATA): memgate never kept that value, and matching its placeholder
(`[EMAIL]`) instead would select every memory with any e-mail address (a `delete_all` too).
A placeholder may be matched as any text is (`{"contact": {"contains": "[EMAIL]"}}`).

mem0's `timestamp` (Unix seconds: the instant shown as the memory's `created_at`) and
`expiration_date` (`YYYY-MM-DD`) are checked here too (`shown_at`, `expiry_of`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pydantic import JsonValue

from memgate.contracts.errors import AgentMemoryPersonalDataError, ValidationFailedError
from memgate.contracts.spaces import Entity
from memgate.policy.masking import contains_personal_data, mask_many
from memgate.policy.mem0 import FIELDS, FILTERS_MAX_DEPTH, FILTERS_MAX_NODES, entity_condition

METADATA_MAX_BYTES = 4096  # compact JSON, UTF-8, as sent
METADATA_MAX_KEYS = 32  # at the top level
METADATA_MAX_DEPTH = 3  # the metadata object itself is level 1
KEY_MAX = 64
OPERAND_MAX = 200  # characters of a string operand
IN_MAX = 100  # operands of `in` / `nin`
# mem0 filter fields memgate does not filter on: refused rather than read as metadata keys
UNSUPPORTED = frozenset({"app_id", "created_at", "updated_at", "timestamp", "categories",
                         "keywords", "memory_ids", "expiration_date"})
OPERATORS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "contains", "icontains")

SKEW = timedelta(minutes=5)  # a timestamp may lie this far ahead of memgate's clock
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

Metadata = Mapping[str, JsonValue]
Test = Callable[[Entity | None, Metadata], bool]


def _invalid(field: str, problem: str) -> ValidationFailedError:
    return ValidationFailedError("the metadata is not valid", {"field": field,
                                                               "problem": problem})


def _walk(value: Any, field: str, depth: int, strings: list[str]) -> None:
    """Check the shape (depth, keys) and collect every string value, in order."""
    if isinstance(value, dict):
        if depth > METADATA_MAX_DEPTH:
            raise _invalid(field, f"at most {METADATA_MAX_DEPTH} levels of objects and lists")
        for key, item in value.items():
            if not isinstance(key, str) or not 1 <= len(key) <= KEY_MAX:
                raise _invalid(field, f"keys are 1 to {KEY_MAX} characters")
            if contains_personal_data(key):
                raise AgentMemoryPersonalDataError("a metadata key must not contain personal "
                                                   "data", {"field": field})
            _walk(item, field, depth + 1, strings)
    elif isinstance(value, list):
        if depth > METADATA_MAX_DEPTH:
            raise _invalid(field, f"at most {METADATA_MAX_DEPTH} levels of objects and lists")
        for item in value:
            _walk(item, field, depth + 1, strings)
    elif isinstance(value, str):
        strings.append(value)
    elif not (value is None or isinstance(value, bool | int | float)):
        raise _invalid(field, "values are JSON")


def _rebuilt(value: Any, masked: list[str]) -> Any:
    """The value with its strings replaced, in `_walk`'s order (consumed from the end)."""
    if isinstance(value, dict):
        return {key: _rebuilt(item, masked) for key, item in value.items()}
    if isinstance(value, list):
        return [_rebuilt(item, masked) for item in value]
    if isinstance(value, str):
        return masked.pop()
    return value


def masked_metadata(metadata: Mapping[str, Any], field: str = "metadata",
                    ) -> dict[str, JsonValue]:
    """The metadata as it is stored: checked against its bounds as sent, then every string
    value masked (one masking for them all). Raises VALIDATION_ERROR (the field and the
    bound, never a value) or AGENT_MEMORY_PERSONAL_DATA (a key)."""
    if len(metadata) > METADATA_MAX_KEYS:
        raise _invalid(field, f"at most {METADATA_MAX_KEYS} keys")
    try:
        sent = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
    except (ValueError, TypeError, RecursionError):  # NaN, Infinity, too deep to write
        raise _invalid(field, "values are JSON") from None
    if len(sent.encode()) > METADATA_MAX_BYTES:
        raise _invalid(field, f"at most {METADATA_MAX_BYTES} bytes of JSON")
    strings: list[str] = []
    _walk(dict(metadata), field, 1, strings)
    masked = mask_many(strings)
    masked.reverse()
    rebuilt: dict[str, JsonValue] = _rebuilt(dict(metadata), masked)
    return rebuilt


def shown_at(timestamp: float, now: datetime, field: str = "timestamp") -> datetime:
    """mem0's `timestamp` (Unix seconds) as an instant: from 1970 to SKEW after `now`."""
    if not 0 <= timestamp <= (now + SKEW).timestamp():
        raise ValidationFailedError(
            "the timestamp is Unix seconds, from 1970 to a few minutes from now",
            {"field": field})
    return datetime.fromtimestamp(timestamp, UTC)


def instant_of(instant: datetime, now: datetime, field: str) -> datetime:
    """An instant a client gives (an imported memory's `created_at`): from 1970 to SKEW after
    `now`; without a zone, UTC."""
    aware = instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)
    shown_at(aware.timestamp(), now, field)
    return aware.astimezone(UTC)


def expiry_of(text: str, now: datetime, field: str = "expiration_date") -> date:
    """mem0's `expiration_date` (`YYYY-MM-DD`): the memory expires as that day starts (UTC),
    so the day must come after today."""
    try:
        day = date.fromisoformat(text) if _DATE.fullmatch(text) else None
    except ValueError:
        day = None
    if day is None:
        raise ValidationFailedError("the expiration date is a date, YYYY-MM-DD",
                                    {"field": field})
    if day <= now.astimezone(UTC).date():
        raise ValidationFailedError("the expiration date must come after today",
                                    {"field": field})
    return day


# --- filters ---

def _refuse(problem: str) -> ValidationFailedError:
    return ValidationFailedError("the filters are not valid", {"field": "filters",
                                                               "problem": problem})


def _scalar(value: Any) -> JsonValue:
    if isinstance(value, str):
        if len(value) > OPERAND_MAX:
            raise _refuse(f"a filter value is at most {OPERAND_MAX} characters")
        if contains_personal_data(value):
            raise AgentMemoryPersonalDataError(
                "a filter value must not contain personal data: memgate keeps it masked",
                {"field": "filters"})
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    raise _refuse("a metadata condition compares with a string, number, boolean or null")


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _ordered(value: Any, operand: Any) -> tuple[Any, Any] | None:
    """Both numbers, or both strings: comparable; anything else never matches an order."""
    number = (int, float)
    if (isinstance(value, number) and not isinstance(value, bool)
            and isinstance(operand, number) and not isinstance(operand, bool)):
        return value, operand
    if isinstance(value, str) and isinstance(operand, str):
        return value, operand
    return None


def _contains(value: Any, operand: str, fold: bool) -> bool:
    def has(text: str) -> bool:
        return (operand.casefold() in text.casefold()) if fold else operand in text

    if isinstance(value, str):
        return has(value)
    if isinstance(value, list):  # a list of tags: any of them
        return any(isinstance(item, str) and has(item) for item in value)
    return False


Check = Callable[[bool, Any], bool]  # (present, value) → holds


def _operator(name: str, operand: Any) -> Check:
    if name in ("eq", "ne"):
        wanted = _scalar(operand)
        if name == "eq":
            return lambda present, value: present and _same(value, wanted)
        return lambda present, value: not (present and _same(value, wanted))
    if name in ("in", "nin"):
        if not isinstance(operand, list) or not 1 <= len(operand) <= IN_MAX:
            raise _refuse(f"{name} takes a list of 1 to {IN_MAX} values")
        among = [_scalar(item) for item in operand]

        def found(present: bool, value: Any) -> bool:
            return present and any(_same(value, item) for item in among)

        return found if name == "in" else (lambda present, value: not found(present, value))
    if name in ("gt", "gte", "lt", "lte"):
        bound = _scalar(operand)
        if _ordered(bound, bound) is None:
            raise _refuse(f"{name} compares with a number or a string")
        compare: Callable[[Any, Any], bool] = {
            "gt": lambda a, b: a > b, "gte": lambda a, b: a >= b,
            "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b}[name]

        def ordered(present: bool, value: Any) -> bool:
            pair = _ordered(value, bound) if present else None
            return pair is not None and compare(*pair)

        return ordered
    if name in ("contains", "icontains"):
        if not isinstance(operand, str) or not operand:
            raise _refuse(f"{name} takes a non-empty string")
        text = _scalar(operand)
        assert isinstance(text, str)
        fold = name == "icontains"
        return lambda present, value: present and _contains(value, text, fold)
    raise _refuse(f"unsupported operator {name[:20]!r}: use one of {', '.join(OPERATORS)}")


def _key_condition(key: str, condition: Any, budget: _Budget) -> Test:
    if not isinstance(key, str) or not 1 <= len(key) <= KEY_MAX:
        raise _refuse(f"a metadata key is 1 to {KEY_MAX} characters")
    if contains_personal_data(key):
        raise AgentMemoryPersonalDataError("a metadata key must not contain personal data",
                                           {"field": "filters"})
    checks: list[Check]
    if condition == "*":
        checks = [lambda present, _: present]
    elif isinstance(condition, dict):
        if not condition:
            raise _refuse("a condition names at least one operator")
        checks = []
        for name, operand in condition.items():
            budget.take()
            checks.append(_operator(str(name), operand))
    else:
        checks = [_operator("eq", condition)]

    def test(_: Entity | None, metadata: Metadata) -> bool:
        present = key in metadata
        value = metadata.get(key)
        return all(check(present, value) for check in checks)

    return test


class _Budget:
    def __init__(self) -> None:
        self.nodes = 0
        self.metadata = False  # any metadata condition, or NOT: not entities alone

    def take(self) -> None:
        self.nodes += 1
        if self.nodes > FILTERS_MAX_NODES:
            raise _refuse(f"at most {FILTERS_MAX_NODES} conditions")


def _children(name: str, value: Any, depth: int, budget: _Budget) -> list[Test]:
    if isinstance(value, dict) and name == "NOT":
        value = [value]
    if not isinstance(value, list) or not value:
        raise _refuse(f"{name} takes a non-empty list of filters")
    return [_compile(child, depth + 1, budget) for child in value]


def _compile(node: Any, depth: int, budget: _Budget) -> Test:
    budget.take()
    if depth > FILTERS_MAX_DEPTH:
        raise _refuse(f"at most {FILTERS_MAX_DEPTH} levels of AND / OR / NOT")
    if not isinstance(node, dict) or not node:
        raise _refuse("a filter is a non-empty object")
    parts: list[Test] = []
    for name, value in node.items():
        if name in ("AND", "OR", "NOT"):
            children = _children(name, value, depth, budget)
            if name == "AND":
                parts.append(lambda e, m, c=children: all(t(e, m) for t in c))  # type: ignore[misc]
            elif name == "OR":
                parts.append(lambda e, m, c=children: any(t(e, m) for t in c))  # type: ignore[misc]
            else:
                budget.metadata = True
                parts.append(lambda e, m, c=children: not any(t(e, m) for t in c))  # type: ignore[misc]
        elif name in FIELDS:
            budget.take()
            held = entity_condition(name, value)
            parts.append(lambda e, _, p=held: e is not None and p(e))  # type: ignore[misc]
        elif name == "metadata":
            if not isinstance(value, dict) or not value:
                raise _refuse("metadata takes an object of conditions")
            budget.metadata = True
            for key, condition in value.items():
                budget.take()
                parts.append(_key_condition(key, condition, budget))
        elif name in UNSUPPORTED:
            raise _refuse(f"memgate does not filter on {name}")
        else:
            budget.metadata = True
            budget.take()
            parts.append(_key_condition(name, value, budget))
    return lambda entity, metadata: all(p(entity, metadata) for p in parts)


@dataclass(frozen=True)
class MemoryFilter:
    """A filter that needs each memory's metadata: `test` over (entity, metadata), and
    `entities`, the entity conditions every match meets (None: any), which the spaces actor
    resolves to namespaces first to narrow what is read."""

    entities: dict[str, Any] | None
    test: Test


def memory_filter(filters: Mapping[str, Any] | None) -> MemoryFilter | None:
    """None when the filter names entities only (the spaces actor resolves it alone, as
    before); raises VALIDATION_ERROR (or AGENT_MEMORY_PERSONAL_DATA) on a malformed one."""
    if not filters:
        return None
    budget = _Budget()
    test = _compile(dict(filters), 0, budget)
    if not budget.metadata:
        return None
    narrowing = {name: filters[name] for name in FIELDS if name in filters}
    return MemoryFilter(entities=narrowing or None, test=test)


__all__ = [
    "KEY_MAX", "METADATA_MAX_BYTES", "METADATA_MAX_DEPTH", "METADATA_MAX_KEYS",
    "MemoryFilter", "OPERATORS", "SKEW", "expiry_of", "masked_metadata", "memory_filter",
    "instant_of", "shown_at",
]
