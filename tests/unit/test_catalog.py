"""The per-owner catalog on its own: a recall's filters as a mask, supersession derived from keys
as storage does it, deletions, and cosine over the owner's matrix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memgate.contracts.internal import CatalogRows, Owner, RecallFilters
from memgate.policy import context
from memgate.policy.context import Turn
from memgate.storage.catalog import Catalog

pytestmark = pytest.mark.unit

OWNER = Owner(tenant="ws", subject_id="member")
START = datetime(2026, 1, 1, tzinfo=UTC)


def rows(*specs: tuple[str, int, str, str | None, str | None], high: int | None = None,
         superseded: dict[str, datetime] | None = None) -> CatalogRows:
    """(id, seq, namespace, key, collection) per version, created `seq` minutes after START."""
    return CatalogRows(
        high_seq=high if high is not None else max(s[1] for s in specs),
        memory_ids=[s[0] for s in specs], seqs=[s[1] for s in specs],
        namespaces=[s[2] for s in specs], keys=[s[3] for s in specs],
        collection_ids=[s[4] for s in specs],
        created_at=[START + timedelta(minutes=s[1]) for s in specs],
        superseded_at=[(superseded or {}).get(s[0]) for s in specs],
        legal_hold=[False] * len(specs))


def allowed(catalog: Catalog, **filters: object) -> set[str]:
    mask = catalog.allowed(RecallFilters(owner=OWNER, **filters))  # type: ignore[arg-type]
    return {catalog.ids[row] for row in np.flatnonzero(mask)}


def test_filters_become_a_mask_over_the_versions() -> None:
    catalog = Catalog()
    catalog.apply(rows(("a", 1, "prefs", None, None), ("b", 2, "team", None, "c1"),
                       ("c", 3, "team", None, "c2")))
    assert allowed(catalog) == {"a", "b", "c"}
    assert allowed(catalog, namespace="team") == {"b", "c"}
    assert allowed(catalog, namespace="nowhere") == set()
    assert allowed(catalog, collection_id="c1") == {"b"}
    assert allowed(catalog, collection_ids=["c2", "unknown"]) == {"c"}
    assert allowed(catalog, as_of=START + timedelta(minutes=2)) == {"a", "b"}
    assert allowed(catalog, window=2) == {"b", "c"}  # the newest two


def test_a_new_version_of_a_key_supersedes_the_current_one_at_its_creation() -> None:
    catalog = Catalog()
    catalog.apply(rows(("v1", 1, "prefs", "deploy", None)))
    catalog.apply(rows(("v2", 5, "prefs", "deploy", None), ("other", 6, "team", "deploy", None)))
    assert catalog.seq == 6
    assert allowed(catalog) == {"v2", "other"}
    assert allowed(catalog, as_of=START + timedelta(minutes=4)) == {"v1"}


def test_versions_storage_reports_superseded_stay_superseded() -> None:
    catalog = Catalog()
    catalog.apply(rows(("v1", 1, "n", "k", None), ("v2", 2, "n", "k", None),
                       superseded={"v1": START + timedelta(minutes=2)}))
    assert allowed(catalog) == {"v2"}


def test_removed_versions_leave_and_vectors_stay_aligned() -> None:
    catalog = Catalog(dim=2)
    catalog.apply(rows(("a", 1, "n", None, None), ("b", 2, "n", None, None),
                       ("c", 3, "n", None, None)))
    catalog.set_vectors(["a", "b", "c"], np.array([[1, 0], [0, 1], [0.6, 0.8]], np.float32))
    catalog.remove(["a", "unknown"])
    assert catalog.ids == ["b", "c"] and "a" not in catalog
    mask = catalog.allowed(RecallFilters(owner=OWNER))
    assert catalog.nearest(np.array([1, 0], np.float32), mask, depth=10) == ["c", "b"]
    assert catalog.nearest(np.array([1, 0], np.float32), mask, depth=1) == ["c"]


def test_only_embedded_and_allowed_rows_are_nearest() -> None:
    catalog = Catalog(dim=2)
    catalog.apply(rows(("a", 1, "n", None, None), ("b", 2, "n", None, None),
                       ("c", 3, "other", None, None)))
    catalog.set_vectors(["a", "c"], np.array([[1, 0], [1, 0]], np.float32))
    assert catalog.unembedded() == ["b"]
    mask = catalog.allowed(RecallFilters(owner=OWNER, namespace="n"))
    assert catalog.nearest(np.array([0, 1], np.float32), mask, depth=10) == ["a"]


def test_many_versions_grow_the_columns() -> None:
    catalog = Catalog(dim=4)
    catalog.apply(rows(*[(f"m{i}", i, "n", None, None) for i in range(1, 301)]))
    catalog.set_vectors([f"m{i}" for i in range(1, 301)], np.eye(4, dtype=np.float32)[
        [i % 4 for i in range(1, 301)]])
    assert len(catalog) == 300 and catalog.unembedded() == []
    mask = catalog.allowed(RecallFilters(owner=OWNER, window=8))
    nearest = catalog.nearest(np.eye(4, dtype=np.float32)[1], mask, depth=5)
    assert len(nearest) == 5 and set(nearest[:2]) == {"m293", "m297"}


def neighbours(catalog: Catalog, ids: list[str], width: int, exclude: tuple[str, ...] = (),
               **filters: object) -> dict[str, tuple[list[str], ...]]:
    mask = catalog.allowed(RecallFilters(owner=OWNER, **filters), exclude)  # type: ignore[arg-type]
    return {i: (n.before, n.after) for i, n in catalog.neighbours(ids, mask, width).items()}


def test_neighbours_are_the_allowed_versions_next_to_one_in_its_namespace_by_seq() -> None:
    catalog = Catalog()
    catalog.apply(rows(("a", 1, "chat", None, None), ("x", 2, "other", None, None),
                       ("b", 3, "chat", "k", None), ("c", 4, "chat", None, None)))
    catalog.apply(rows(("b2", 5, "chat", "k", None), ("d", 6, "chat", None, None),
                       ("e", 7, "chat", None, None)))
    # x lives in another namespace; b was superseded by b2; e is hidden
    assert neighbours(catalog, ["c", "a", "x"], 2, exclude=("e",)) == {
        "c": (["a"], ["b2", "d"]), "a": ([], ["c", "b2"]), "x": ([], [])}
    assert neighbours(catalog, ["d"], 1, namespace="chat") == {"d": (["b2"], ["e"])}
    assert neighbours(catalog, ["d"], 0) == {}
    assert neighbours(catalog, ["unknown"], 1) == {}


def test_neighbours_follow_seq_order_after_removals() -> None:
    catalog = Catalog(dim=2)
    catalog.apply(rows(("a", 1, "n", None, None), ("b", 2, "n", None, None),
                       ("c", 3, "n", None, None)))
    catalog.apply(rows(("late", 0, "n", None, None), high=3))  # reported out of seq order
    assert neighbours(catalog, ["a"], 1) == {"a": (["late"], ["b"])}
    catalog.remove(["b"])
    assert neighbours(catalog, ["a", "c"], 1) == {"a": (["late"], ["c"]), "c": (["a"], [])}


def test_cosine_is_smoothed_along_each_namespaces_turns_and_speakers_are_named() -> None:
    catalog = Catalog(dim=2)
    catalog.apply(rows(*[(f"t{i}", i, "chat", None, None) for i in range(5)],
                       ("fact", 5, "chat", None, None), ("x", 6, "other", None, None)))
    catalog.set_vectors([*(f"t{i}" for i in range(5)), "fact", "x"], np.eye(2, dtype=np.float32)[
        [0, 1, 1, 1, 1, 0, 0]])
    catalog.set_turns({"t0": Turn("ann", 0.0), "t1": Turn("bo", 0.0), "t2": Turn("ann", 0.0),
                       "t3": Turn("bo", 0.0), "t4": Turn("ann", 0.0), "fact": None,
                       "x": Turn("ann", 0.0)})
    scores = catalog.similarities(np.array([1, 0], np.float32))  # t0, fact and x score 1
    mask = catalog.allowed(RecallFilters(owner=OWNER))
    smoothed = catalog.smoothed(scores, mask, context.smooth)
    by_id = dict(zip(catalog.ids, smoothed.tolist(), strict=True))
    # t1 and t2 gain from t0 one and two places away; x has no neighbours; fact is no turn
    assert by_id == pytest.approx({"t0": 1.0, "t1": 0.5, "t2": 0.35, "t3": 0.0, "t4": 0.0,
                                   "fact": -np.inf, "x": 1.0})
    assert catalog.best(smoothed, mask & catalog.named("What did Bo say?"), 10) == ["t1", "t3"]
    catalog.remove(["t1", "t3"])  # Bo's last turns: the name leaves the catalog
    assert not catalog.named("What did Bo say?").any()
    assert catalog.best(catalog.smoothed(catalog.similarities(np.array([1, 0], np.float32)),
                                         catalog.allowed(RecallFilters(owner=OWNER)),
                                         context.smooth),
                        catalog.turns(), 2) == ["t0", "x"]


def test_a_turns_prior_is_kept_beside_its_speaker_and_a_memory_that_is_no_turn_has_none() -> None:
    catalog = Catalog(dim=2)
    catalog.apply(rows(("t0", 1, "chat", None, None), ("t1", 2, "chat", None, None),
                       ("fact", 3, "chat", None, None)))
    catalog.set_turns({"t0": Turn("ann", 0.1), "t1": Turn("bo", 0.4), "fact": None})
    assert dict(zip(catalog.ids, catalog.priors().tolist(), strict=True)) == pytest.approx(
        {"t0": 0.1, "t1": 0.4, "fact": 0.0})
    catalog.remove(["t0"])
    assert dict(zip(catalog.ids, catalog.priors().tolist(), strict=True)) == pytest.approx(
        {"t1": 0.4, "fact": 0.0})
