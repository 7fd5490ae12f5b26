"""BM25 as Tantivy scores it, for documents added and not yet committed (`text_index`).

A search that finds a waiting document would have to commit it first (~5-9 ms of CPU, see
`text_index`). Instead, the committed index is searched and the waiting documents that match are
scored here, by Tantivy's formula with the committed index's statistics, and placed among its
hits: the answer a commit would give, but for the statistics (number of documents, average
length), which leave the few waiting documents out. `tests/test_text_index.py` checks these
scores against Tantivy's own for committed documents.

Tantivy's BM25 (`query/bm25.rs`): per matched term, idf · (k1 + 1) · tf / (tf + k1 · (1 - b + b ·
dl / avgdl)), idf = ln(1 + (N - n + 0.5) / (n + 0.5)), k1 = 1.2, b = 0.75, dl the field's length
as stored in one byte (`fieldnorm/code.rs`); a boolean query adds up its matched clauses.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any, NamedTuple

import tantivy

K1 = 1.2
B = 0.75


def _decoded(code: int) -> int:
    """The length a field-norm byte stands for: itself below 24, then 3 bits of mantissa."""
    if code < 24:
        return code
    bits, shift = (code - 24) & 7, (code - 24) >> 3
    return 24 + (bits if shift == 0 else (bits | 8) << (shift - 1))


NORMS = [_decoded(code) for code in range(256)]


def fieldnorm(length: int) -> int:
    """The length a field is scored by: exact up to 40 tokens, rounded down beyond."""
    return NORMS[bisect_right(NORMS, length) - 1]


class FieldStats(NamedTuple):
    docs: float  # N
    average: float  # avgdl of the field


def _values(node: dict[str, Any], found: dict[str, float]) -> None:
    description = node.get("description", "")
    for name in ("N", "avgdl"):
        if description.startswith(f"{name},"):
            found[name] = float(node["value"])
    for child in node.get("details", []):
        _values(child, found)


def field_stats(searcher: tantivy.Searcher, schema: tantivy.Schema, field: str,
                terms: Iterable[str]) -> FieldStats | None:
    """N and `field`'s average length as Tantivy scores by, read from its explanation of a
    committed document holding one of `terms`; None when none does."""
    for term in terms:
        if searcher.doc_freq(field, term) == 0:
            continue
        query = tantivy.Query.term_query(schema, field, term)
        hits = searcher.search(query, limit=1).hits
        if hits:
            found: dict[str, float] = {}
            _values(json.loads(query.explain(searcher, hits[0][1]).to_json()), found)
            if found.keys() == {"N", "avgdl"}:
                return FieldStats(found["N"], found["avgdl"])
    return None


def term_score(tf: int, length: int, doc_freq: int, stats: FieldStats) -> float:
    """One matched term's score in a document whose field holds `length` tokens."""
    idf = math.log(1 + (stats.docs - doc_freq + 0.5) / (doc_freq + 0.5))
    norm = K1 * (1 - B + B * fieldnorm(length) / stats.average)
    return idf * (K1 + 1) * tf / (tf + norm)
