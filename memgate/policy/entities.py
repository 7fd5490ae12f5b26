"""Entity matching for recall's third ranking list: does a query name an entity?"""

from __future__ import annotations

import re
import unicodedata


def fold(text: str) -> str:
    """Case- and width-insensitive form for entity matching (NFKC folds full-width forms)."""
    return unicodedata.normalize("NFKC", text).casefold()


def names_in(query: str, names: tuple[str, ...]) -> bool:
    """Whether the query mentions any of an entity's names: as a whole word in spaced
    scripts, as a substring in unspaced ones (Japanese, Chinese)."""
    folded = fold(query)
    for name in map(fold, names):
        if name.isascii():
            if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", folded):
                return True
        elif name in folded:
            return True
    return False
