"""Pure policy: authorisation order, entity matching, what a verdict does, rank fusion, the
conversation channel's score."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memgate.contracts import Memory, Principal, Role, Scope, WorkspaceSettings
from memgate.contracts.errors import (
    AgentMemoryDisabledError, AgentMemoryPersonalDataError, InsufficientScopeError,
    MemgateError, NonRetainingWorkspaceError,
)
from memgate.contracts.registry import Citation, Verification
from memgate.policy import apply, authorise, cited, context, names_in, refuse_personal_data, rrf

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def principal(role: Role, scopes: set[Scope], *, enabled: bool = True,
              non_retaining: bool = False) -> Principal:
    return Principal(workspace_id="ws", member_id="m", credential_id="c", role=role,
                     scopes=frozenset(scopes),
                     settings=WorkspaceSettings(agent_memories_enabled=enabled,
                                                non_retaining=non_retaining))


@pytest.mark.parametrize(("who", "scope", "error"), [
    (principal(Role.VIEWER, set(), enabled=False, non_retaining=True), Scope.READ,
     NonRetainingWorkspaceError),
    (principal(Role.VIEWER, set(), enabled=False), Scope.READ, AgentMemoryDisabledError),
    (principal(Role.OWNER, {Scope.READ}), Scope.WRITE, InsufficientScopeError),
    (principal(Role.VIEWER, {Scope.READ, Scope.WRITE}), Scope.WRITE, InsufficientScopeError),
])
def test_authorise_refuses_settings_then_scope_then_role(who: Principal, scope: Scope,
                                                         error: type[MemgateError]) -> None:
    with pytest.raises(error):
        authorise(who, scope)


@pytest.mark.parametrize(("role", "scope"), [(Role.VIEWER, Scope.READ),
                                             (Role.EDITOR, Scope.WRITE)])
def test_authorise_admits_the_minimum_role(role: Role, scope: Scope) -> None:
    authorise(principal(role, {scope}), scope)


def test_personal_data_in_a_name_is_refused_naming_the_field() -> None:
    refuse_personal_data(namespace="projects", key=None)
    with pytest.raises(AgentMemoryPersonalDataError) as caught:
        refuse_personal_data(namespace="projects", key="call +44 20 7946 0958")
    assert caught.value.details == {"field": "key"}


@pytest.mark.parametrize(("query", "names", "named"), [
    ("What did ACME ship?", ("Acme",), True),
    ("acmeish tools", ("Acme",), False),
    ("ＡＣＭＥ news", ("acme",), True),  # full-width folds to ASCII
    ("東京都の会議", ("東京",), True),  # unspaced scripts: a substring is a mention
    ("大阪", ("東京",), False),
])
def test_names_in_matches_whole_words_or_unspaced_substrings(query: str,
                                                             names: tuple[str, ...],
                                                             named: bool) -> None:
    assert names_in(query, names) is named


def test_apply_hides_and_marks_without_reordering() -> None:
    citation = Citation(passage_id="p", document_id="d", version=1, sha256="0" * 64)
    memories = [Memory(memory_id=i, namespace="n", text=i, created_at=NOW,
                       citations=[citation] if i != "c" else []) for i in "abc"]
    assert set(cited(memories)) == {"a", "b"}
    shown = apply(Verification(hidden=["a"], changed=["b"]), memories)
    assert [(m.memory_id, m.source_state) for m in shown] == [("b", "changed"), ("c", "current")]


def test_rrf_sums_reciprocal_ranks_and_keeps_first_seen_order_on_ties() -> None:
    fused = rrf({"x": ["a", "b"], "y": ["b", "a"], "z": ["c"]}, 60)
    assert [f.memory_id for f in fused] == ["a", "b", "c"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)
    assert fused[0].ranks == {"x": 1, "y": 2}


def test_a_channel_weighted_zero_reports_ranks_but_fuses_nothing() -> None:
    fused = rrf({"x": ["a", "b"], "part": ["c", "b"]}, 60, {"x": 1.0, "part": 0.0})
    assert [(f.memory_id, f.ranks) for f in fused] == [("a", {"x": 1}),
                                                        ("b", {"x": 2, "part": 2})]
    assert fused[1].score == pytest.approx(1 / 62)


def test_the_conversation_score_adds_half_the_share_of_the_best_context_score() -> None:
    words = [("t1", 4.0), ("t4", 2.0), ("t2", 1.0)]  # BM25 over the turns' contexts
    meaning = [("t2", 0.6), ("t3", 0.5), ("t5", 0.4), ("t1", 0.3)]  # smoothed cosine
    # t1 0.3 + 0.5 = 0.8; t2 0.6 + 0.125; t4, below the embedder's list, counts its last
    # score: 0.3 + 0.25; t3 0.5; t5 0.4
    assert context.conversation(words, meaning, 10) == ["t1", "t2", "t4", "t3", "t5"]
    assert context.conversation(words, meaning, 2) == ["t1", "t2"]
    assert context.conversation([], meaning, 10) == ["t2", "t3", "t5", "t1"]
    assert context.conversation(words, [], 10) == ["t1", "t4", "t2"]


def test_a_turn_that_tells_more_weighs_more_than_a_short_one_or_one_that_asks() -> None:
    telling = context.turn("Bob: We pitched our tent by the lake for three nights with the kids.")
    short = context.turn("Bob: Wow, great!")
    asking = context.turn("Bob: We pitched our tent by the lake for three nights with the kids?")
    assert telling is not None and short is not None and asking is not None
    assert telling.speaker == short.speaker == "bob"
    assert telling.prior > short.prior > 0
    assert telling.prior - asking.prior == pytest.approx(context.ASKING)
    long = context.turn("Bob: " + " ".join(["word"] * 3 * context.FULL_WORDS))
    assert long is not None and long.prior == pytest.approx(context.LENGTH)  # no more past it
    assert context.turn("the shelter opens at nine") is None  # not a turn
    unspaced = context.turn("Ann: 昨日は湖のほとりにテントを張って、子供たちと三泊しました。")
    assert unspaced is not None and unspaced.prior > short.prior  # two characters a word
