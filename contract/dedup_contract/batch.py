"""Pure per-batch decisions: which polled records are dead letters, which are the first
occurrence of their id inside the batch, and which of those are new to the window.

No Kafka and no RocksDB here: the shell hands in plain values and a lookup result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from itertools import compress
from operator import methodcaller, not_
from typing import NamedTuple, Protocol

from dedup_contract.ids import (
    IdSpec,
    InvalidRecord,
    extract_id,
    id_key,
    id_keys,
    plain_field,
    plain_header_ids,
    plain_json_id,
    plain_json_ids,
    plain_key_ids,
)

Headers = list[tuple[str, bytes | None]]

# A record's parts for `map` (driven from C: no Python call per record).
_value = methodcaller("value")
_key = methodcaller("key")
_headers = methodcaller("headers")

# Headers a dead letter carries besides the original record's own.
DLQ_REASON = "dedup.reason"
DLQ_DETAIL = "dedup.detail"
DLQ_TOPIC = "dedup.origin.topic"
DLQ_PARTITION = "dedup.origin.partition"
DLQ_OFFSET = "dedup.origin.offset"


class InputRecord(Protocol):
    """One consumed record. confluent-kafka's `Message` has exactly this shape, so the
    hot loop hands messages straight in without copying them into another object."""

    def offset(self) -> int: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Headers | None: ...
    def timestamp(self) -> tuple[int, int]: ...


@dataclass(frozen=True, slots=True)
class Record:
    """A plain `InputRecord` (tests, replays)."""

    at: int
    key_bytes: bytes | None
    value_bytes: bytes | None
    header_list: Headers | None = None
    timestamp_ms: int = 0

    def offset(self) -> int:
        return self.at

    def key(self) -> bytes | None:
        return self.key_bytes

    def value(self) -> bytes | None:
        return self.value_bytes

    def headers(self) -> Headers | None:
        return self.header_list

    def timestamp(self) -> tuple[int, int]:
        return (1, self.timestamp_ms)  # TIMESTAMP_CREATE_TIME


class Candidate(NamedTuple):
    """A record whose id is the first of its kind in its batch (one row of `Firsts`)."""

    record: InputRecord
    message_id: str
    key: bytes  # the fixed-width store key of message_id


class DeadLetter(NamedTuple):
    record: InputRecord
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Firsts:
    """Records whose id is the first of its kind in their batch, in input order, as
    columns: entry i of each list is about the same record.

    Columns rather than an object per record: the worker builds and consumes them with
    ``map``/``compress`` driven from C, no Python call per record. Iterating or indexing
    gives `Candidate` rows (tests, the backfill)."""

    records: list[InputRecord]
    message_ids: list[str]
    utf8_ids: list[bytes]  # message_ids encoded: the output's id header values
    computed_keys: list[bytes] | None = dataclass_field(default=None, compare=False, repr=False)
    """The store keys when already known (`keys` computes them otherwise)."""

    @property
    def keys(self) -> list[bytes]:
        """The ids' store keys (ids.id_key), computed on first use: a worker hashes
        only the ids it owns, not those it forwards (0.3-0.4 us an id)."""
        keys = self.computed_keys
        if keys is None:
            keys = id_keys(self.utf8_ids)
            object.__setattr__(self, "computed_keys", keys)  # a cache of derived columns
        return keys

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Candidate]:
        return map(Candidate, self.records, self.message_ids, self.keys)

    def __getitem__(self, index: int) -> Candidate:
        return Candidate(self.records[index], self.message_ids[index], self.keys[index])

    def add_if_first(
        self, record: InputRecord, message_id: str, utf8_id: bytes, seen: set[bytes]
    ) -> bool:
        """Append the record unless its id is in `seen` (a repeat in its batch: False);
        `seen` gets its store key."""
        key = id_key(message_id)
        if key in seen:
            return False
        seen.add(key)
        self.records.append(record)
        self.message_ids.append(message_id)
        self.utf8_ids.append(utf8_id)
        self.keys.append(key)
        return True

    def where(self, keep: Sequence[bool]) -> Firsts:
        """The rows whose ``keep`` is true, in order."""
        if len(keep) != len(self.records):
            raise ValueError(f"{len(self.records)} rows but {len(keep)} flags")
        return Firsts(
            list(compress(self.records, keep)),
            list(compress(self.message_ids, keep)),
            list(compress(self.utf8_ids, keep)),
            None if self.computed_keys is None else list(compress(self.computed_keys, keep)),
        )


@dataclass(frozen=True, slots=True)
class Triage:
    """A batch split into first occurrences (in input order), in-batch repeats and dead
    letters, with the newest record timestamp of the whole batch (0 for an empty one)."""

    firsts: Firsts
    repeats: int
    dead_letters: list[DeadLetter]
    newest_ms: int


def triage(records: Sequence[InputRecord], spec: IdSpec) -> Triage:
    # A batch whose every record has a valid id is decided at once, without a Python
    # call per record: a top-level JSON field of plain string ids (`plain_json_ids`), or
    # every key or header an id (`plain_key_ids`, `plain_header_ids`). A batch with any
    # other record, and a dotted JSON field, take the rules record by record.
    field = plain_field(spec)
    message_ids: list[str] | None = None
    if field is not None:
        message_ids = plain_json_ids(field, list(map(_value, records)))
    elif spec.source == "key":
        message_ids = plain_key_ids(list(map(_key, records)))
    elif spec.source == "header":
        message_ids = plain_header_ids(spec.field, list(map(_headers, records)))
    if message_ids is None:
        return _triage_each(records, spec, field)
    return triage_known(records, message_ids, list(map(str.encode, message_ids)))


def triage_known(
    records: Sequence[InputRecord], message_ids: list[str], utf8_ids: list[bytes]
) -> Triage:
    """`triage` of a batch whose every record has a valid id, decided at once (entry i
    of each list is about the same record): the first occurrences and the repeats."""
    # Repeats found by the ids' bytes (equal ids, equal keys): the store keys are
    # computed later, for the ids this worker owns only.
    firsts = Firsts(list(records), message_ids, utf8_ids)
    newest_ms = max(0, max([record.timestamp()[1] for record in records], default=0))
    if len(set(utf8_ids)) == len(firsts):
        return Triage(firsts, 0, [], newest_ms)
    seen: set[bytes] = set()
    keep: list[bool] = []
    for utf8_id in utf8_ids:
        keep.append(utf8_id not in seen)
        seen.add(utf8_id)
    return Triage(firsts.where(keep), len(firsts) - len(seen), [], newest_ms)


def _triage_each(records: Sequence[InputRecord], spec: IdSpec, field: str | None) -> Triage:
    """`triage` record by record: each takes `plain_json_id` (when ``field``) and the full
    rules where that defers; records without a valid id become dead letters."""
    firsts = Firsts([], [], [], [])
    dead: list[DeadLetter] = []
    seen: set[bytes] = set()
    repeats = 0
    newest_ms = 0
    for record in records:
        timestamp_ms = record.timestamp()[1]
        if timestamp_ms > newest_ms:
            newest_ms = timestamp_ms
        message_id = None if field is None else plain_json_id(field, record.value())
        if message_id is None:
            try:
                message_id = extract_id(spec, record.key(), record.value(), record.headers())
            except InvalidRecord as invalid:
                dead.append(DeadLetter(record, invalid.reason, invalid.detail))
                continue
        if not firsts.add_if_first(record, message_id, message_id.encode(), seen):
            repeats += 1
    return Triage(firsts, repeats, dead, newest_ms)


def select_new(firsts: Firsts, present: Sequence[bool]) -> Firsts:
    """The first occurrences whose id the window does not hold yet (`present` from a
    multi-get)."""
    if len(firsts) != len(present):
        raise ValueError(f"{len(firsts)} candidates but {len(present)} lookup results")
    if not any(present):  # the common case: all new
        return firsts
    return firsts.where(list(map(not_, present)))


def dead_letter_headers(
    headers: Headers | None, reason: str, detail: str, topic: str, partition: int, offset: int
) -> Headers:
    """A dead letter's headers: the record's own, then why and where it came from."""
    return [
        *(headers or ()),
        (DLQ_REASON, reason.encode()),
        (DLQ_DETAIL, detail.encode("utf-8", "replace")),
        (DLQ_TOPIC, topic.encode()),
        (DLQ_PARTITION, str(partition).encode()),
        (DLQ_OFFSET, str(offset).encode()),
    ]
