"""When a Lease counts as run out, and how its holder keeps it: the one rule for every
reader and every holder (the worker's partition Lease, the operator's failover and its
leader election). Nobody else may judge a Lease's expiry.

**No reader compares the holder's wall clock with its own.** A reader records *when it
observed* the Lease's `(holderIdentity, renewTime, resourceVersion)` change, on its own
monotonic clock (`LeaseClock.observe`), as client-go's leader election does; the Lease
has run out only once `leaseDurationSeconds` has passed on that clock since, with no
change seen (`expired`). A skewed holder changes nothing: any write is a change.

A reader with no history (a restarted operator, a worker just started) sees every held
Lease as renewed at first sight and waits a full duration: at most one duration lost
after a restart, and never two holders at once.

A Lease is *free* (taken at once) when it names no holder, or when its holder released
it: `release_times` writes `renewTime` one duration before `acquireTime`, two times from
the holder's clock, so whether it was released never depends on the reader's clock.

A holder judges its own hold by its monotonic renew deadline (`LeaseTiming`: renew every
third of the duration, held until two thirds after the last good renew was sent), so it
stops acting before any reader may count the Lease as run out.

Fault injection (tests only): `DEDUP_FAULT_CLOCK_SKEW_S` (seconds, may be negative)
shifts the wall-clock times the worker writes into its Lease. Unset in production.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

SKEW_ENV = "DEDUP_FAULT_CLOCK_SKEW_S"


@dataclass(frozen=True)
class LeaseStamp:
    """What identifies one renewal of a Lease: any change of these is a renewal (or a
    takeover) that restarts the reader's count."""

    holder: str | None
    renew_time: datetime | None
    resource_version: str | None


def is_free(
    holder: str | None,
    renew_time: datetime | None,
    acquire_time: datetime | None,
    duration_s: float,
) -> bool:
    """Nobody holds it: no holder, never renewed, or released by its holder."""
    return not holder or renew_time is None or released(renew_time, acquire_time, duration_s)


def released(renew_time: datetime | None, acquire_time: datetime | None, duration_s: float) -> bool:
    """Given up by its holder: `renewTime` at least one duration before `acquireTime`
    (how `release_times` writes it). A holder renewing writes `renewTime >= acquireTime`
    from the same clock, so this never depends on whose clock reads it."""
    if renew_time is None or acquire_time is None or duration_s <= 0:
        return False
    return renew_time <= acquire_time - timedelta(seconds=duration_s)


def release_times(
    acquire_time: datetime | None, duration_s: float, wall_now: datetime
) -> tuple[datetime, datetime]:
    """(acquireTime, renewTime) a holder writes when it gives the Lease up."""
    acquired = acquire_time if acquire_time is not None else wall_now
    return acquired, acquired - timedelta(seconds=max(duration_s, 1))


def expired(free: bool, unchanged_for_s: float, duration_s: float) -> bool:
    """The rule: free, or observed unchanged for a full duration on the reader's clock."""
    return free or unchanged_for_s >= duration_s


def remaining_s(free: bool, unchanged_for_s: float, duration_s: float) -> float:
    """Seconds until `expired` turns true with no change seen (0 once it is)."""
    return 0.0 if free else max(0.0, duration_s - unchanged_for_s)


@dataclass(frozen=True)
class LeaseTiming:
    """How often a holder renews and how long a successful renew proves the hold: the one
    rule for every holder (the worker's partition Lease, the operator's leader Lease).

    `for_duration(d)`: renew every d/3, held until 2d/3 after the last successful renew
    was sent. Invariant: renew_every_s < renew_deadline_s < duration_s, so a few renews
    may fail before the hold lapses, and it lapses (for the holder) a third of a duration
    before the Lease expires (for everyone else)."""

    duration_s: int
    renew_every_s: float
    renew_deadline_s: float

    @classmethod
    def for_duration(cls, duration_s: int) -> LeaseTiming:
        return cls(duration_s, duration_s / 3, duration_s * 2 / 3)

    def __post_init__(self) -> None:
        if not 0 < self.renew_every_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(
                "need 0 < renew interval < renew deadline < lease duration, got "
                f"{self.renew_every_s}s, {self.renew_deadline_s}s, {self.duration_s}s"
            )

    @property
    def request_timeout_s(self) -> float:
        """Per API request: a hung request must not outlive a renew interval."""
        return self.renew_every_s

    def held_until(self, last_renew_sent: float) -> float:
        """Monotonic time until which a renew *sent* at `last_renew_sent` (monotonic) and
        answered with success proves the hold."""
        return last_renew_sent + self.renew_deadline_s


class LeaseClock:
    """The reader's memory of when it saw each Lease change, on its monotonic clock.

    `observe(key, stamp)` returns for how many seconds this reader has seen `stamp`
    unchanged: 0 at first sight (no history: treated as just renewed) and whenever the
    stamp differs from the one last seen. Thread-safe. Entries not observed for
    `forget_after_s` are dropped (a Lease gone or no longer looked at).
    """

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        forget_after_s: float = 600.0,
    ) -> None:
        self._monotonic = monotonic
        self._forget_after_s = forget_after_s
        self._lock = threading.Lock()
        # key -> (stamp, monotonic time first seen, monotonic time last seen)
        self._seen: dict[Hashable, tuple[LeaseStamp, float, float]] = {}
        self._last_prune = monotonic()

    def observe(self, key: Hashable, stamp: LeaseStamp) -> float:
        now = self._monotonic()
        with self._lock:
            if now - self._last_prune > self._forget_after_s:
                self._seen = {
                    k: v for k, v in self._seen.items() if now - v[2] <= self._forget_after_s
                }
                self._last_prune = now
            previous = self._seen.get(key)
            if previous is None or previous[0] != stamp:
                self._seen[key] = (stamp, now, now)
                return 0.0
            self._seen[key] = (stamp, previous[1], now)
            return max(0.0, now - previous[1])

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._seen.pop(key, None)


class ContinuousView:
    """Since when a reader has been looking at a set of Leases without a gap.

    A Lease seen unchanged across a time the reader could not look — the API server
    down, the reader's watch broken — was not necessarily left unrenewed by its holder:
    nobody could write it. So an unchanged Lease's age counts only from the start of the
    reader's current unbroken view (`unchanged_for = min(LeaseClock age, view age)`),
    as the node lifecycle controller resets every node's probe time when it leaves
    full-disruption mode. `looked(now, ok)` is called on each read: `ok=False` (or a
    read more than `gap_s` after the last) breaks the view, and the next good read
    starts a new one.
    """

    def __init__(self, gap_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._gap_s = gap_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._since: float | None = None
        self._last: float | None = None

    def looked(self, ok: bool = True, since: float | None = None) -> float:
        """Record a read; returns for how many seconds the view has been unbroken (0 on a
        failed read and at the first good one after a gap). `since`: the reader follows
        the Leases by a watch, unbroken since then (same monotonic clock); the gap between
        reads then does not matter."""
        now = self._monotonic()
        with self._lock:
            if not ok:
                self._since = self._last = None
                return 0.0
            if since is not None:
                self._since = since
            elif self._since is None or self._last is None or now - self._last > self._gap_s:
                self._since = now
            self._last = now
            return max(0.0, now - self._since)


def clock_skew_s() -> float:
    """The injected wall-clock skew (tests only; 0 unless `DEDUP_FAULT_CLOCK_SKEW_S`)."""
    raw = os.environ.get(SKEW_ENV, "").strip()
    return float(raw) if raw else 0.0


def skewed_utc_now() -> datetime:
    """The wall clock a Lease holder writes with: UTC now, shifted by the injected skew."""
    return datetime.now(UTC) + timedelta(seconds=clock_skew_s())
