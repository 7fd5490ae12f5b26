"""Per-owner Tantivy indexes of masked memory text, for BM25 ranking (SPEC §3.5, §5.4).

Why per owner: Tantivy deletes are logical (the term stays in the segment until a merge, which
the Python bindings cannot force). A deletion therefore rebuilds the owner's small index into a
new generation directory and removes the old one, so forgotten words leave the disk.

Why two text fields: `text` holds the non-CJK part under Tantivy's English stemmer; `cjk` holds
character unigrams and bigrams of each CJK run (made here, so every process tokenises alike and
no custom tokenizer must be registered). Nothing but the memory id is stored.

Why two context fields: `ctx` and `ctx_cjk` hold a conversation turn's context document (its own
text and its neighbours', `policy/context.py`), tokenised as `text` and `cjk`; empty for any
memory that is not a turn (`turn` 0; a turn's is 1). They are searched by the context channel
only (`rank_context`); `rank` may leave the turns out (the conversation channels rank them).
`FORMAT` names the schema in each generation's READY file: a generation of another format
(made before a schema change) is not opened but removed, and the indexer's catch-up re-adds
every version from storage.

Why added documents wait, and searches do not commit them: a Tantivy commit costs ~5 ms of CPU
whatever it holds (it ends the writer's segment: its indexing thread is joined and a new one
started, with a fresh 4 MB term table; ~9 ms with opening and closing the writer), and an owner
who remembers and recalls in turn would pay one per remember. Added documents are therefore kept
here, with their tokens, and written in one writer session (open, add, commit, close: no writer
stays open between commits) `COMMIT_EVERY_S` after the first of them, or at once past
`PENDING_AT_MOST`. A search meanwhile searches the committed index and scores the waiting
documents that match as Tantivy would (`bm25`: the same formula and field lengths, the committed
index's statistics), so a memory is found by its words as soon as it is added. Only when that
cannot be done (a query word Tantivy searches as a phrase, a field of which no committed
document holds a query term) does a search commit first. Tokens are Tantivy's own (`EN_STEM`
is its `en_stem`; tests check both the tokens and the scores). Documents a crash loses are
harmless: a restarted indexer loads each owner's catalog before it ranks for it, and indexes
every version the index lacks.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, TypeVar

import tantivy

from memgate.storage.bm25 import FieldStats, field_stats, term_score

R = TypeVar("R")

CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
QUERY_SYNTAX = re.compile(r"[+\-:()\[\]{}\"'^~*?\\/!<>=&|]")
READY = "READY"
FORMAT = "memgate-text-index 3 (text, cjk, ctx, ctx_cjk, turn)"  # written into READY
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
# An owner's added documents are committed this long after the first of them at the latest,
# and at once when this many wait (a catch-up of many versions).
COMMIT_EVERY_S = 5.0
PENDING_AT_MOST = 256
WRITER_HEAP = 15_000_000  # Tantivy's minimum for one indexing thread
# Tantivy's `en_stem` (the `text` and `ctx` fields): which terms a text holds. The CJK fields
# are tokenised on whitespace, their n-grams as made here.
EN_STEM = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
           .filter(tantivy.Filter.remove_long(40)).filter(tantivy.Filter.lowercase())
           .filter(tantivy.Filter.stemmer("english")).build())


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


class Waiting(NamedTuple):
    """A document added and not committed, with each text field's token counts (to score it)."""

    document: tantivy.Document
    counts: dict[str, Counter[str]]
    turn: bool


@dataclass(frozen=True)
class Match:
    """What a search looks for: its query, and the clauses `bm25` needs to score a waiting
    document alike: the words (each one's tokens; one at least `at_least` of them must match)
    in `fields[0]`, and the CJK n-grams (any one) in `fields[1]`."""

    query: tantivy.Query | None
    fields: tuple[str, str]
    words: list[list[str]] = field(default_factory=list)
    at_least: int = 1
    grams: list[str] = field(default_factory=list)


def _format(generation: Path) -> str:
    """The format a generation directory was made in ("" when it is not complete)."""
    try:
        return (generation / READY).read_text()
    except FileNotFoundError:
        return ""


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("memory_id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("text", stored=False, tokenizer_name="en_stem", index_option="freq")
    builder.add_text_field("cjk", stored=False, tokenizer_name="whitespace", index_option="freq")
    builder.add_text_field("ctx", stored=False, tokenizer_name="en_stem", index_option="freq")
    builder.add_text_field("ctx_cjk", stored=False, tokenizer_name="whitespace",
                           index_option="freq")
    builder.add_unsigned_field("turn", stored=False, indexed=True)
    return builder.build()


SCHEMA = _schema()


class OwnerIndex:
    """One owner's index: generation directories `gen-N`, the newest complete one is live.

    Documents added wait here until `commit` writes them (searches score them meanwhile);
    `close` commits."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        generations = sorted(int(p.name[4:]) for p in root.glob("gen-*"))
        current = [g for g in generations if _format(self._path(g)) == FORMAT]
        # none of this format: a fresh generation, so that no older one is opened as this one
        self.generation = current[-1] if current else (generations[-1] + 1 if generations else 0)
        for path in root.glob("gen-*"):
            if path.name != f"gen-{self.generation}":
                shutil.rmtree(path)
        self._index = self._open(self.generation)
        self._waiting: dict[str, Waiting] = {}  # added, not yet written, by id
        self.added_at = 0.0  # time.monotonic() when the first waiting document was added
        self.ids = self._stored_ids()

    def _path(self, generation: int) -> Path:
        return self.root / f"gen-{generation}"

    def _open(self, generation: int) -> tantivy.Index:
        path = self._path(generation)
        path.mkdir(exist_ok=True)
        index = tantivy.Index(SCHEMA, path=str(path), reuse=True)
        (path / READY).write_text(FORMAT)
        return index

    def _stored_ids(self) -> set[str]:
        searcher = self._searcher()
        if searcher.num_docs == 0:
            return set()
        hits = searcher.search(tantivy.Query.all_query(), limit=searcher.num_docs).hits
        return {searcher.doc(address)["memory_id"][0] for _, address in hits}

    @property
    def pending(self) -> bool:
        """Whether added documents wait for a commit."""
        return bool(self._waiting)

    def add(self, items: list[tuple[str, str]],
            contexts: Mapping[str, str] | None = None) -> None:
        """Add (or replace: idempotent) documents, with the context document of those that
        `contexts` names (conversation turns); searchable once committed."""
        if not items:
            return
        if not self._waiting:
            self.added_at = time.monotonic()
        contexts = contexts or {}
        for memory_id, text in items:
            words, grams = split_text(text)
            ctx_words, ctx_grams = split_text(contexts.get(memory_id, ""))
            document = tantivy.Document(memory_id=memory_id, text=words, cjk=grams,
                                        ctx=ctx_words, ctx_cjk=ctx_grams)
            document.add_unsigned("turn", int(memory_id in contexts))
            counts = {"text": Counter(EN_STEM.analyze(words)), "cjk": Counter(grams.split()),
                      "ctx": Counter(EN_STEM.analyze(ctx_words)),
                      "ctx_cjk": Counter(ctx_grams.split())}
            self._waiting[memory_id] = Waiting(document, counts, memory_id in contexts)
            self.ids.add(memory_id)
        if len(self._waiting) >= PENDING_AT_MOST:
            self.commit()

    def commit(self) -> None:
        """Write the waiting documents in one writer session: searchable (and durable) now."""
        if not self._waiting:
            return
        writer = self._index.writer(heap_size=WRITER_HEAP, num_threads=1)
        try:
            for memory_id, waiting in self._waiting.items():
                writer.delete_documents_by_term("memory_id", memory_id)
                writer.add_document(waiting.document)
            writer.commit()
        except BaseException:
            writer.rollback()
            raise
        finally:
            writer.wait_merging_threads()  # joins its threads and frees the directory lock
        self._index.reload()
        self._discard()

    def _discard(self) -> None:
        self._waiting = {}

    def close(self) -> None:
        self.commit()

    def rebuild(self, items: list[tuple[str, str]],
                contexts: Mapping[str, str] | None = None) -> None:
        """Replace the index by one holding exactly `items` (with `contexts`, as `add`); the old
        generation leaves the disk. Documents added and not committed are discarded (they are
        in `items` unless deleted)."""
        self._discard()
        old = self.generation
        self.generation += 1
        shutil.rmtree(self._path(self.generation), ignore_errors=True)
        path = self._path(self.generation)
        path.mkdir()
        self._index = tantivy.Index(SCHEMA, path=str(path))
        self.ids = set()
        self.add(items, contexts)
        self.commit()
        (path / READY).write_text(FORMAT)
        shutil.rmtree(self._path(old))

    def _searcher(self) -> tantivy.Searcher:
        """A searcher of every document added so far (committed first)."""
        self.commit()
        return self._index.searcher()

    def _matching(self, query: str, *, context: bool = False) -> Match:
        """Documents that share at least half of the query's distinct content words (stopwords
        out) or, for CJK queries, any of its character n-grams (lone hiragana out); no query
        when it has no content. One shared common word out of many is noise that would
        otherwise outvote the cosine ranking in the fusion. With `context`, the context fields,
        and any one content word matches: a turn's context is long, and its score ranks it
        (`rank_context` cuts it)."""
        fields = ("ctx", "ctx_cjk") if context else ("text", "cjk")
        words, grams = split_text(QUERY_SYNTAX.sub(" ", query))
        content = list(dict.fromkeys(w for w in re.findall(r"\w+", words) if w not in STOPWORDS))
        kept = [g for g in dict.fromkeys(grams.split()) if not HIRAGANA.match(g)]
        at_least = 1 if context else (len(content) + 1) // 2
        should = tantivy.Occur.Should
        parts = []
        if content:
            parts.append((should, tantivy.Query.boolean_query(
                [(should, self._index.parse_query_lenient(w, [fields[0]])[0]) for w in content],
                minimum_number_should_match=at_least)))
        if kept:
            parts.append((should, tantivy.Query.boolean_query(
                [(should, tantivy.Query.term_query(SCHEMA, fields[1], g)) for g in kept])))
        return Match(tantivy.Query.boolean_query(parts) if parts else None, fields,
                     [EN_STEM.analyze(w) for w in content], at_least, kept)

    def rank(self, query: str, allowed: Collection[str] | None = None,
             depth: int | None = None, *, blocked: Collection[str] = (),
             turns: bool = True) -> list[str]:
        """BM25 order of the documents that match `query` (best first, `depth` at most; see
        `_matching`): only the `allowed` ones if given, never the `blocked` ones, nor the
        conversation turns unless `turns`.

        Allowed ids restrict the search with a zero-scored term-set filter (pure BM25). Without
        them the whole index is searched and the blocked ids are skipped: cheaper when few
        documents are blocked (superseded versions, other namespaces).
        """
        match = self._matching(query)
        if match.query is not None and not turns:
            match = replace(match, query=tantivy.Query.boolean_query([
                (tantivy.Occur.Must, match.query),
                (tantivy.Occur.MustNot, tantivy.Query.term_query(SCHEMA, "turn", 1))]))
        hits = self._search(match, allowed, depth, blocked, turns=turns)
        return [memory_id for _, memory_id in hits]

    def rank_context(self, query: str, allowed: Collection[str] | None = None,
                     depth: int | None = None, *, blocked: Collection[str] = (),
                     ) -> list[tuple[str, float]]:
        """(id, BM25 score) of the turns whose context documents match `query` (any content
        word), best first; filtered as `rank`."""
        hits = self._search(self._matching(query, context=True), allowed, depth, blocked)
        return [(memory_id, score) for score, memory_id in hits]

    def _search(self, match: Match, allowed: Collection[str] | None, depth: int | None,
                blocked: Collection[str], *, turns: bool = True) -> list[tuple[float, str]]:
        """(score, id) of the best `depth` documents `match` finds among the allowed ones; a
        waiting document it may find is scored as Tantivy would (`bm25`), or committed first
        when that cannot be done."""
        matching = match.query
        restricted = allowed is not None and not blocked
        if restricted:
            assert allowed is not None
            depth = len(allowed) if depth is None else depth
            if matching is None or not allowed or depth <= 0:
                return []
            restrict = tantivy.Query.const_score_query(
                tantivy.Query.term_set_query(SCHEMA, "memory_id", list(allowed)), 0.0)
            matching = tantivy.Query.boolean_query([(tantivy.Occur.Must, matching),
                                                    (tantivy.Occur.Must, restrict)])
            blocked = ()
        searcher = self._index.searcher()
        scored = self._score_waiting(searcher, match, allowed if restricted else None, blocked,
                                     turns)
        if scored is None:  # not to be scored here: committed first
            self.commit()
            searcher, scored = self._index.searcher(), []
        depth = searcher.num_docs + len(scored) if depth is None else depth
        if matching is None or depth <= 0:
            return []
        hits = searcher.search(matching, limit=depth + len(blocked) + len(self._waiting)).hits
        found = ((score, searcher.doc(address)["memory_id"][0]) for score, address in hits)
        committed = [(score, memory_id) for score, memory_id in found
                     if memory_id not in blocked and memory_id not in self._waiting]
        merged = sorted(committed + scored, key=lambda hit: -hit[0])  # stable: ties keep order
        return merged[:depth]

    def _score_waiting(self, searcher: tantivy.Searcher, match: Match,
                       allowed: Collection[str] | None, blocked: Collection[str], turns: bool,
                       ) -> list[tuple[float, str]] | None:
        """(score, id) of the waiting documents `match` finds, scored with the statistics of
        `searcher` (the committed index); None when one may match and that cannot be done as
        Tantivy would: a word that is a phrase (several tokens), or a field of which no
        committed document holds a query term."""
        parts = [(match.fields[0], [w[0] for w in match.words if w], match.at_least),
                 (match.fields[1], match.grams, 1)]
        candidates = [(memory_id, waiting) for memory_id, waiting in self._waiting.items()
                      if any(term in waiting.counts[name] for name, clauses, _ in parts
                             for term in clauses)]
        if not candidates:
            return []
        if any(len(word) > 1 for word in match.words):
            return None
        stats: dict[str, FieldStats | None] = {}
        doc_freqs: dict[tuple[str, str], int] = {}
        scored = []
        for memory_id, waiting in candidates:
            if ((allowed is not None and memory_id not in allowed) or memory_id in blocked
                    or (waiting.turn and not turns)):
                continue
            score, matched = 0.0, False
            for name, clauses, at_least in parts:
                counts = waiting.counts[name]
                held = [term for term in clauses if term in counts]
                if not held or len(held) < at_least:
                    continue
                if name not in stats:
                    stats[name] = field_stats(searcher, SCHEMA, name, clauses)
                field_stat = stats[name]
                if field_stat is None:
                    return None
                for term in held:
                    if (name, term) not in doc_freqs:
                        doc_freqs[name, term] = searcher.doc_freq(name, term)
                    score += term_score(counts[term], counts.total(), doc_freqs[name, term],
                                        field_stat)
                matched = True
            if matched:
                scored.append((score, memory_id))
        return scored

    def terms_with_prefix(self, field: str, prefix: str) -> list[str]:
        """The indexed terms of `field` that start with `prefix` (without their frequencies)."""
        pairs: list[tuple[str, int]] = self._searcher().terms_with_prefix(field, prefix)
        return [term for term, _ in pairs]


class TextIndexes:
    """The owner indexes of one partition, opened on demand and kept in a small LRU.

    Thread-safe for owners used on different threads (`use`): each index has a lock, held by
    whoever uses it, so that an index is never committed or evicted while another thread adds
    to it or searches it. One owner's work must stay on one thread (in order)."""

    def __init__(self, root: Path, *, open_limit: int = 256) -> None:
        self._root = root
        self._open: OrderedDict[str, OwnerIndex] = OrderedDict()  # least recent first
        self._locks: dict[str, threading.Lock] = {}  # per open index: held while in use
        self._limit = open_limit
        self._lock = threading.Lock()  # never two OwnerIndex objects (two writers) for one owner

    def owner(self, tenant: str, subject_id: str) -> OwnerIndex:
        """The owner's index, opened if need be (not held: for one thread's use)."""
        return self._get(f"{tenant}__{subject_id}")[0]

    def use(self, tenant: str, subject_id: str, work: Callable[[OwnerIndex], R]) -> R:
        """`work(index)` on the owner's index, holding it meanwhile."""
        name = f"{tenant}__{subject_id}"
        while True:
            index, lock = self._get(name)
            with lock:
                if self._open.get(name) is index:  # not evicted in between
                    return work(index)

    def _get(self, name: str) -> tuple[OwnerIndex, threading.Lock]:
        """The index (opened if need be, now the most recent) and its lock; the least recent
        ones beyond the limit are closed (their waiting documents committed)."""
        with self._lock:
            index = self._open.get(name)
            if index is None:
                index = self._open[name] = OwnerIndex(self._root / name)
                self._locks[name] = threading.Lock()
            self._open.move_to_end(name)
            for old in list(self._open)[: max(len(self._open) - self._limit, 0)]:
                lock = self._locks[old]
                if lock.acquire(blocking=False):  # one in use stays open for now
                    try:
                        self._open.pop(old).close()
                        del self._locks[old]
                    finally:
                        lock.release()
            return index, self._locks[name]

    def commit_due(self) -> float | None:
        """Commit the indexes whose first waiting document is `COMMIT_EVERY_S` old; the seconds
        until the next one is due (None: nothing left to commit). An index in use is left to
        its user and tried again a little later."""
        with self._lock:
            pending = [(index, self._locks[name]) for name, index in self._open.items()
                       if index.pending]
        now = time.monotonic()
        wait = None
        for index, lock in pending:
            due = index.added_at + COMMIT_EVERY_S - now
            if due <= 0:
                if lock.acquire(blocking=False):
                    try:
                        index.commit()
                    finally:
                        lock.release()
                    continue
                due = COMMIT_EVERY_S / 10
            wait = due if wait is None else min(wait, due)
        return wait

    def close(self) -> None:
        """Commit every index."""
        with self._lock:
            for name, index in self._open.items():
                with self._locks[name]:
                    index.close()
