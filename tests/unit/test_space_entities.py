"""A space's mem0 entities (`storage.spaces`): a new entity's row is written pending before the
store, so an erasure finds it whatever happens next; settled once stored, gone when refused."""

from __future__ import annotations

from pathlib import Path

import duckdb

from memgate.storage.spaces import SpaceStore

USER = "64b7f0c2a1b2c3d4e5f607dd"
IDS = (USER, None, None)


def holding(directory: Path, word: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if word.encode() in p.read_bytes())


def new_space(path: Path) -> tuple[SpaceStore, str]:
    store = SpaceStore(path)
    return store, store.create("ws", "mb", "notes", None, None).space_id


def test_a_new_entity_is_in_the_file_pending_before_its_memories_are_stored(
        tmp_path: Path) -> None:
    store, space_id = new_space(tmp_path / "spaces.duckdb")
    namespace = store.entity(space_id, IDS).namespace
    assert [e.namespace for e in store.entities_of_user("ws", USER.upper())] == [namespace]
    store.close()  # no settle: as if the process died after the store

    again = SpaceStore(tmp_path / "spaces.duckdb")
    [pending] = again.entities_of_user("ws", USER)
    assert (pending.namespace, pending.settled) == (namespace, False)
    assert again.entity(space_id, IDS).namespace == namespace  # an add, refused:
    again.settle(space_id, IDS, stored=False)  # the row stays (memories may have been stored)
    assert again.entities_of_user("ws", USER) == [pending]
    assert again.entity(space_id, IDS).namespace == namespace
    again.settle(space_id, IDS, stored=True)  # the next add that stores settles it
    again.close()
    assert SpaceStore(tmp_path / "spaces.duckdb").entities(space_id)[0].settled


def test_a_new_entity_whose_every_add_was_refused_leaves_no_row_and_no_byte(
        tmp_path: Path) -> None:
    store, space_id = new_space(tmp_path / "spaces.duckdb")
    first = store.entity(space_id, IDS)
    assert store.entity(space_id, IDS) == first  # two adds at once share the namespace
    store.settle(space_id, IDS, stored=False)
    assert store.entities(space_id) == [first]  # the other add is still under way
    store.settle(space_id, IDS, stored=False)
    assert store.entities(space_id) == [] and store.entities_of_user("ws", USER) == []
    assert store.deletions_pending
    assert holding(tmp_path, USER) == ["spaces.duckdb.wal"]  # deleted, not yet off the disk
    store.compact()
    assert holding(tmp_path, USER) == [] and not store.deletions_pending
    store.close()


def test_an_add_that_stored_keeps_the_row_whatever_the_adds_beside_it(tmp_path: Path) -> None:
    store, space_id = new_space(tmp_path / "spaces.duckdb")
    store.entity(space_id, IDS)
    store.entity(space_id, IDS)
    store.settle(space_id, IDS, stored=True)
    store.settle(space_id, IDS, stored=False)
    [kept] = store.entities(space_id)
    assert kept.settled and not store.deletions_pending


def test_entities_of_a_file_from_before_the_settled_column_are_settled(tmp_path: Path) -> None:
    path = tmp_path / "spaces.duckdb"
    with duckdb.connect(str(path)) as db:
        db.execute("CREATE TABLE entities (space_id VARCHAR NOT NULL, namespace VARCHAR NOT NULL,"
                   " user_id VARCHAR, agent_id VARCHAR, run_id VARCHAR)")
        db.execute("INSERT INTO entities VALUES ('sp_old', 'm0-old', ?, NULL, NULL)", [USER])
    store = SpaceStore(path)
    [old] = store.entities("sp_old")
    assert (old.namespace, old.settled) == ("m0-old", True)
    store.close()
