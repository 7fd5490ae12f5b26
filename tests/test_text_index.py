"""The owner index on its own: matching rules of BM25 ranking, and rebuilds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tantivy

from memgate.storage import text_index
from memgate.storage.text_index import OwnerIndex, TextIndexes, split_text

MEMORIES = [
    ("deploy", "The user deploys to production on Fridays"),
    ("release", "Release notes are written by the docs team"),
    ("meeting", "毎週月曜日の朝に定例会議がある"),
    ("orion", "Project ORION-42 uses Postgres 15"),
]
IDS = [memory_id for memory_id, _ in MEMORIES]


def index(tmp_path: Path) -> OwnerIndex:
    owner = OwnerIndex(tmp_path / "owner")
    owner.add(MEMORIES)
    return owner


def test_words_are_stemmed_and_stopwords_do_not_match(tmp_path: Path) -> None:
    owner = index(tmp_path)
    assert owner.rank("deploying on friday", IDS) == ["deploy"]
    assert owner.rank("what is the", IDS) == []
    assert owner.rank("orion-42", IDS) == ["orion"]


def test_one_shared_word_out_of_several_is_not_a_match(tmp_path: Path) -> None:
    owner = index(tmp_path)
    assert owner.rank("when do releases ship to customers", IDS) == []
    assert owner.rank("release notes", IDS) == ["release"]


def test_cjk_runs_match_by_character_ngrams_and_width_is_folded(tmp_path: Path) -> None:
    owner = index(tmp_path)
    assert owner.rank("定例会議はいつ", IDS) == ["meeting"]
    assert owner.rank("ＯＲＩＯＮ", IDS) == ["orion"]
    assert split_text("ﾃﾞﾌﾟﾛｲ")[1].split()[:2] == ["デ", "プ"]


def test_only_candidates_are_ranked(tmp_path: Path) -> None:
    owner = index(tmp_path)
    assert owner.rank("deploys fridays", ["release", "meeting"]) == []


def test_a_rebuild_drops_terms_and_the_old_generation(tmp_path: Path) -> None:
    owner = index(tmp_path)
    assert owner.terms_with_prefix("text", "postgr") == ["postgr"]
    owner.rebuild(MEMORIES[:3])
    assert owner.terms_with_prefix("text", "postgr") == []
    assert [p.name for p in (tmp_path / "owner").iterdir()] == ["gen-1"]
    assert OwnerIndex(tmp_path / "owner").ids == set(IDS[:3])


def test_an_index_of_an_older_format_is_replaced_by_an_empty_one(tmp_path: Path) -> None:
    """Made before a schema change (its READY names no format, or another): not opened, and
    removed; the indexer's catch-up adds every version again."""
    old = tmp_path / "owner" / "gen-0"
    old.mkdir(parents=True)
    tantivy.Index(tantivy.SchemaBuilder().add_text_field("text").build(), path=str(old))
    (old / "READY").touch()
    owner = OwnerIndex(tmp_path / "owner")
    assert owner.ids == set()
    assert [p.name for p in (tmp_path / "owner").iterdir()] == ["gen-1"]
    owner.add(MEMORIES)
    assert owner.rank("deploying on friday", IDS) == ["deploy"]
    assert OwnerIndex(tmp_path / "owner").generation == 1


def test_the_context_document_is_searched_apart_and_turns_may_be_left_out(
    tmp_path: Path,
) -> None:
    owner = OwnerIndex(tmp_path / "owner")
    owner.add([("fact", "the shelter opens at nine"), ("turn", "Bob: we got a kitten")],
              {"turn": "Bob: we got a kitten " * 3 + "Alice: how was the animal shelter?"})
    assert owner.rank("animal shelter") == ["fact"]
    assert [memory_id for memory_id, _ in owner.rank_context("animal shelter")] == ["turn"]
    assert owner.rank("kitten") == ["turn"]
    assert owner.rank("kitten", turns=False) == []
    assert owner.rank("shelter opens", turns=False) == ["fact"]


def committed_ids(root: Path, limit: int = 100) -> set[str]:
    """The ids another reader of the directory sees (what has been committed)."""
    generation = max(root.glob("gen-*"), key=lambda p: int(p.name[4:]))
    searcher = tantivy.Index.open(str(generation)).searcher()
    hits = searcher.search(tantivy.Query.all_query(), limit=limit).hits
    return {searcher.doc(address)["memory_id"][0] for _, address in hits}


def test_added_documents_wait_until_due_and_searches_find_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("memgate.storage.text_index.time.monotonic", lambda: clock[0])
    indexes = TextIndexes(tmp_path)
    owner = indexes.owner("ws", "member")
    owner.add(MEMORIES[:1])
    assert indexes.commit_due() == text_index.COMMIT_EVERY_S
    assert owner.rank("release notes", IDS) == []  # "deploy" holds neither word: it waits
    assert committed_ids(tmp_path / "ws__member") == set()
    owner.add(MEMORIES[1:2])
    # no committed document holds these words: nothing to score it by, so committed first
    assert owner.rank("release notes", IDS) == ["release"]
    assert committed_ids(tmp_path / "ws__member") == {"deploy", "release"}
    assert indexes.commit_due() is None
    owner.add([("notes", "Notes from the release review")])
    assert owner.rank("release notes") == ["notes", "release"]  # scored while it waits (shorter)
    assert committed_ids(tmp_path / "ws__member") == {"deploy", "release"}
    clock[0] += text_index.COMMIT_EVERY_S - 1
    assert indexes.commit_due() == 1
    clock[0] += 1
    assert indexes.commit_due() is None
    assert committed_ids(tmp_path / "ws__member") == {"deploy", "release", "notes"}


CORPUS = [  # lengths below and above 40 tokens (stored rounded), repeated words, CJK
    ("short", "release notes"),
    ("repeat", "release release release of the notes"),
    ("long", "the release " + "of many other words " * 12 + "notes at the end"),
    ("longer", "notes " + "padding words to make it long " * 30 + "release"),
    ("cjk", "リリースノートは毎週月曜日に出る release"),
    ("other", "nothing in common here"),
]


@pytest.mark.parametrize("query", ["release notes", "notes", "release of notes today",
                                   "リリースノート", "毎週 release"])
def test_a_waiting_document_is_scored_as_tantivy_scores_it(tmp_path: Path, query: str) -> None:
    """Every document committed, then all added again (the same text): each now waits, and is
    scored here with the same statistics; the ranking and scores are Tantivy's own."""
    owner = OwnerIndex(tmp_path / "owner")
    turns = {memory_id: text + " and the release notes again" for memory_id, text in CORPUS}
    owner.add(CORPUS, turns)
    owner.commit()
    ranked, context = owner.rank(query), owner.rank_context(query)
    assert ranked and context
    owner.add(CORPUS, turns)
    assert owner.pending
    assert owner.rank(query) == ranked
    again = owner.rank_context(query)
    assert [i for i, _ in again] == [i for i, _ in context]
    assert [s for _, s in again] == pytest.approx([s for _, s in context], rel=1e-5)
    assert owner.pending  # scored, not committed


def test_a_search_finds_every_document_it_would_find_after_a_commit(tmp_path: Path) -> None:
    """Whichever waiting documents a search leaves waiting, it answers as after a commit."""
    queries = ["deploying on friday", "release notes", "定例会議", "ＯＲＩＯＮ postgres", "docs",
               "the of"]
    committed = index(tmp_path / "a")
    committed.commit()
    expected = {query: committed.rank(query, IDS) for query in queries}
    for i, query in enumerate(queries):
        for waiting in range(len(MEMORIES) + 1):
            fresh = OwnerIndex(tmp_path / f"{i}-{waiting}")
            fresh.add(MEMORIES[waiting:])
            fresh.commit()
            fresh.add(MEMORIES[:waiting])
            assert fresh.rank(query, IDS) == expected[query]


def test_many_added_documents_are_committed_at_once(tmp_path: Path) -> None:
    owner = OwnerIndex(tmp_path / "owner")
    owner.add([(f"m{i}", f"note {i}") for i in range(text_index.PENDING_AT_MOST - 1)])
    assert owner.pending
    owner.add([("last", "the last note")])
    assert not owner.pending
    assert len(committed_ids(tmp_path / "owner", limit=1000)) == text_index.PENDING_AT_MOST


@pytest.mark.parametrize("text", [
    "Deploys, DEPLOYING & deployed: x" + "y" * 45 + " café naïve foo_bar e-mail O'Brien 42nd",
    "ﾃﾞﾌﾟﾛｲ 毎週月曜日 and ＯＲＩＯＮ-42 ünïcödé",
])
def test_the_terms_of_a_waiting_document_are_those_tantivy_indexes(
    tmp_path: Path, text: str
) -> None:
    owner = OwnerIndex(tmp_path / "owner")
    owner.add([("m", text)])
    owner.commit()
    words, grams = split_text(text)
    indexed = {*owner.terms_with_prefix("text", ""), *owner.terms_with_prefix("cjk", "")}
    assert indexed == {*text_index.EN_STEM.analyze(words), *grams.split()}


def test_closing_commits_and_frees_the_directory_for_another_writer(tmp_path: Path) -> None:
    indexes = TextIndexes(tmp_path)
    indexes.owner("ws", "member").add(MEMORIES[:2])
    indexes.close()
    again = OwnerIndex(tmp_path / "ws__member")  # its writer would fail while one is open
    again.add(MEMORIES[2:])
    assert again.rank("定例会議", IDS) == ["meeting"]
    assert again.ids == set(IDS)


def test_owners_used_on_many_threads_at_once_lose_nothing(tmp_path: Path) -> None:
    """Eviction never touches an index another thread is using."""
    indexes = TextIndexes(tmp_path, open_limit=2)

    def work(owner: str) -> list[list[str]]:
        found = []
        for i in range(6):
            indexes.use("ws", owner, lambda index, i=i: index.add([(f"{owner}-{i}", f"note {i}")]))
            found.append(indexes.use("ws", owner, lambda index: index.rank("note")))
        return found

    owners = [f"m{i}" for i in range(6)]
    with ThreadPoolExecutor(max_workers=len(owners)) as pool:
        results = dict(zip(owners, pool.map(work, owners), strict=True))
    for owner, found in results.items():
        assert [sorted(ids) for ids in found] == [sorted(f"{owner}-{j}" for j in range(i + 1))
                                                  for i in range(6)]
    indexes.close()
    assert committed_ids(tmp_path / "ws__m0") == {f"m0-{j}" for j in range(6)}
