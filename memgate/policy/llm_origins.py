"""Where a space's LLM may be (SPEC §4.1; #28 finding 8): the operator's allowlist of origins,
and the `llmBaseUrl` a member may name. Pure: no I/O.

The allowlist is empty by default: no space can name an LLM until the operator opts in
(`MEMGATE_SPACES_LLM_ORIGINS`). Each entry is exactly `scheme://host[:port]`, optionally with a
path prefix (`http://127.0.0.1:11434`, `https://llm.internal/openai`); a missing port is the
scheme's own (80, 443), never "any port". A base URL must be of an entry's origin, under its
path prefix, and carry nothing else: no userinfo, no query, no fragment, no `.` or `..`
segment, no escapes. memgate then posts to `{base}/chat/completions` and nowhere else. The
check runs when a space is created and again before every call, so a space created before the
operator removed an entry stops calling it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_PATH = re.compile(r"^(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$")  # no `.`/`..`, no escapes
_HOST = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}"
                   r"[a-z0-9])?$|^\[[0-9a-f:.]+\]$")
_FORBIDDEN = re.compile(r"[@?#\\\s%]")  # userinfo, query, fragment, backslash, blanks, escapes


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int
    path: str  # a path prefix without its trailing "/" ("" for none)


def _parse(url: str) -> Origin | None:
    if len(url) > 2000 or _FORBIDDEN.search(url) or not url.isascii():
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = parts.netloc.rsplit(":", 1)[0] if port is not None else parts.netloc
    host = host.lower()
    if scheme not in _DEFAULT_PORTS or not _HOST.match(host) or not _PATH.match(parts.path):
        return None
    if parts.netloc.endswith(":"):  # an empty port
        return None
    return Origin(scheme, host, port if port is not None else _DEFAULT_PORTS[scheme],
                  parts.path.rstrip("/"))


def origin(entry: str) -> Origin:
    """An allowlist entry, parsed; `ValueError` if it is not `scheme://host[:port][/path]`."""
    parsed = _parse(entry.strip())
    if parsed is None:
        raise ValueError("an LLM origin is scheme://host[:port] with at most a path prefix "
                         "(no userinfo, query or fragment)")
    return parsed


def allowed(base_url: str, origins: Iterable[Origin]) -> bool:
    """May memgate post to `{base_url}/chat/completions`?"""
    parsed = _parse(base_url)
    if parsed is None:
        return False
    return any(parsed[:3] == entry[:3]
               and (parsed.path == entry.path or parsed.path.startswith(entry.path + "/"))
               for entry in origins)


def well_formed(base_url: str) -> bool:
    """Is it a base URL at all (whatever the allowlist)?"""
    return _parse(base_url) is not None


__all__ = ["Origin", "allowed", "origin", "well_formed"]
