"""The dedup window as pure policy: durations, generations, rollover and expiry decisions.

The store keeps ids in *generations* (one RocksDB column family each, oldest first).
New ids go into the newest generation; it is closed and a new one opened when it holds
``max_keys / generations`` ids or when ``duration / generations`` of time has passed
since it was opened. Expiry drops whole generations, oldest first:

* by time: a generation goes when its newest id is older than ``duration``, so every
  id is kept for at least ``duration`` and at most about ``duration * (1 + 1/generations)``;
* by count: oldest generations go while more than ``max_keys`` ids are kept, so the
  store never holds more than ``max_keys`` after an expiry and, once full, at least
  ``max_keys * (1 - 1/generations)``.

Timestamps are milliseconds on the caller's clock; ``record`` and ``expire`` must use
the same clock. This module does no I/O; ``store.py`` applies its decisions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

_UNIT_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART: Final = re.compile(r"(\d+)(ms|s|m|h|d)")


def parse_duration_ms(text: str) -> int:
    """Milliseconds in a duration like ``672h``, ``30m``, ``15s``, ``7d``, ``1h30m``, ``500ms``.

    Whole numbers with a unit (ms, s, m, h, d = 24h), optionally concatenated largest
    unit first as in Go/Kubernetes durations. No sign, no fraction, no bare number.
    """
    cleaned = text.strip()
    parts = _PART.findall(cleaned)
    if not cleaned or "".join(amount + unit for amount, unit in parts) != cleaned:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 672h, 30m, 15s, 7d, 1h30m)")
    units = [unit for _, unit in parts]
    if len(set(units)) != len(units) or units != sorted(
        units, key=_UNIT_MS.__getitem__, reverse=True
    ):
        raise ValueError(
            f"not a duration: {text!r} (units must go from largest to smallest, once each)"
        )
    return sum(int(amount) * _UNIT_MS[unit] for amount, unit in parts)


def format_duration_ms(ms: int) -> str:
    """The shortest ``parse_duration_ms`` text for ``ms`` (``2592000000`` -> ``30d``)."""
    if ms < 0:
        raise ValueError(f"durations are not negative: {ms}")
    if ms == 0:
        return "0s"
    out = []
    for unit, size in sorted(_UNIT_MS.items(), key=lambda item: -item[1]):
        if ms >= size:
            amount, ms = divmod(ms, size)
            out.append(f"{amount}{unit}")
    return "".join(out)


@dataclass(frozen=True)
class WindowPolicy:
    """How long and how many ids are remembered. At least one bound is set."""

    duration_ms: int | None = None
    max_keys: int | None = None

    def __post_init__(self) -> None:
        if self.duration_ms is None and self.max_keys is None:
            raise ValueError("a window needs a duration, a key bound, or both")
        if self.duration_ms is not None and self.duration_ms <= 0:
            raise ValueError(f"window duration must be positive, not {self.duration_ms} ms")
        if self.max_keys is not None and self.max_keys <= 0:
            raise ValueError(f"window key bound must be positive, not {self.max_keys}")

    @classmethod
    def from_spec(cls, duration: str | None, max_keys: int | None) -> WindowPolicy:
        """From the DedupPipeline ``spec.window`` (``duration: 672h``, ``maxKeys: ...``)."""
        return cls(None if duration is None else parse_duration_ms(duration), max_keys)

    def keys_per_generation(self, generations: int) -> int | None:
        """Most ids a generation takes before a new one is opened (None: unbounded)."""
        if self.max_keys is None:
            return None
        return max(1, -(-self.max_keys // generations))

    def span_per_generation_ms(self, generations: int) -> int | None:
        """Longest time a generation stays open for new ids (None: unbounded)."""
        if self.duration_ms is None:
            return None
        return max(1, -(-self.duration_ms // generations))


@dataclass(frozen=True)
class Generation:
    """One bucket of ids: ``number`` grows by one per generation and names its column family.

    ``opened_ms`` is the timestamp it was opened with (rollover clock); ``oldest_ms`` and
    ``newest_ms`` bound the timestamps recorded into it; ``keys`` counts its distinct ids.
    """

    number: int
    opened_ms: int
    oldest_ms: int
    newest_ms: int
    keys: int

    @classmethod
    def opened(cls, number: int, timestamp_ms: int) -> Generation:
        return cls(number, timestamp_ms, timestamp_ms, timestamp_ms, 0)

    def with_keys(self, count: int, timestamp_ms: int) -> Generation:
        """This generation after ``count`` more ids recorded at ``timestamp_ms``."""
        return replace(
            self,
            oldest_ms=min(self.oldest_ms, timestamp_ms),
            newest_ms=max(self.newest_ms, timestamp_ms),
            keys=self.keys + count,
        )


def place_batch(
    policy: WindowPolicy,
    current: Generation | None,
    count: int,
    timestamp_ms: int,
    generations: int,
) -> list[int]:
    """How ``count`` new ids at ``timestamp_ms`` are split: ``[into current, into new 1, ...]``.

    The first number goes into ``current`` (0 when there is none or it must be closed);
    each further number fills a freshly opened generation, in order. A batch larger
    than a generation's capacity is split so that no generation exceeds it.
    """
    if count < 0:
        raise ValueError(f"negative key count {count}")
    capacity = policy.keys_per_generation(generations)
    span = policy.span_per_generation_ms(generations)
    room = 0
    if current is not None and not (span is not None and timestamp_ms - current.opened_ms >= span):
        room = count if capacity is None else max(0, capacity - current.keys)
    first = min(room, count)
    placed = [first]
    left = count - first
    while left > 0:
        take = left if capacity is None else min(capacity, left)
        placed.append(take)
        left -= take
    return placed


def generations_to_drop(policy: WindowPolicy, live: Sequence[Generation], now_ms: int) -> int:
    """How many of the oldest ``live`` generations (oldest first) expire at ``now_ms``."""
    drop = 0
    if policy.duration_ms is not None:
        horizon = now_ms - policy.duration_ms
        while drop < len(live) and live[drop].newest_ms < horizon:
            drop += 1
    if policy.max_keys is not None:
        kept = sum(generation.keys for generation in live[drop:])
        while kept > policy.max_keys and drop < len(live):
            kept -= live[drop].keys
            drop += 1
    return drop


class WindowState:
    """The window's ids in memory, kept exactly as the worker's store keeps them:
    generations placed by ``place_batch`` and dropped by ``generations_to_drop``, as
    ``store.Store.record_batch`` and ``Store.expire`` apply them. For replays that must
    decide as the worker does (``dedup_spark.backfill``) without a RocksDB.

    ``record`` takes the ids the caller found absent (distinct), as the worker's
    ``record_batch(known_new=True)`` does."""

    def __init__(self, policy: WindowPolicy, generations: int) -> None:
        self.policy = policy
        self.generations = generations
        self._live: list[Generation] = []
        self._where: dict[bytes, int] = {}  # id key -> generation number
        self._members: dict[int, list[bytes]] = {}
        self._next = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._where

    @property
    def live(self) -> tuple[Generation, ...]:
        return tuple(self._live)

    def record(self, keys: Sequence[bytes], timestamp_ms: int) -> None:
        """Add ``keys`` (new, distinct) at ``timestamp_ms``."""
        if not keys:
            return
        current = self._live[-1] if self._live else None
        placed = place_batch(self.policy, current, len(keys), timestamp_ms, self.generations)
        start = 0
        for index, count in enumerate(placed):
            if count == 0:
                continue
            if index > 0:
                self._live.append(Generation.opened(self._next, timestamp_ms))
                self._members[self._next] = []
                self._next += 1
            target = self._live[-1].with_keys(count, timestamp_ms)
            self._live[-1] = target
            chunk = keys[start : start + count]
            self._members[target.number].extend(chunk)
            for key in chunk:
                self._where[key] = target.number
            start += count

    def expire(self, now_ms: int) -> int:
        """Drop the generations the policy expires at ``now_ms``; the ids removed."""
        drop = generations_to_drop(self.policy, self._live, now_ms)
        removed = 0
        for generation in self._live[:drop]:
            for key in self._members.pop(generation.number):
                del self._where[key]
                removed += 1
        del self._live[:drop]
        return removed
