"""The embedding model as its users see it: texts in, L2-normalised float32 rows out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np


class Embedder(Protocol):
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """One row per text, shape (len(texts), dim); blocking (run it off the event loop)."""
        ...


# Loading takes a third of a second and ~300 MB: actors call this in `start`, on their thread.
LoadEmbedder = Callable[[], Embedder]
