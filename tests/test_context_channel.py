"""The context channel (issue 12) on real components: a conversation turn is found by the words
of the turns around it; other memories never are; a forgotten turn's words leave its
neighbours' context documents."""

from __future__ import annotations

from memgate.contracts import RecallResult
from tests.agents import Agent
from tests.conftest import Memgate, eventually

# The answer (index 3) shares no word with the question; the turn two places before it does.
TURNS = [
    "Alice: Morning! How was your weekend?",
    "Bob: I spent Saturday at the animal shelter downtown.",
    "Alice: Oh nice, did anything come of it?",
    "Bob: We brought home a tiny grey kitten called Pebble.",
    "Alice: That is wonderful news.",
    "Bob: Thanks, she sleeps on my keyboard all day.",
    "Alice: By the way, the quarterly report is due Friday.",
    "Bob: Right, I will send my numbers tomorrow.",
]
QUESTION = "What was adopted at the animal shelter?"


async def remember_conversation(agent: Agent) -> list[str]:
    return [(await agent.remember("chat", turn)).memory_id for turn in TURNS]


def ranks(result: RecallResult) -> dict[str, tuple[int | None, int | None]]:
    """memory id -> (its BM25 rank, its context rank)."""
    return {m.memory_id: (m.ranks.bm25, m.ranks.context) for m in result.memories}


async def test_a_turn_is_recalled_by_the_words_of_the_turns_around_it(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    ids = await remember_conversation(agent)
    found = ranks(await agent.recall(QUESTION))
    answer = found[ids[3]]
    assert answer[0] is None, "no word of its own matches"
    assert answer[1] is not None, "the context channel ranks it"
    assert found[ids[1]][1] == 1, "the turn that holds the words ranks first"
    assert found.get(ids[6], (None, None))[1] is None, "too far from the words"
    await agent.close()


async def test_a_memory_that_is_not_a_turn_has_no_context_rank(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    fact = await agent.remember("chat", "the animal shelter opens at nine on weekdays")
    await agent.remember("chat", "parking near the office is free after six")
    await agent.remember("chat", "the kitten food brand is Purrfect")
    found = ranks(await agent.recall(QUESTION))
    assert found[fact.memory_id] == (1, None)
    assert all(context is None for _, context in found.values())
    await agent.close()


async def test_forgetting_a_turn_takes_its_words_out_of_its_neighbours_context(
    memgate: Memgate,
) -> None:
    agent = await memgate.new_agent("bus")
    ids = await remember_conversation(agent)
    assert ranks(await agent.recall(QUESTION))[ids[3]][1] is not None
    assert (await agent.forget(memory_id=ids[1])).deleted == 1

    async def gone_from_the_context() -> bool:
        return all(context is None for _, context in ranks(await agent.recall(QUESTION)).values())

    await eventually(gone_from_the_context)
    assert ids[1] not in ranks(await agent.recall(QUESTION))
    # the remaining turns' contexts were made again without it, not dropped
    found = ranks(await agent.recall("weekend"))
    assert found[ids[0]][0] == 1
    assert found[ids[3]][0] is None and found[ids[3]][1] is not None, "two places on, now"
    await agent.close()
