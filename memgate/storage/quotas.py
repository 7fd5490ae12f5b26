"""Per-member quotas of what a file holds (SPEC §3.9 for spaces, sessions and events): at most
`held` per member and workspace, and at most `per_hour` made by the member in any hour.

A `Usage` is kept by the file's single writer, so the limits hold however many processes serve
the routes. What a member holds is counted from the file on first use, then kept by every write
(`took`) and deletion (`stale`: counted again on next use). What they made in the last hour is
loaded from the file's rows on first use and kept in memory from then on, so deleting what was
made does not give its place in the hour back (a restart forgets only what was deleted before
it). Refusals are the SPEC §3.10 errors: 429 before 409, as for remembers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from memgate.contracts.errors import MemorySpaceFullError, MemorySpaceRateLimitedError
from memgate.observe import metrics

HOUR = timedelta(hours=1)
SWEEP = timedelta(minutes=1)  # how often the windows of members idle for an hour are dropped
Key = tuple[str, str | None]  # (workspace, member); None: rows from before members were kept


@dataclass(frozen=True)
class Quota:
    name: str  # what is counted, as errors name it: spaces, sessions, events
    held: int  # at most this many held per member and workspace
    per_hour: int  # at most this many made per member and workspace in any hour


SPACES = Quota("spaces", held=100, per_hour=20)
SESSIONS = Quota("sessions", held=10_000, per_hour=600)
EVENTS = Quota("events", held=100_000, per_hour=3_600)


class Usage:
    """One quota's use per member. `count(key)` counts what the file holds for a member;
    `made(key, since)` lists (instant, how many) the member made after `since`."""

    def __init__(self, quota: Quota, *, count: Callable[[Key], int],
                 made: Callable[[Key, datetime], Iterable[tuple[datetime, int]]]) -> None:
        self.quota = quota
        self._count, self._made = count, made
        self._held: dict[Key, int] = {}
        self._windows: dict[Key, deque[tuple[datetime, int]]] = {}
        self._swept: datetime | None = None

    def _window(self, key: Key, now: datetime) -> deque[tuple[datetime, int]]:
        hour_ago = now - HOUR
        if self._swept is None or now - self._swept > SWEEP:  # members idle for an hour
            self._windows = {k: w for k, w in self._windows.items() if w and w[-1][0] > hour_ago}
            self._swept = now
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = deque(sorted(self._made(key, hour_ago)))
        while window and window[0][0] <= hour_ago:
            window.popleft()
        return window

    def check(self, key: Key, n: int, now: datetime, *, held: int | None = None) -> None:
        """Refuse `n` more made by this member now, of which `held` (all, by default) will be
        held: 429 past the hourly rate (with the seconds until enough of the hour's have aged
        out), 409 past what they may hold."""
        quota = self.quota
        window = self._window(key, now)
        made = sum(count for _, count in window)
        if made + n > quota.per_hour:
            wait, excess = HOUR, made + n - quota.per_hour
            for instant, count in window:  # oldest first: when they age out, room is made
                excess -= count
                if excess <= 0:
                    wait = instant + HOUR - now
                    break
            seconds = min(3600, max(1, int(wait.total_seconds()) + 1))
            metrics.RATE_LIMITED.labels(f"{quota.name}PerHour").inc()
            raise MemorySpaceRateLimitedError(
                f"at most {quota.per_hour} {quota.name} per hour per member",
                {"limit": f"{quota.name}PerHour", "max": quota.per_hour,
                 "retryAfterSeconds": seconds})
        more = n if held is None else held
        if not more:
            return
        if key not in self._held:
            self._held[key] = self._count(key)
        if self._held[key] + more > quota.held:
            raise MemorySpaceFullError(f"at most {quota.held} {quota.name} per member",
                                       {"limit": quota.name, "max": quota.held})

    def took(self, key: Key, n: int, now: datetime, *, held: int | None = None) -> None:
        """`n` more were made by this member, `held` of them held (after `check`, in the same
        writer's turn)."""
        self._window(key, now).append((now, n))
        if key in self._held:
            self._held[key] += n if held is None else held

    def stale(self, keys: Iterable[Key]) -> None:
        """Rows of these members were deleted: count what they hold again on next use."""
        for key in keys:
            self._held.pop(key, None)
