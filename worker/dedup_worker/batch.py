"""Pure per-batch decisions: which polled records are dead letters, which are the first
occurrence of their id inside the batch, and which of those are new to the window.

No Kafka and no RocksDB here: the shell hands in plain values and a lookup result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dedup_worker.ids import IdSpec, InvalidRecord, extract_id, id_key

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Record:
    """One input record, as much of it as the decisions need (and what is republished)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Candidate:
    record: Record
    message_id: str
    key: bytes  # the fixed-width store key of message_id


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: Record
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Triage:
    """A batch split into first occurrences (in input order), in-batch repeats and dead letters."""

    firsts: list[Candidate]
    repeats: int
    dead_letters: list[DeadLetter]


def triage(records: Sequence[Record], spec: IdSpec) -> Triage:
    firsts: list[Candidate] = []
    dead: list[DeadLetter] = []
    seen: set[bytes] = set()
    repeats = 0
    for record in records:
        try:
            message_id = extract_id(spec, record.key, record.value, record.headers)
        except InvalidRecord as invalid:
            dead.append(DeadLetter(record, invalid.reason, invalid.detail))
            continue
        key = id_key(message_id)
        if key in seen:
            repeats += 1
            continue
        seen.add(key)
        firsts.append(Candidate(record, message_id, key))
    return Triage(firsts, repeats, dead)


def select_new(firsts: Sequence[Candidate], present: Sequence[bool]) -> list[Candidate]:
    """The candidates whose id the window does not hold yet (`present` from a multi-get)."""
    if len(firsts) != len(present):
        raise ValueError(f"{len(firsts)} candidates but {len(present)} lookup results")
    return [c for c, hit in zip(firsts, present, strict=True) if not hit]
