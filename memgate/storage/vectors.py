"""Memory vectors of one partition: a DuckDB file of float32 BLOBs.

Vectors are normalised at write time, so cosine similarity is one matrix-vector product. The file
is read per owner when the embedder loads that owner's `Catalog`, whose rows then hold the
owner's vectors as one contiguous matrix; nothing else is kept in memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from memgate.storage import compaction
from memgate.storage.transaction import transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    memory_id VARCHAR NOT NULL, tenant VARCHAR NOT NULL, subject_id VARCHAR NOT NULL,
    vec BLOB NOT NULL
);
"""


class VectorStore(compaction.Rewritable):
    """Synchronous DuckDB access; the embedder serialises calls onto one thread."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._db = compaction.open_owned(path, _SCHEMA)
        # Vectors deleted since the file was last rewritten (read by the embedder's loop).
        self.deletions_pending = False


    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def owner(self, tenant: str, subject_id: str) -> tuple[list[str], np.ndarray | None]:
        """Every vector the owner has: the ids, and the vectors as rows (None: none)."""
        rows = self._db.execute("SELECT memory_id, vec FROM vectors "
                                "WHERE tenant = ? AND subject_id = ?", [tenant, subject_id]
                                ).fetchall()
        if not rows:
            return [], None
        return ([r[0] for r in rows],
                np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows]))

    def put(self, memory_ids: list[str], owners: list[tuple[str, str]],
            matrix: np.ndarray) -> None:
        """Store vectors (row i is `memory_ids[i]`'s, owned by `owners[i]`, a (tenant, subject)
        pair), in one transaction. The caller stores only the vectors it lacks (the embedder's
        catalog knows which the file holds): no id is looked up first (a scan of the column)."""
        if not memory_ids:
            return
        tenants, subject_ids = zip(*owners, strict=True)
        self._db.execute("INSERT INTO vectors SELECT unnest(?), unnest(?), unnest(?), unnest(?)",
                         [memory_ids, list(tenants), list(subject_ids),
                          [vector.tobytes() for vector in matrix]])

    def delete(self, ids: list[str]) -> int:
        """How many of these there were."""
        db = self._db
        with transaction(db):
            deleted = len({row[0] for row in db.execute(
                "DELETE FROM vectors WHERE list_contains(?, memory_id) RETURNING memory_id",
                [ids]).fetchall()})
            if deleted:
                compaction.mark(db)
        if deleted:
            self.deletions_pending = True
        return deleted
