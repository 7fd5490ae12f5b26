"""mem0's filters and response shapes, as pure rules (SPEC §4.4).

A filter names who memories are about: `user_id`, `agent_id`, `run_id`, flat
(`{"user_id": "alex", "agent_id": "bot"}`: all must hold) or combined with `AND` / `OR` lists,
nested. A value is an id, `"*"` (any, but present), or `{"eq": id}`, `{"ne": id}`,
`{"in": [ids]}`. A filter resolves, against the space's entities, to the storage namespaces
its memories live in. `delete_all` receives its filters as a Python literal in the query string
(the client sends `str(dict)`): `query_filters` reads it with `ast.literal_eval` within a size
limit, never with `eval`.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from memgate.contracts.errors import ValidationFailedError
from memgate.contracts.spaces import Entity

FIELDS = ("user_id", "agent_id", "run_id")
FILTERS_MAX_CHARS = 4096  # a query-string filter
FILTERS_MAX_NODES = 64  # conditions and lists in one filter
FILTERS_MAX_DEPTH = 6
ID_MAX = 200

Predicate = Callable[[Entity], bool]


def _refuse(problem: str) -> ValidationFailedError:
    return ValidationFailedError("the filters are not valid", {"field": "filters",
                                                               "problem": problem})


def _id(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= ID_MAX:
        raise _refuse(f"an entity id must be a string of 1 to {ID_MAX} characters")
    return value


def entity_condition(field: str, value: Any) -> Predicate:
    """One condition on an entity field: an id, `"*"`, or one of eq / ne / in."""
    def get(entity: Entity) -> str | None:
        found: str | None = getattr(entity, field)
        return found

    if value == "*":
        return lambda entity: get(entity) is not None
    if isinstance(value, str):
        wanted = _id(value)
        return lambda entity: get(entity) == wanted
    if isinstance(value, dict) and len(value) == 1:
        [(operator, operand)] = value.items()
        if operator == "eq":
            wanted = _id(operand)
            return lambda entity: get(entity) == wanted
        if operator == "ne":
            unwanted = _id(operand)
            return lambda entity: get(entity) != unwanted
        if operator == "in" and isinstance(operand, list) and 1 <= len(operand) <= 100:
            among = {_id(v) for v in operand}
            return lambda entity: get(entity) in among
    raise _refuse(f"{field}: give an id, \"*\", or one of eq / ne / in")


class _Budget:
    def __init__(self) -> None:
        self.nodes = 0

    def take(self) -> None:
        self.nodes += 1
        if self.nodes > FILTERS_MAX_NODES:
            raise _refuse(f"at most {FILTERS_MAX_NODES} conditions")


def _compile(node: Any, depth: int, budget: _Budget) -> Predicate:
    budget.take()
    if depth > FILTERS_MAX_DEPTH:
        raise _refuse(f"at most {FILTERS_MAX_DEPTH} levels of AND / OR")
    if not isinstance(node, dict) or not node:
        raise _refuse("a filter is a non-empty object")
    parts: list[Predicate] = []
    for name, value in node.items():
        if name in ("AND", "OR"):
            if not isinstance(value, list) or not value:
                raise _refuse(f"{name} takes a non-empty list of filters")
            children = [_compile(child, depth + 1, budget) for child in value]
            if name == "AND":
                parts.append(lambda e, c=children: all(p(e) for p in c))  # type: ignore[misc]
            else:
                parts.append(lambda e, c=children: any(p(e) for p in c))  # type: ignore[misc]
        elif name in FIELDS:
            budget.take()
            parts.append(entity_condition(name, value))
        else:
            raise _refuse(f"unsupported filter field {str(name)[:40]!r}: use user_id, "
                          "agent_id, run_id, AND, OR (metadata: `policy.metadata`)")
    return lambda entity: all(p(entity) for p in parts)


def compile_filters(filters: Mapping[str, Any] | None) -> Predicate | None:
    """A predicate over a space's entities; None when there are no filters (the whole space).
    Raises VALIDATION_ERROR (no input echoed beyond a field name) on anything else."""
    if filters is None or (isinstance(filters, dict) and not filters):
        return None
    return _compile(dict(filters), 0, _Budget())


def namespaces(predicate: Predicate | None, entities: Iterable[Entity]) -> list[str] | None:
    """The namespaces of the entities the predicate selects (None: no filter, all of them)."""
    if predicate is None:
        return None
    return sorted({e.namespace for e in entities if e.namespace and predicate(e)})


def query_filters(raw: str) -> dict[str, Any]:
    """`delete_all`'s `filters` query parameter: JSON, or the Python literal the mem0 client
    sends (`str(dict)`), read with `ast.literal_eval` (literals only, never code)."""
    if len(raw) > FILTERS_MAX_CHARS:
        raise _refuse(f"at most {FILTERS_MAX_CHARS} characters")
    value: Any
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise _refuse("not a filter literal") from None
    if not isinstance(value, dict):
        raise _refuse("a filter is an object")
    return value


def entity_of(filters: Mapping[str, Any] | None, **ids: str | None) -> Entity:
    """Who an added memory is about: the ids given at the top level, else in a flat `filters`
    (the v3 client's place for them). At least one of user_id / agent_id / run_id."""
    found = {k: v for k, v in ids.items() if v is not None}
    if not found and filters:
        for name in FIELDS:
            value = filters.get(name)
            if value is not None:
                if value == "*" or not isinstance(value, str):
                    raise _refuse(f"{name}: an added memory names one id")
                found[name] = _id(value)
    if not found:
        raise ValidationFailedError("give at least one of user_id, agent_id, run_id",
                                    {"field": "user_id"})
    return Entity(**found)


def derived_from(session_id: str, sequence_id: int) -> str:
    """How an extracted memory names the session event it came from."""
    return f"{session_id}/{sequence_id}"


__all__ = [
    "FIELDS", "FILTERS_MAX_CHARS", "Predicate", "compile_filters", "derived_from",
    "entity_condition", "entity_of",
    "namespaces", "query_filters",
]
