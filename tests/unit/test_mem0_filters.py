"""Pure rules of the mem0-compatible API: filters (flat, AND / OR, operators) resolved to
namespaces, the query-string literal read without eval, the entity of an add, and the reading
of an LLM's fact-extraction answer."""

from __future__ import annotations

from typing import Any

import pytest

from memgate.contracts.errors import ValidationFailedError
from memgate.contracts.spaces import Entity
from memgate.policy import extraction
from memgate.policy.mem0 import compile_filters, entity_of, namespaces, query_filters

pytestmark = pytest.mark.unit

ENTITIES = [
    Entity(user_id="alex", agent_id="bot", run_id="r1", namespace="n1"),
    Entity(user_id="alex", run_id="r2", namespace="n2"),
    Entity(user_id="sam", agent_id="bot", namespace="n3"),
    Entity(agent_id="bot", namespace="n4"),
]


def selected(filters: dict[str, Any] | None) -> list[str] | None:
    return namespaces(compile_filters(filters), ENTITIES)


@pytest.mark.parametrize(("filters", "expected"), [
    (None, None),
    ({}, None),
    ({"user_id": "alex"}, ["n1", "n2"]),
    ({"user_id": "alex", "agent_id": "bot"}, ["n1"]),
    ({"user_id": "nobody"}, []),
    ({"user_id": "*"}, ["n1", "n2", "n3"]),
    ({"AND": [{"agent_id": "bot"}, {"user_id": "*"}]}, ["n1", "n3"]),
    ({"OR": [{"run_id": "r2"}, {"user_id": "sam"}]}, ["n2", "n3"]),
    ({"AND": [{"agent_id": "bot"}, {"OR": [{"user_id": "sam"}, {"run_id": "r1"}]}]},
     ["n1", "n3"]),
    ({"user_id": {"in": ["sam", "kim"]}}, ["n3"]),
    ({"user_id": {"eq": "sam"}}, ["n3"]),
    ({"agent_id": "bot", "user_id": {"ne": "alex"}}, ["n3", "n4"]),
])
def test_filters_select_the_namespaces_of_the_entities_they_name(
        filters: dict[str, Any] | None, expected: list[str] | None) -> None:
    assert selected(filters) == expected


@pytest.mark.parametrize("filters", [
    {"app_id": "x"},
    {"NOT": {"user_id": "a"}},
    {"user_id": 5},
    {"user_id": ""},
    {"user_id": "a" * 201},
    {"user_id": {"gte": "a"}},
    {"user_id": {"in": "abc"}},
    {"user_id": {"in": []}},
    {"AND": []},
    {"OR": {"user_id": "a"}},
    {"AND": [{}]},
    {"AND": ["user_id"]},
    {"OR": [{"user_id": str(i)} for i in range(100)]},
    {"AND": [{"AND": [{"AND": [{"AND": [{"AND": [{"AND": [{"AND": [{"user_id": "a"}]}]}]}]}]}]}]},
])
def test_malformed_filters_are_a_validation_error_that_echoes_no_input(
        filters: dict[str, Any]) -> None:
    with pytest.raises(ValidationFailedError) as refused:
        compile_filters(filters)
    assert "a" * 50 not in str(refused.value.details)


def test_query_string_filters_are_read_as_json_or_a_python_literal() -> None:
    assert query_filters("{'user_id': 'alex'}") == {"user_id": "alex"}
    assert query_filters('{"AND": [{"user_id": "alex"}, {"run_id": "r1"}]}') == {
        "AND": [{"user_id": "alex"}, {"run_id": "r1"}]}
    assert query_filters("{'OR': [{'user_id': 'a'}, {'agent_id': None}]}")["OR"][1] == {
        "agent_id": None}


@pytest.mark.parametrize("raw", [
    "__import__('os').system('touch /tmp/pwned')",
    "open('/etc/passwd').read()",
    "(lambda: 1)()",
    "[1, 2]",
    "'a string'",
    "{'user_id': 'a'}" * 400,  # over the size limit
    "[" * 3000,
    "-" * 3000 + "1",
    "{1: " * 1000,
    "not a literal",
    "",
])
def test_query_string_filters_are_never_evaluated(raw: str) -> None:
    with pytest.raises(ValidationFailedError):
        query_filters(raw)


def test_an_added_memory_is_about_the_ids_given_at_the_top_or_in_flat_filters() -> None:
    assert entity_of(None, user_id="alex", agent_id=None, run_id=None) == Entity(user_id="alex")
    assert entity_of({"user_id": "alex", "run_id": "r1"}) == Entity(user_id="alex", run_id="r1")
    assert entity_of({"user_id": "x"}, agent_id="bot") == Entity(agent_id="bot")
    for filters in (None, {}, {"user_id": "*"}, {"user_id": {"in": ["a"]}}):
        with pytest.raises(ValidationFailedError):
            entity_of(filters)


@pytest.mark.parametrize(("content", "facts"), [
    ('{"facts": ["Likes tea", "Lives in Haifa"]}', ["Likes tea", "Lives in Haifa"]),
    ('```json\n{"facts": ["Likes tea"]}\n```', ["Likes tea"]),
    ('{"facts": []}', []),
    ('{"facts": ["  Likes   tea ", "Likes tea", ""]}', ["Likes tea"]),
    ('{"facts": ["' + "x" * 2000 + '"]}', ["x" * 1000]),
])
def test_the_llms_answer_gives_its_facts(content: str, facts: list[str]) -> None:
    assert extraction.facts(content) == facts


@pytest.mark.parametrize("content", [
    "Sure! Here are the facts:", '{"memories": ["a"]}', '{"facts": "a"}', '{"facts": [1]}',
    '["a"]', None, "",
])
def test_an_answer_that_is_not_the_asked_json_is_malformed(content: Any) -> None:
    with pytest.raises(extraction.MalformedAnswerError):
        extraction.facts(content)


def test_the_prompt_carries_the_masked_lines_and_asks_for_json() -> None:
    messages = extraction.prompt(["user: my mail is [EMAIL]", "assistant: noted"])
    assert messages[0]["role"] == "system" and '{"facts"' in messages[0]["content"]
    assert messages[1]["content"].endswith("user: my mail is [EMAIL]\nassistant: noted")
