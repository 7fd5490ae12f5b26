"""The rules of lifecycle strategies (SPEC §4.3), as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import JsonValue, ValidationError

from memgate.contracts import ErrorCode
from memgate.contracts.errors import MemgateError
from memgate.contracts.sessions import Strategy, Trigger
from memgate.policy import conversation, lifecycle
from memgate.policy.lifecycle import Rules

pytestmark = pytest.mark.unit

T0 = datetime(2030, 1, 1, tzinfo=UTC)
OFF = Rules()  # the defaults: never disabled, at most 2 years


def s(kind: str = "soft_delete", **trigger: Any) -> Strategy:
    return Strategy.model_validate({"type": kind, "trigger": trigger or {"ttl": 60}})


def code_of(strategies: list[Strategy] | None, **options: Any) -> tuple[ErrorCode, dict[str, Any]]:
    options.setdefault("rules", OFF)
    options.setdefault("has_llm", True)
    with pytest.raises(MemgateError) as refused:
        lifecycle.validate(strategies, **options)
    return refused.value.code, refused.value.details


def test_the_default_is_soft_delete_after_180_days() -> None:
    assert lifecycle.default_strategies() == [s(ttl=180 * 24 * 3600)]


def test_one_to_five_strategies_and_the_list_cannot_be_cleared() -> None:
    assert code_of(None)[0] is ErrorCode.UNPROCESSABLE
    assert code_of([])[0] is ErrorCode.UNPROCESSABLE
    assert code_of([s()] * 6)[0] is ErrorCode.UNPROCESSABLE
    assert lifecycle.validate([s()], rules=OFF, has_llm=False) == [s()]


def test_a_type_appears_once() -> None:
    code, details = code_of([s(ttl=5), s(idle=5)])
    assert (code, details["duplicates"]) == (ErrorCode.UNPROCESSABLE, ["soft_delete"])


def test_extract_memories_needs_an_llm() -> None:
    code, details = code_of([s("extract_memories")], has_llm=False)
    assert (code, details["type"]) == (ErrorCode.UNPROCESSABLE, "extract_memories")
    assert lifecycle.validate([s("extract_memories")], rules=OFF, has_llm=True)


def test_ttl_and_idle_are_capped_by_the_installation_maximum() -> None:
    two_years = 2 * 365 * 24 * 3600
    assert lifecycle.validate([s(ttl=two_years)], rules=OFF, has_llm=False)
    assert code_of([s(ttl=two_years + 1)])[0] is ErrorCode.UNPROCESSABLE
    assert code_of([s(idle=two_years + 1)])[0] is ErrorCode.UNPROCESSABLE
    raised = Rules(max_ttl_s=5 * two_years)
    assert lifecycle.validate([s(ttl=two_years + 1)], rules=raised, has_llm=False)


def test_never_needs_the_operator_unless_the_type_already_has_it() -> None:
    code, details = code_of([s(never=True)])
    assert (code, details["type"]) == (ErrorCode.UNPROCESSABLE, "soft_delete")
    assert lifecycle.validate([s(never=True)], rules=Rules(never_enabled=True), has_llm=False)
    # read-modify-write: a session that already has never may re-send it
    assert lifecycle.validate([s(never=True), s("extract_memories", ttl=5)], rules=OFF,
                              has_llm=True, current=[s(never=True)])
    # ...but never moves to another type with it
    assert code_of([s(ttl=5), s("extract_memories", never=True)],
                   current=[s(never=True)])[0] is ErrorCode.UNPROCESSABLE
    # never → ttl is always allowed
    assert lifecycle.validate([s(ttl=5)], rules=OFF, has_llm=False, current=[s(never=True)])


def test_a_type_that_ran_cannot_be_reconfigured_but_may_be_re_sent() -> None:
    ran = {"extract_memories": Trigger(idle=600)}
    code, details = code_of([s("extract_memories", idle=900)], ran=ran)
    assert (code, details["type"]) == (ErrorCode.CONFLICT, "extract_memories")
    kept = [s("extract_memories", idle=600), s(ttl=60)]
    assert lifecycle.validate(kept, rules=OFF, has_llm=True, ran=ran) == kept
    assert lifecycle.validate([s(ttl=60)], rules=OFF, has_llm=True, ran=ran)  # dropped: fine


def test_ttl_counts_from_creation_and_idle_from_the_last_event() -> None:
    assert lifecycle.due_at(Trigger(ttl=60), created_at=T0,
                            last_event_at=T0 + timedelta(hours=1)) == T0 + timedelta(seconds=60)
    assert lifecycle.due_at(Trigger(idle=60), created_at=T0,
                            last_event_at=None) == T0 + timedelta(seconds=60)
    assert lifecycle.due_at(Trigger(idle=60), created_at=T0,
                            last_event_at=T0 + timedelta(hours=1)) == T0 + timedelta(seconds=3660)
    assert lifecycle.due_at(Trigger(never=True), created_at=T0, last_event_at=None) is None


def test_due_strategies_extract_before_they_hide_and_run_once() -> None:
    both = [s(ttl=60), s("extract_memories", ttl=60)]
    at = T0 + timedelta(seconds=60)
    due = lifecycle.due(both, now=at, created_at=T0, last_event_at=None, ran={})
    assert [d.type for d in due] == ["extract_memories", "soft_delete"]
    assert lifecycle.due(both, now=at - timedelta(seconds=1), created_at=T0,
                         last_event_at=None, ran={}) == []
    ran = {"extract_memories": Trigger(ttl=60)}
    assert [d.type for d in lifecycle.due(both, now=at, created_at=T0, last_event_at=None,
                                          ran=ran)] == ["soft_delete"]


def test_expires_at_is_when_soft_delete_will_hide_the_session() -> None:
    assert lifecycle.hidden_at([s("extract_memories", ttl=5), s(idle=60)], created_at=T0,
                               last_event_at=T0) == T0 + timedelta(seconds=60)
    assert lifecycle.hidden_at([s(never=True)], created_at=T0, last_event_at=None) is None
    assert lifecycle.hidden_at([s("extract_memories", ttl=5)], created_at=T0,
                               last_event_at=None) is None


def test_backoff_doubles_up_to_the_maximum() -> None:
    waits = [lifecycle.backoff(n, base_s=30, max_s=3600) for n in range(1, 10)]
    assert waits[:4] == [30, 60, 120, 240]
    assert max(waits) == 3600
    assert lifecycle.backoff(10_000, base_s=30, max_s=3600) == 3600


@pytest.mark.parametrize("trigger", [{}, {"ttl": 5, "idle": 5}, {"ttl": 0}, {"ttl": -1},
                                     {"ttl": True}, {"ttl": "60"}, {"never": False},
                                     {"ttl": 1.5}, {"after": 5}])
def test_a_trigger_is_exactly_one_kind_with_whole_positive_seconds(
        trigger: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Trigger.model_validate(trigger)


def test_a_trigger_is_written_back_as_it_came() -> None:
    assert s(ttl=604800).model_dump(mode="json") == {"type": "soft_delete",
                                                     "trigger": {"ttl": 604800}}
    assert s(never=True).to_json() == b'{"type":"soft_delete","trigger":{"never":true}}'


def test_a_session_that_may_be_due_is_found_from_the_stored_strategies() -> None:
    stored = [{"type": "soft_delete", "trigger": {"ttl": 60}},
              {"type": "extract_memories", "trigger": {"idle": 30}}]
    at = T0 + timedelta(seconds=40)
    assert lifecycle.may_be_due(stored, {}, now=at, created_at=T0, last_event_at=None)
    assert not lifecycle.may_be_due(stored, {}, now=at, created_at=T0,
                                    last_event_at=T0 + timedelta(seconds=20))
    assert not lifecycle.may_be_due(stored, {"extract_memories"}, now=at, created_at=T0,
                                    last_event_at=None)
    assert not lifecycle.may_be_due([{"type": "soft_delete", "trigger": {"never": True}}], {},
                                    now=T0 + timedelta(days=10_000), created_at=T0,
                                    last_event_at=None)


def test_event_bodies_are_masked_string_by_string_keys_included() -> None:
    body: JsonValue = {"to alice@example.com": ["call +1 415 555 0100", 7, None, {"ok": True}]}
    assert conversation.mask_json(body) == {"to [EMAIL]": ["call [PHONE]", 7, None, {"ok": True}]}
    assert conversation.extract_text("user", '{"content":"hi [EMAIL]"}') == "user: hi [EMAIL]"
    assert conversation.extract_text("tool", '{"x":1}') == 'tool: {"x":1}'
    assert conversation.extract_text("user", '"plain"') == 'user: "plain"'


@pytest.mark.parametrize(("header", "version"), [
    (None, None), ("*", None), ("3", 3), ('"3"', 3), ('W/"12"', 12), (' "4" ', 4)])
def test_if_match_names_a_version(header: str | None, version: int | None) -> None:
    assert conversation.if_match(header) == version


@pytest.mark.parametrize("header", ["soon", '"3', "-1", "1.5", "9" * 40, ""])
def test_a_malformed_if_match_is_a_validation_error(header: str) -> None:
    with pytest.raises(MemgateError) as refused:
        conversation.if_match(header)
    assert refused.value.code is ErrorCode.VALIDATION_ERROR
