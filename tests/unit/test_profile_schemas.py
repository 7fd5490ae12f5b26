"""A space's profile schema and the reading of its LLM's profile (`policy.profiles`): pure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memgate.contracts.errors import AgentMemoryPersonalDataError, ValidationFailedError
from memgate.policy.extraction import MalformedAnswerError
from memgate.policy.profiles import DEFAULT_SCHEMA, checked_schema, profile_of, prompt

EMAIL = "alex.doe@example.com"
SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "summary": {"type": "string", "description": f"who they are ({EMAIL})"},
    "likes": {"type": "array", "items": {"type": "string"}, "description": "likes"},
    "pattern": {"type": "string", "description": "a property named like a keyword"}}}


def test_a_described_object_schema_is_kept_with_its_strings_masked() -> None:
    kept = checked_schema(SCHEMA)
    assert kept["properties"]["summary"]["description"] == "who they are ([EMAIL])"
    assert checked_schema(DEFAULT_SCHEMA) == DEFAULT_SCHEMA


@pytest.mark.parametrize(("schema", "problem"), [
    ("an object", "a JSON Schema object"),
    ({"type": "array"}, '"type": "object"'),
    ({"type": "object", "properties": {}}, "properties"),
    ({"type": "object", "properties": {"a": {"type": "string"}}}, "description"),
    ({"type": "object", "properties": {"a": {"type": "strung", "description": "d"}}},
     "valid JSON Schema"),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.org/x",
                                             "description": "d"}}}, "$ref"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(a+)+$",
                                             "description": "d"}}}, "pattern"),
    ({"type": "object", "properties": {"a": {"description": "d", "x": [[[[[[[[[1]]]]]]]]]}}},
     "levels"),
    ({"type": "object", "properties": {f"p{n}": {"description": "d"} for n in range(51)}},
     "properties"),
])
def test_a_schema_that_is_not_one_is_refused_naming_the_problem(schema: Any,
                                                                problem: str) -> None:
    with pytest.raises(ValidationFailedError) as refused:
        checked_schema(schema)
    assert refused.value.details["field"] == "entities.user.schema"
    assert problem in refused.value.details["problem"]


def test_a_schema_key_holding_personal_data_is_refused() -> None:
    with pytest.raises(AgentMemoryPersonalDataError):
        checked_schema({"type": "object", "properties": {EMAIL: {"description": "d"}}})


def test_the_prompt_carries_the_schema_the_instructions_and_the_memories() -> None:
    system, user = prompt(SCHEMA, "be brief", ["I like tea", "I ride\na bike"])
    assert json.dumps(SCHEMA) in system["content"] and "be brief" in system["content"]
    assert user["content"] == "Facts:\n- I like tea\n- I ride a bike"


def test_a_profile_is_kept_validated_trimmed_to_the_schema_and_masked() -> None:
    answer = json.dumps({"summary": f"writes from {EMAIL}", "likes": ["tea"], "extra": 1})
    assert profile_of(f"```json\n{answer}\n```", SCHEMA) == {
        "summary": "writes from [EMAIL]", "likes": ["tea"]}


@pytest.mark.parametrize("content", [
    None, "Sure! Here it is", "[1, 2]", json.dumps({"likes": "tea"}),
    json.dumps({"summary": "x" * 40_000}),
])
def test_an_answer_that_is_no_profile_is_malformed(content: Any) -> None:
    with pytest.raises(MalformedAnswerError):
        profile_of(content, SCHEMA)
