"""Memory vectors of one partition: a DuckDB file (BLOBs of float32) mirrored in memory.

Vectors are normalised at write time, so cosine similarity is one matrix-vector product; the
embedder copies each owner's into the rows of its `Catalog` (one contiguous matrix per owner).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np

_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    memory_id VARCHAR NOT NULL, tenant VARCHAR NOT NULL, subject_id VARCHAR NOT NULL,
    vec BLOB NOT NULL
);
"""


class VectorStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = duckdb.connect(str(path))
        self._db.execute(_SCHEMA)
        self._vectors: dict[str, np.ndarray] = {
            memory_id: np.frombuffer(blob, dtype=np.float32)
            for memory_id, blob in self._db.execute("SELECT memory_id, vec FROM vectors").fetchall()
        }

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def __contains__(self, memory_id: str) -> bool:
        return memory_id in self._vectors

    def __len__(self) -> int:
        return len(self._vectors)

    def put(self, tenant: str, subject_id: str, ids: list[str], matrix: np.ndarray) -> None:
        fresh = [(i, v) for i, v in zip(ids, matrix, strict=True) if i not in self._vectors]
        if not fresh:
            return
        self._db.executemany("INSERT INTO vectors VALUES (?, ?, ?, ?)",
                             [(i, tenant, subject_id, v.tobytes()) for i, v in fresh])
        self._vectors.update(fresh)

    def delete(self, ids: list[str]) -> None:
        self._db.execute("DELETE FROM vectors WHERE list_contains(?, memory_id)", [ids])
        for memory_id in ids:
            self._vectors.pop(memory_id, None)

    def known(self, ids: list[str]) -> tuple[list[str], np.ndarray | None]:
        """Those of `ids` that have a vector, and their vectors as rows (None: none have)."""
        found = [i for i in ids if i in self._vectors]
        if not found:
            return [], None
        return found, np.stack([self._vectors[i] for i in found])
