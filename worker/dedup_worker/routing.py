"""Where each record of a batch goes under ownership, and what a worker reads (pure).

Under ownership (`dedup_contract.ownership`) worker `w` of `W` publishes only the ids it
owns, to output partition `w`. It reads:

* every input partition `i` with ``i % W == w`` (the input may have any number of
  partitions, and may grow: new ones are found by polling the metadata);
* every partition `q` of the pipeline's internal topic with ``q % W == w``.

A record whose id another worker owns is *forwarded*: produced, in the same transaction
as the batch's output, dead letters and source offsets, to partition ``owner`` of the
internal topic, with its key, value, headers and timestamp kept and two headers appended
last: `FORWARD_ID` (the id, so the owner parses no value) and `FORWARD_ORIGIN` (the input
partition and offset, ``b"<partition>:<offset>"``, for the audit). The owner strips
exactly those two before publishing, so an output record is byte for byte the same
whether or not it was forwarded.

The window's clock over several sources is `WindowClock`: the minimum, over the sources
still being read, of the newest timestamp read from each. A lagging source (a new
partition read from its start, a backlog, a stalled internal partition) holds the clock
back, so its ids never expire early; a source at its end does not (watermark idleness,
as Flink does). Holding the clock back keeps ids longer, never shorter: each id is
stored at least at its batch's newest timestamp.

Nothing here talks to Kafka; the shell (`loop.py`) hands in plain values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import eq, ne
from typing import Final, cast

from dedup_contract.batch import DeadLetter, Firsts, Headers, InputRecord, Triage, triage_known
from dedup_contract.ids import ID_HEADER, MAX_ID_BYTES

FORWARD_ID: Final = ID_HEADER
FORWARD_ORIGIN: Final = "dedup.origin"
FORWARD_HEADERS: Final = 2  # how many headers forwarding appends, last
NOT_FORWARDED: Final = "not_forwarded"
"""Dead-letter reason of a record on the internal topic without forwarding headers:
something other than a worker wrote it."""

Source = tuple[str, int]
"""A (topic, partition) a worker reads."""


def sources_of(worker: int, workers: int, partitions: int) -> list[int]:
    """The partitions, of a topic with `partitions` partitions, that `worker` of
    `workers` reads: those equal to it modulo `workers`."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} is not one of {workers}")
    return list(range(worker, partitions, workers))


def forward_headers(
    headers: Headers | None, utf8_id: bytes, partition: int, offset: int
) -> Headers:
    """A forwarded record's headers: its own, then the id and where it was read."""
    return [
        *(headers or ()),
        (FORWARD_ID, utf8_id),
        (FORWARD_ORIGIN, b"%d:%d" % (partition, offset)),
    ]


def without_forwarding(headers: Headers) -> Headers:
    """The headers a forwarded record had before it was forwarded."""
    return headers[:-FORWARD_HEADERS]


def published_headers(forwarded: Headers) -> Headers:
    """The output headers of a forwarded record (one `forwarded_id` accepted): its own,
    then the id header. Forwarding appended exactly that header and the origin, so
    dropping the origin leaves them, with no new list built per header."""
    return forwarded[:-1]


def forwarded_id(headers: Headers | None) -> bytes | None:
    """The id a forwarded record carries, or None if it carries none (its last two
    headers are not the forwarding headers with a valid id)."""
    if headers is None or len(headers) < FORWARD_HEADERS:
        return None
    (id_name, utf8_id), (origin_name, _) = headers[-2], headers[-1]
    if id_name != FORWARD_ID or origin_name != FORWARD_ORIGIN or not utf8_id:
        return None
    if len(utf8_id) > MAX_ID_BYTES:
        return None
    return utf8_id


def triage_forwarded(records: Sequence[InputRecord]) -> Triage:
    """`batch.triage` for records read from the internal topic: the id is the
    forwarding header's, no value is parsed. A record without one is a dead letter.

    A batch whose every record carries a valid id (the only case workers write) is
    decided at once, driven from C, with one list comprehension over the headers;
    any other takes `forwarded_id` record by record."""
    utf8_ids = _all_forwarded_ids([record.headers() for record in records])
    if utf8_ids is not None:
        try:
            message_ids = list(map(bytes.decode, utf8_ids))
        except UnicodeDecodeError:
            pass
        else:
            return triage_known(records, message_ids, utf8_ids)
    return _triage_forwarded_each(records)


def _all_forwarded_ids(headers: list[Headers | None]) -> list[bytes] | None:
    """The ids of a batch's records when each ends with the forwarding headers and a
    non-empty id no longer than `MAX_ID_BYTES`, else None (`forwarded_id`'s rule, for
    the whole batch at once)."""
    try:
        if not all(
            [h[-2][0] == FORWARD_ID and h[-1][0] == FORWARD_ORIGIN for h in headers]  # type: ignore[index]
        ):
            return None
        utf8_ids = [h[-2][1] for h in headers]  # type: ignore[index]
    except (TypeError, IndexError):  # a record without headers, or with fewer than two
        return None
    if not all(utf8_ids) or max(map(len, utf8_ids), default=0) > MAX_ID_BYTES:  # type: ignore[arg-type]
        return None
    return cast(list[bytes], utf8_ids)


def _triage_forwarded_each(records: Sequence[InputRecord]) -> Triage:
    """`triage_forwarded` record by record: records without a valid forwarded id
    become dead letters."""
    firsts = Firsts([], [], [], [])
    dead: list[DeadLetter] = []
    seen: set[bytes] = set()
    repeats = 0
    newest_ms = 0
    for record in records:
        newest_ms = max(newest_ms, record.timestamp()[1])
        utf8_id = forwarded_id(record.headers())
        message_id = None
        if utf8_id is not None:
            try:
                message_id = utf8_id.decode()
            except UnicodeDecodeError:
                message_id = None
        if utf8_id is None or message_id is None:
            dead.append(
                DeadLetter(
                    record,
                    NOT_FORWARDED,
                    f"a record on the internal topic must end with headers {FORWARD_ID} "
                    f"and {FORWARD_ORIGIN}; something other than a worker wrote it",
                )
            )
            continue
        if not firsts.add_if_first(record, message_id, utf8_id, seen):
            repeats += 1
    return Triage(firsts, repeats, dead, newest_ms)


def merge(first: Triage, then: Triage) -> Triage:
    """Two triages of one batch as one: `then`'s ids already among `first`'s are
    repeats."""
    if not then.firsts and not then.dead_letters:
        return first
    seen = set(first.firsts.utf8_ids)
    keep = [utf8_id not in seen for utf8_id in then.firsts.utf8_ids]
    kept = then.firsts.where(keep)
    a, b = first.firsts, kept
    keys = (
        None
        if a.computed_keys is None or b.computed_keys is None
        else a.computed_keys + b.computed_keys
    )
    return Triage(
        Firsts(a.records + b.records, a.message_ids + b.message_ids, a.utf8_ids + b.utf8_ids, keys),
        first.repeats + then.repeats + len(keep) - len(kept),
        first.dead_letters + then.dead_letters,
        max(first.newest_ms, then.newest_ms),
    )


@dataclass(frozen=True, slots=True)
class Forwards:
    """Records to forward, as columns: entry i of each list is about the same record."""

    records: list[InputRecord]
    utf8_ids: list[bytes]
    owners: list[int]  # the internal topic's partition each goes to

    def __len__(self) -> int:
        return len(self.records)


NO_FORWARDS: Final = Forwards([], [], [])


def route(firsts: Firsts, owners: Sequence[int], me: int) -> tuple[Firsts, Forwards]:
    """The first occurrences this worker owns (to publish, if new to its window) and
    those it forwards to their owners."""
    if len(owners) != len(firsts):
        raise ValueError(f"{len(firsts)} candidates but {len(owners)} owners")
    mine = list(map(eq, owners, [me] * len(owners)))
    if all(mine):  # the common case: producers keyed by id
        return firsts, NO_FORWARDS
    others = list(map(ne, owners, [me] * len(owners)))
    return firsts.where(mine), Forwards(
        list(compress(firsts.records, others)),
        list(compress(firsts.utf8_ids, others)),
        list(compress(owners, others)),
    )


def source_spans(
    sources: Sequence[Source], offsets: Sequence[int]
) -> dict[Source, tuple[int, int]]:
    """For each source of a batch (records in consumption order: each source's offsets
    increase), its first offset and the next offset to read after the batch."""
    last = dict(zip(sources, offsets, strict=True))
    first = dict(zip(reversed(sources), reversed(offsets), strict=True))
    return {source: (first[source], last[source] + 1) for source in last}


class OpenTransactionAge:
    """How long forwarded records have been held back by an open transaction on the
    internal partitions a worker reads.

    `read_committed` stops at a partition's last stable offset (LSO): the start of its
    oldest open transaction, whichever forwarder it belongs to. While the LSO stays below
    the high watermark and does not move, that transaction is still open; its age is how
    long the LSO has stood there. A forwarder SIGKILLed mid-transaction holds every
    forwarder's records back until its replacement calls `init_transactions` (which aborts
    it) or the broker aborts it after `transaction.timeout.ms`.
    """

    def __init__(self) -> None:
        self._since: dict[int, tuple[int, float]] = {}  # partition -> (LSO, since when)

    def observe(self, partition: int, high: int, stable: int, now: float) -> None:
        """The partition's high watermark and last stable offset at `now` (seconds)."""
        if high <= stable or stable < 0:
            self._since.pop(partition, None)
            return
        held = self._since.get(partition)
        if held is None or held[0] != stable:
            self._since[partition] = (stable, now)

    def seconds(self, now: float) -> float:
        """The age of the oldest transaction holding forwarded records back (0: none)."""
        return max((now - since for _, since in self._since.values()), default=0.0)


class WindowClock:
    """The window's clock: the minimum, over the sources still being read, of the
    newest timestamp read from each; a source at its end does not count; never
    goes back. With one source it is the newest timestamp read, as before."""

    def __init__(self) -> None:
        self._newest: dict[Source, int] = {}
        self._at_end: set[Source] = set()
        self._now_ms = 0

    def read(self, source: Source, newest_ms: int) -> None:
        """Records up to `newest_ms` were read from `source`."""
        if newest_ms > self._newest.get(source, 0):
            self._newest[source] = newest_ms
        self._at_end.discard(source)

    def at_end(self, source: Source) -> None:
        """`source` has nothing more to read for now."""
        self._at_end.add(source)

    def advance(self) -> int:
        """The clock after what was read; it never goes back."""
        active = [ms for source, ms in self._newest.items() if source not in self._at_end]
        candidate = min(active) if active else max(self._newest.values(), default=0)
        self._now_ms = max(self._now_ms, candidate)
        return self._now_ms

    @property
    def now_ms(self) -> int:
        return self._now_ms
