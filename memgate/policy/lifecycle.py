"""Lifecycle strategies of sessions (SPEC §4.3): validation, and when each one falls due.

Pure rules: the sessions actor passes in what it knows (the session's current strategies, the
types that already ran, the operator's settings, whether the space has an LLM).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from memgate.contracts.errors import ConflictError, UnprocessableError
from memgate.contracts.sessions import MAX_STRATEGIES, Strategy, Trigger

DEFAULT_TTL_S = 180 * 24 * 3600
DEFAULT_MAX_TTL_S = 2 * 365 * 24 * 3600

# When several strategies are due at once: extract the conversation before hiding it.
ORDER = ("extract_memories", "soft_delete")


def default_strategies() -> list[Strategy]:
    """What a session gets when it names none: soft_delete after 180 days."""
    return [Strategy(type="soft_delete", trigger=Trigger(ttl=DEFAULT_TTL_S))]


@dataclass(frozen=True)
class Rules:
    """The installation's rules: may `never` be used, the longest ttl or idle allowed."""

    never_enabled: bool = False
    max_ttl_s: int = DEFAULT_MAX_TTL_S


def validate(strategies: Sequence[Strategy] | None, *, rules: Rules, has_llm: bool,
             current: Sequence[Strategy] = (),
             ran: Mapping[str, Trigger] | None = None) -> list[Strategy]:
    """The strategies to keep, or UNPROCESSABLE (422) / CONFLICT (409).

    `current`: the session's strategies before this update (none at creation); `ran`: the
    types that already ran on it, with the trigger they ran under."""
    if not strategies:
        raise UnprocessableError("a session needs 1 to 5 lifecycle strategies; the list cannot "
                                 "be cleared", {"field": "lifecycleStrategies"})
    if len(strategies) > MAX_STRATEGIES:
        raise UnprocessableError(f"a session has at most {MAX_STRATEGIES} lifecycle strategies",
                                 {"field": "lifecycleStrategies", "max": MAX_STRATEGIES})
    types = [strategy.type for strategy in strategies]
    duplicates = sorted({kind for kind in types if types.count(kind) > 1})
    if duplicates:
        raise UnprocessableError("each strategy type may appear once",
                                 {"field": "lifecycleStrategies", "duplicates": duplicates})
    if "extract_memories" in types and not has_llm:
        raise UnprocessableError("extract_memories needs a memory space with an LLM",
                                 {"field": "lifecycleStrategies", "type": "extract_memories"})
    had_never = {strategy.type for strategy in current if strategy.trigger.never}
    for strategy in strategies:
        seconds = strategy.trigger.ttl or strategy.trigger.idle
        if seconds is not None and seconds > rules.max_ttl_s:
            raise UnprocessableError("the trigger exceeds the installation's maximum session "
                                     "TTL", {"field": "lifecycleStrategies",
                                             "type": strategy.type, "maxSeconds": rules.max_ttl_s})
        if strategy.trigger.never and not rules.never_enabled and strategy.type not in had_never:
            raise UnprocessableError("the never trigger is not enabled on this installation",
                                     {"field": "lifecycleStrategies", "type": strategy.type})
    for strategy in strategies:
        before = (ran or {}).get(strategy.type)
        if before is not None and before != strategy.trigger:
            raise ConflictError(f"the {strategy.type} strategy already ran on this session and "
                                "cannot be reconfigured", {"type": strategy.type})
    return list(strategies)


def due_at(trigger: Trigger, *, created_at: datetime,
           last_event_at: datetime | None) -> datetime | None:
    """When a strategy with this trigger falls due (None: never). `ttl` counts from the
    session's creation, `idle` from its last event (or its creation, before any event)."""
    if trigger.ttl is not None:
        return created_at + timedelta(seconds=trigger.ttl)
    if trigger.idle is not None:
        return (last_event_at or created_at) + timedelta(seconds=trigger.idle)
    return None


def hidden_at(strategies: Sequence[Strategy], *, created_at: datetime,
              last_event_at: datetime | None) -> datetime | None:
    """When soft_delete will hide the session, as known now (the §5.1 `expires_at`)."""
    for strategy in strategies:
        if strategy.type == "soft_delete":
            return due_at(strategy.trigger, created_at=created_at, last_event_at=last_event_at)
    return None


def due(strategies: Sequence[Strategy], *, now: datetime, created_at: datetime,
        last_event_at: datetime | None, ran: Mapping[str, Trigger]) -> list[Strategy]:
    """The strategies due at `now` that have not run, extraction first."""
    found = [strategy for strategy in strategies if strategy.type not in ran
             and (when := due_at(strategy.trigger, created_at=created_at,
                                 last_event_at=last_event_at)) is not None and when <= now]
    return sorted(found, key=lambda strategy: ORDER.index(strategy.type))


def may_be_due(strategies: Sequence[Mapping[str, Any]], ran: Container[str], *,
               now: datetime, created_at: datetime, last_event_at: datetime | None) -> bool:
    """A cheap first look at strategies as stored (`{type, trigger}` dicts, unparsed): could
    any be due now? The scheduler parses only the sessions for which it is true."""
    for strategy in strategies:
        if strategy["type"] in ran:
            continue
        trigger = strategy["trigger"]
        start = created_at if "ttl" in trigger else last_event_at or created_at
        seconds = trigger.get("ttl", trigger.get("idle"))
        if seconds is not None and start + timedelta(seconds=seconds) <= now:
            return True
    return False


def backoff(attempts: int, *, base_s: float, max_s: float) -> float:
    """Seconds to wait after the `attempts`-th failure in a row: base, 2×base, 4×base… ≤ max."""
    return float(min(max_s, base_s * 2 ** min(max(attempts - 1, 0), 30)))


__all__ = ["DEFAULT_MAX_TTL_S", "DEFAULT_TTL_S", "Rules", "backoff", "default_strategies",
           "due", "due_at", "hidden_at", "may_be_due", "validate"]
