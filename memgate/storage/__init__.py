"""DuckDB, Tantivy and vector files behind small classes. Only actors import this package."""

from memgate.storage.catalog import Catalog
from memgate.storage.directory import DirectoryStore, hash_token
from memgate.storage.memories import MemoryStore
from memgate.storage.memory_rows import (
    Filters, LimitReachedError, Limits, Remember, Row, Stored, decode_cursor, encode_cursor,
)

__all__ = ["Catalog", "DirectoryStore", "Filters", "LimitReachedError", "Limits", "MemoryStore",
           "Remember", "Row", "Stored", "decode_cursor", "encode_cursor", "hash_token"]
