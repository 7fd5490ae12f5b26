"""The conversation channel (issue 12) on real components: a conversation turn is found by the
words of the turns around it (context) and by cosine smoothed along the conversation; other
memories never are, and keep BM25 and cosine; a forgotten turn's words leave its neighbours'
context documents."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from memgate.contracts import RecallResult
from tests.agents import Agent
from tests.conftest import Memgate, eventually, run_memgate

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
    assert found[ids[0]][1] == 1
    assert found[ids[3]][0] is None and found[ids[3]][1] is not None, "two places on, now"
    await agent.close()


async def turns_smoothed(agent: Agent) -> set[str]:
    """The memories the embedder ranks as turns, by smoothed cosine (once all are embedded)."""
    recalled = (await agent.recall("What did Bob bring home?", limit=20)).memories
    return {m.memory_id for m in recalled if m.ranks.smoothed is not None}


async def test_the_conversation_channels_work_after_a_restart(tmp_path: Path) -> None:
    """The embedder's speakers are read again from storage; the indexer's context documents
    are on disk."""
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        owner = await memgate.workspace()
        token = await memgate.credential(owner)
        agent = await memgate.agent("bus", token)
        ids = await remember_conversation(agent)

        async def all_embedded() -> bool:
            return await turns_smoothed(agent) == set(ids)

        await eventually(all_embedded)
        await agent.close()
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        agent = await memgate.agent("bus", token)
        assert await turns_smoothed(agent) == set(ids)
        assert ranks(await agent.recall(QUESTION))[ids[3]][1] is not None
        await agent.close()


async def test_turns_are_ranked_by_the_conversation_channels_and_facts_by_the_others(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    ids = await remember_conversation(agent)
    fact = await agent.remember("notes", "Bob keeps the spare office keys in his desk")

    async def embedded() -> bool:  # the embedder catches up from the events stream
        recalled = (await agent.recall("Bob kitten keys", limit=20)).memories
        return (any(m.ranks.smoothed is not None for m in recalled)
                and any(m.ranks.cosine is not None for m in recalled))

    await eventually(embedded)
    result = await agent.recall("Bob kitten keys", limit=20)
    recalled = {m.memory_id: m.ranks for m in result.memories}
    assert {i for i, r in recalled.items() if r.conversation is not None} == set(ids)
    assert recalled[ids[3]].context == 1 and recalled[ids[3]].smoothed is not None
    assert all(recalled[i].bm25 is None and recalled[i].cosine is None
               for i in ids if i in recalled), "turns leave the plain channels"
    assert recalled[fact.memory_id].bm25 == 1 and recalled[fact.memory_id].cosine is not None
    assert recalled[fact.memory_id].conversation is None
    await agent.close()


async def test_a_turn_that_shares_no_word_with_the_query_is_found_by_meaning(
    memgate: Memgate,
) -> None:
    """The cosine channel leaves turns out: their smoothed cosine is how a paraphrase finds one."""
    agent = await memgate.new_agent("bus")
    ids = await remember_conversation(agent)

    async def found_by_meaning() -> bool:
        recalled = (await agent.recall("Did anyone get a new pet?")).memories
        return any(m.memory_id == ids[3] and m.ranks.smoothed is not None for m in recalled)

    await eventually(found_by_meaning)
    recalled = (await agent.recall("Did anyone get a new pet?")).memories
    assert all(m.ranks.context is None and m.ranks.conversation is not None for m in recalled)
    await agent.close()



# The question's words are in the turn that asks; the answer is three places on, beyond two
# short replies.
LAKE = [
    "Alice: How was your week?",
    "Bob: Busy, but good.",
    "Alice: Did the kids enjoy the trip to the lake?",
    "Bob: Oh yes!",
    "Alice: Really?",
    "Bob: They swam every morning and caught four trout with their grandfather, then grilled "
    "them on the fire.",
    "Alice: Lovely!",
    "Bob: Anyway, work starts again on Monday.",
]


async def test_a_turn_that_tells_outranks_short_turns_and_questions_near_the_words(
    memgate: Memgate,
) -> None:
    """The turns' prior (`policy/context.py`): without it the short question "Really?", next
    to the words, and "How was your week?" rank above the answer."""
    agent = await memgate.new_agent("bus")
    ids = [(await agent.remember("chat", turn)).memory_id for turn in LAKE]
    question = "What did the kids do at the lake?"

    async def all_embedded() -> bool:
        recalled = (await agent.recall(question, limit=20)).memories
        return sum(m.ranks.smoothed is not None for m in recalled) == len(ids)

    await eventually(all_embedded)
    order = [m.memory_id for m in (await agent.recall(question, limit=20)).memories]
    assert order.index(ids[5]) < order.index(ids[4]), "the answer above \"Really?\""
    assert order.index(ids[5]) < order.index(ids[0]), "and above \"How was your week?\""
    await agent.close()
