"""Per-owner Tantivy indexes of masked memory text, for BM25 ranking (SPEC §3.5, §5.4).

Why per owner: Tantivy deletes are logical (the term stays in the segment until a merge, which
the Python bindings cannot force). A deletion therefore rebuilds the owner's small index into a
new generation directory and removes the old one, so forgotten words leave the disk.

Why two text fields: `text` holds the non-CJK part under Tantivy's English stemmer; `cjk` holds
character unigrams and bigrams of each CJK run (made here, so every process tokenises alike and
no custom tokenizer must be registered). Nothing but the memory id is stored.
"""

from __future__ import annotations

import re
import shutil
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Collection, Iterable
from pathlib import Path

import tantivy

CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
QUERY_SYNTAX = re.compile(r"[+\-:()\[\]{}\"'^~*?\\/!<>=&|]")
READY = "READY"
# Words that say nothing about which memory is meant; dropped from queries (not from documents)
# so that BM25 lists only memories sharing content words with the query.
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has
have having he her here hers herself him himself his how i if in into is it its itself just me
more most my myself no nor not now of off on once only or other our ours ourselves out over own
same she should so some such than that the their theirs them themselves then there these they
this those through to too under until up very was we were what when where which while who whom
why will with would you your yours yourself yourselves usually ever also s t
""".split())
# Hiragana on its own is grammar (particles such as の, は, を), not content.
HIRAGANA = re.compile(r"^[\u3040-\u309f]$")


def normalise(text: str) -> str:
    """Width- and case-insensitive: NFKC folds full-width Latin and half-width katakana."""
    return unicodedata.normalize("NFKC", text).lower()


def cjk_grams(text: str) -> list[str]:
    grams: list[str] = []
    for run in CJK.findall(text):
        grams.extend(run)
        grams.extend(run[i : i + 2] for i in range(len(run) - 1))
    return grams


def split_text(text: str) -> tuple[str, str]:
    """(the non-CJK words, the CJK n-grams as space-separated tokens)."""
    folded = normalise(text)
    return CJK.sub(" ", folded), " ".join(cjk_grams(folded))


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("memory_id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("text", stored=False, tokenizer_name="en_stem", index_option="freq")
    builder.add_text_field("cjk", stored=False, tokenizer_name="whitespace", index_option="freq")
    return builder.build()


SCHEMA = _schema()


class OwnerIndex:
    """One owner's index: generation directories `gen-N`, the newest complete one is live."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        generations = sorted((int(p.name[4:]), p) for p in root.glob("gen-*")
                             if (p / READY).exists())
        self.generation = generations[-1][0] if generations else 0
        for path in root.glob("gen-*"):
            if path.name != f"gen-{self.generation}":
                shutil.rmtree(path)
        self._index = self._open(self.generation)
        self.ids = self._stored_ids()

    def _path(self, generation: int) -> Path:
        return self.root / f"gen-{generation}"

    def _open(self, generation: int) -> tantivy.Index:
        path = self._path(generation)
        path.mkdir(exist_ok=True)
        index = tantivy.Index(SCHEMA, path=str(path), reuse=True)
        (path / READY).touch()
        return index

    def _stored_ids(self) -> set[str]:
        self._index.reload()
        searcher = self._index.searcher()
        if searcher.num_docs == 0:
            return set()
        hits = searcher.search(tantivy.Query.all_query(), limit=searcher.num_docs).hits
        return {searcher.doc(address)["memory_id"][0] for _, address in hits}

    @staticmethod
    def _write(index: tantivy.Index, items: Iterable[tuple[str, str]]) -> set[str]:
        writer = index.writer(heap_size=15_000_000, num_threads=1)
        added = set()
        for memory_id, text in items:
            words, grams = split_text(text)
            writer.delete_documents_by_term("memory_id", memory_id)  # idempotent re-adds
            writer.add_document(tantivy.Document(memory_id=memory_id, text=words, cjk=grams))
            added.add(memory_id)
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        return added

    def add(self, items: list[tuple[str, str]]) -> None:
        if items:
            self.ids |= self._write(self._index, items)

    def rebuild(self, items: list[tuple[str, str]]) -> None:
        """Replace the index by one holding exactly `items`; the old generation leaves the disk."""
        old = self.generation
        self.generation += 1
        shutil.rmtree(self._path(self.generation), ignore_errors=True)
        path = self._path(self.generation)
        path.mkdir()
        index = tantivy.Index(SCHEMA, path=str(path))
        ids = self._write(index, items)
        (path / READY).touch()
        self._index, self.ids = index, ids
        shutil.rmtree(self._path(old))

    def _matching(self, query: str) -> tantivy.Query | None:
        """Documents that share at least half of the query's distinct content words (or, for
        CJK queries, any of its character n-grams); None when the query has no content.
        One shared common word out of many is noise that would otherwise outvote the cosine
        ranking in the fusion."""
        words, grams = split_text(QUERY_SYNTAX.sub(" ", query))
        content = list(dict.fromkeys(w for w in re.findall(r"\w+", words) if w not in STOPWORDS))
        word_queries = [self._index.parse_query_lenient(w, ["text"])[0] for w in content]
        gram_queries = [tantivy.Query.term_query(SCHEMA, "cjk", g)
                        for g in dict.fromkeys(grams.split()) if not HIRAGANA.match(g)]
        if not (word_queries or gram_queries):
            return None
        should = tantivy.Occur.Should
        parts = []
        if word_queries:  # at least half of the content words
            parts.append((should, tantivy.Query.boolean_query(
                [(should, q) for q in word_queries],
                minimum_number_should_match=(len(word_queries) + 1) // 2)))
        if gram_queries:
            parts.append((should, tantivy.Query.boolean_query([(should, q) for q in gram_queries])))
        return tantivy.Query.boolean_query(parts)

    def rank(self, query: str, allowed: Collection[str] | None = None,
             depth: int | None = None, *, blocked: Collection[str] = ()) -> list[str]:
        """BM25 order of the documents that match `query` (best first, `depth` at most; see
        `_matching`): only the `allowed` ones if given, never the `blocked` ones.

        Allowed ids restrict the search with a zero-scored term-set filter (pure BM25). Without
        them the whole index is searched and the blocked ids are skipped: cheaper when few
        documents are blocked (superseded versions, other namespaces).
        """
        matching = self._matching(query)
        if allowed is not None and not blocked:
            depth = len(allowed) if depth is None else depth
            if matching is None or not allowed or depth <= 0:
                return []
            restrict = tantivy.Query.const_score_query(
                tantivy.Query.term_set_query(SCHEMA, "memory_id", list(allowed)), 0.0)
            matching = tantivy.Query.boolean_query([(tantivy.Occur.Must, matching),
                                                    (tantivy.Occur.Must, restrict)])
            blocked = ()
        searcher = self._index.searcher()
        depth = searcher.num_docs if depth is None else depth
        if matching is None or depth <= 0:
            return []
        hits = searcher.search(matching, limit=depth + len(blocked)).hits
        ranked = (searcher.doc(address)["memory_id"][0] for _, address in hits)
        return [memory_id for memory_id in ranked if memory_id not in blocked][:depth]

    def terms_with_prefix(self, field: str, prefix: str) -> list[str]:
        """The indexed terms of `field` that start with `prefix` (without their frequencies)."""
        pairs: list[tuple[str, int]] = self._index.searcher().terms_with_prefix(field, prefix)
        return [term for term, _ in pairs]


class TextIndexes:
    """The owner indexes of one partition, opened on demand and kept in a small LRU."""

    def __init__(self, root: Path, *, open_limit: int = 256) -> None:
        self._root = root
        self._open: OrderedDict[str, OwnerIndex] = OrderedDict()
        self._limit = open_limit
        self._lock = threading.Lock()  # never two OwnerIndex objects (two writers) for one owner

    def owner(self, tenant: str, subject_id: str) -> OwnerIndex:
        name = f"{tenant}__{subject_id}"
        with self._lock:
            index = self._open.get(name)
            if index is None:
                index = self._open[name] = OwnerIndex(self._root / name)
            self._open.move_to_end(name)
            while len(self._open) > self._limit:
                self._open.popitem(last=False)
            return index
