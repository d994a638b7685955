"""Under ownership: which records a worker publishes, which it forwards, what it reads,
and the window's clock over several sources (pure)."""

from __future__ import annotations

import json
import random

import pytest

from dedup_contract.batch import Record, triage
from dedup_contract.ids import ID_HEADER, IdSpec, id_key
from dedup_contract.ownership import owner_reference
from dedup_worker.routing import (
    FORWARD_ID,
    FORWARD_ORIGIN,
    NOT_FORWARDED,
    OpenTransactionAge,
    WindowClock,
    forward_headers,
    forwarded_id,
    merge,
    published_headers,
    route,
    source_spans,
    sources_of,
    triage_forwarded,
    without_forwarding,
)


def event(message_id: str) -> bytes:
    return json.dumps({"messageId": message_id}).encode()


def test_a_worker_reads_the_partitions_equal_to_it_modulo_the_workers() -> None:
    assert sources_of(1, 2, 5) == [1, 3]
    assert sources_of(0, 4, 4) == [0]
    assert sources_of(3, 4, 3) == [], "a topic with fewer partitions than workers"
    # every partition read by exactly one worker, however many there are
    for partitions in range(1, 12):
        for workers in range(1, 6):
            read = sorted(p for w in range(workers) for p in sources_of(w, workers, partitions))
            assert read == list(range(partitions))
    with pytest.raises(ValueError):
        sources_of(2, 2, 4)


def test_forwarding_headers_come_off_exactly_leaving_the_record_as_it_was() -> None:
    own = [("trace", b"t1"), (FORWARD_ID, b"user-put-this")]  # a user header of that name too
    forwarded = forward_headers(own, "ü-1".encode(), 3, 1234)
    assert forwarded[-2:] == [(FORWARD_ID, "ü-1".encode()), (FORWARD_ORIGIN, b"3:1234")]
    assert forwarded_id(forwarded) == "ü-1".encode()
    assert without_forwarding(forwarded) == own
    assert without_forwarding(forward_headers(None, b"a", 0, 0)) == []
    # what the owner publishes: the record's own headers, then the id, as if read from input
    assert published_headers(forwarded) == [*own, (ID_HEADER, "ü-1".encode())]
    assert published_headers(forward_headers(None, b"a", 0, 0)) == [(ID_HEADER, b"a")]
    assert forwarded_id(own) is None, "no origin header last: not forwarded"
    assert forwarded_id(None) is None


def test_forwarded_records_take_their_id_from_the_header_without_parsing_the_value() -> None:
    records = [
        Record(0, None, b"not json at all", forward_headers(None, b"x", 0, 7), 10),
        Record(1, None, b"{}", forward_headers([("h", b"1")], b"y", 1, 8), 30),
        Record(2, None, b"", forward_headers(None, b"x", 1, 9), 20),
        Record(3, None, event("z"), [("h", b"1")], 5),  # written by something else
    ]
    split = triage_forwarded(records)
    assert split.firsts.message_ids == ["x", "y"]
    assert split.firsts.keys == [id_key("x"), id_key("y")]
    assert split.repeats == 1 and split.newest_ms == 30
    assert [(d.record.offset(), d.reason) for d in split.dead_letters] == [(3, NOT_FORWARDED)]


def test_a_batch_of_forwarded_records_decided_at_once_agrees_with_one_by_one() -> None:
    """The whole-batch path against a replay through `forwarded_id`, record by record,
    on batches where every record is well formed and on batches with one that is not
    (which must then take the record-by-record path and dead-letter exactly it)."""
    rng = random.Random(11)
    malformed = [
        None,
        [],
        [(FORWARD_ORIGIN, b"0:1")],
        [(FORWARD_ID, b""), (FORWARD_ORIGIN, b"0:1")],
        [(FORWARD_ID, None), (FORWARD_ORIGIN, b"0:1")],
        [(FORWARD_ID, b"\xff\xfe"), (FORWARD_ORIGIN, b"0:1")],
        [(FORWARD_ID, b"x" * 10_000), (FORWARD_ORIGIN, b"0:1")],
        [(FORWARD_ORIGIN, b"0:1"), (FORWARD_ID, b"a")],
    ]
    for trial in range(200):
        size = rng.randint(0, 30)
        records = [
            Record(
                n,
                None,
                b"",
                forward_headers(
                    [("h", b"1")] if rng.random() < 0.3 else None,
                    f"id-{rng.randint(0, 20)}".encode(),
                    0,
                    n,
                ),
                rng.randint(1, 1000),
            )
            for n in range(size)
        ]
        bad_at = None
        if trial % 2 and records:
            bad_at = rng.randrange(size)
            records[bad_at] = Record(bad_at, None, b"", rng.choice(malformed), 1)  # type: ignore[arg-type]
        split = triage_forwarded(records)
        seen: list[str] = []
        firsts: list[int] = []
        dead: list[int] = []
        for rec in records:
            utf8_id = forwarded_id(rec.headers())
            try:
                message_id = None if utf8_id is None else utf8_id.decode()
            except UnicodeDecodeError:
                message_id = None
            if message_id is None:
                dead.append(rec.offset())
            elif message_id not in seen:
                seen.append(message_id)
                firsts.append(rec.offset())
        assert split.firsts.message_ids == seen
        assert [r.offset() for r in split.firsts.records] == firsts
        assert split.firsts.keys == [id_key(i) for i in seen]
        assert split.firsts.utf8_ids == [i.encode() for i in seen]
        assert [d.record.offset() for d in split.dead_letters] == dead
        assert split.repeats == len(records) - len(firsts) - len(dead)
        assert split.newest_ms == max((r.timestamp()[1] for r in records), default=0)
        assert (bad_at is None) or dead == [bad_at]


def test_merge_counts_an_id_read_from_both_sources_once() -> None:
    from_input = triage([Record(0, None, event("a")), Record(1, None, event("b"))], IdSpec())
    from_internal = triage_forwarded(
        [
            Record(0, None, b"", forward_headers(None, b"b", 0, 1), 50),
            Record(1, None, b"", forward_headers(None, b"c", 0, 2), 40),
        ]
    )
    both = merge(from_input, from_internal)
    assert both.firsts.message_ids == ["a", "b", "c"]
    assert both.repeats == 1 and both.newest_ms == 50
    assert merge(from_input, triage_forwarded([])) is from_input


def test_route_splits_by_owner_against_the_reference_hash() -> None:
    rng = random.Random(7)
    ids = [f"id-{rng.getrandbits(40)}" for _ in range(500)]
    firsts = triage([Record(n, None, event(i)) for n, i in enumerate(ids)], IdSpec()).firsts
    workers, me = 3, 1
    owners = [owner_reference(i.encode(), workers) for i in ids]
    mine, forwards = route(firsts, owners, me)
    assert mine.message_ids == [i for i, o in zip(ids, owners, strict=True) if o == me]
    assert [r.offset() for r in forwards.records] == [n for n, o in enumerate(owners) if o != me]
    assert forwards.owners == [o for o in owners if o != me]
    assert forwards.utf8_ids == [i.encode() for i, o in zip(ids, owners, strict=True) if o != me]
    all_mine, none = route(firsts, [me] * len(ids), me)
    assert all_mine is firsts and len(none) == 0


def test_spans_give_each_sources_first_and_next_offset() -> None:
    sources = [("in", 0), ("in", 2), ("in", 0), ("own", 0), ("in", 2)]
    offsets = [10, 4, 11, 0, 7]
    assert source_spans(sources, offsets) == {
        ("in", 0): (10, 12),
        ("in", 2): (4, 8),
        ("own", 0): (0, 1),
    }


def test_the_window_clock_waits_for_a_lagging_source_but_not_for_an_idle_one() -> None:
    clock = WindowClock()
    clock.read(("in", 0), 1000)
    assert clock.advance() == 1000, "one source: its newest timestamp"
    clock.read(("in", 2), 200)  # a new partition read from its start
    assert clock.advance() == 1000, "never goes back"
    clock.read(("in", 0), 5000)
    assert clock.advance() == 1000, "held back by the lagging source"
    clock.read(("in", 2), 3000)
    assert clock.advance() == 3000
    clock.at_end(("in", 2))  # caught up, nothing more for now
    assert clock.advance() == 5000, "an idle source does not hold the clock"
    clock.read(("in", 2), 4000)  # it gets records again
    clock.read(("in", 0), 9000)
    assert clock.advance() == 5000 and clock.now_ms == 5000
    clock.at_end(("in", 0))
    clock.at_end(("in", 2))
    assert clock.advance() == 9000, "all at their end: the newest read"


def test_an_open_transaction_is_as_old_as_the_stable_offset_has_stood_below_the_end() -> None:
    age = OpenTransactionAge()
    age.observe(0, high=10, stable=10, now=100.0)
    assert age.seconds(100.0) == 0, "all committed"
    age.observe(0, high=14, stable=10, now=101.0)  # a forwarder's transaction opens
    age.observe(0, high=20, stable=10, now=105.0)  # more behind it, the LSO stays
    assert age.seconds(106.0) == 5.0
    age.observe(1, high=3, stable=1, now=106.0)
    assert age.seconds(107.0) == 6.0, "the oldest"
    age.observe(0, high=20, stable=16, now=108.0)  # it ended; the next one is open
    assert age.seconds(108.0) == 2.0, "partition 1's, since 106"
    age.observe(1, high=3, stable=3, now=109.0)
    age.observe(0, high=21, stable=21, now=109.0)
    assert age.seconds(110.0) == 0
    age.observe(0, high=5, stable=-1, now=111.0)  # not known yet
    assert age.seconds(112.0) == 0
