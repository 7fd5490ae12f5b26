"""The owner index on its own: matching rules of BM25 ranking, and rebuilds."""

from __future__ import annotations

from pathlib import Path

from memgate.storage.text_index import OwnerIndex, split_text

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
