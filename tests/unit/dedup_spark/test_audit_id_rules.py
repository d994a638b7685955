"""Each rule over ids alone (spark/dedup_spark/audit_rules.py), on a frame from source
matching (audit_matching.py); the whole audit against the oracle is in test_audit.py and
test_audit_ownership.py."""

from __future__ import annotations

import pyarrow as pa

from dedup_spark.audit_matching import IdColumns, MatchedIds, match_ids
from dedup_spark.audit_model import (
    CONTENT_MISMATCH,
    DUPLICATE,
    MISPLACED,
    MISSING,
    UNEXPECTED,
    UNVERIFIABLE,
    AuditRange,
    Forwarded,
    InputRecord,
    OutputRecord,
    Retention,
)
from dedup_spark.audit_result import AuditResult
from dedup_spark.audit_rules import (
    content_mismatches,
    count_input,
    count_published,
    duplicates,
    misplaced,
    missing,
    order_sources,
    unaccounted,
    unexpected,
    unverifiable,
)
from dedup_spark.murmur2 import owners

W = 1_000  # window, ms


def frame(
    inputs: list[InputRecord],
    outputs: list[OutputRecord],
    forwarded: list[Forwarded] | None = None,
    *,
    workers: int | None = None,
    audit_range: AuditRange | None = None,
    committed: dict[int, int] | None = None,
) -> MatchedIds:
    return match_ids(
        IdColumns.of_records(inputs, outputs, forwarded or []),
        workers=workers,
        audit_range=audit_range or AuditRange(),
        committed=committed,
    )


def owner(mid: str, workers: int) -> int:
    return int(owners(pa.array([mid]), workers)[0])


def test_matching_orders_both_sides_and_names_each_publications_input_row() -> None:
    m = frame(
        [InputRecord(1, 20, "b", partition=1), InputRecord(0, 10, "a"), InputRecord(5, 30, None)],
        [OutputRecord(1, 20, "b"), OutputRecord(0, 10, "a"), OutputRecord(2, 99, "a")],
    )
    assert m.input_partition.tolist() == [0, 1] and m.input_offset.tolist() == [0, 1]
    assert m.input_id.to_pylist() == ["a", "b"]  # the invalid input is not matched
    assert m.output_offset.tolist() == [0, 1, 2]
    assert m.output_source.tolist() == [0, 1, -1]  # no input "a" at 99 ms
    assert m.output_in_range.tolist() == [True, True, True]


def test_matching_marks_committed_and_forwarded_input_pending() -> None:
    inputs = [InputRecord(o, 10 * o, f"id-{o}") for o in range(4)]
    m = frame(inputs, [], [Forwarded("id-1", 0, 1)], committed={0: 3})
    assert m.input_pending.tolist() == [False, True, False, True]
    assert m.input_checked.tolist() == [True, False, True, False]


def test_matching_prefers_the_occurrence_whose_contents_were_published() -> None:
    inputs = [InputRecord(0, 10, "a", digest=1), InputRecord(0, 10, "a", digest=2, partition=1)]
    m = frame(inputs, [OutputRecord(0, 10, "a", digest=2)])
    assert m.output_source.tolist() == [1]


def test_unexpected_is_a_checked_publication_without_input() -> None:
    m = frame(
        [InputRecord(0, 10, "a")],
        [OutputRecord(0, 10, "a"), OutputRecord(1, 20, "ghost"), OutputRecord(2, 30, None)],
    )
    hits = unexpected(m)
    assert hits.rows.tolist() == [False, True, True]
    assert [(f.kind, f.id, f.offset) for f in hits.findings] == [
        (UNEXPECTED, "ghost", 1),
        (UNEXPECTED, None, 2),
    ]
    outside = frame(
        [InputRecord(0, 10, "a")],
        [OutputRecord(0, 5_000, "ghost")],
        audit_range=AuditRange(0, 1_000),
    )
    assert unexpected(outside).findings == []


def test_a_duplicate_is_a_repeat_within_the_window_on_any_partition() -> None:
    m = frame(
        [InputRecord(0, 0, "a"), InputRecord(1, 500, "a"), InputRecord(2, 2_000, "a")],
        [
            OutputRecord(0, 0, "a"),
            OutputRecord(0, 500, "a", partition=1),  # 500 ms after: a duplicate
            OutputRecord(1, 2_000, "a"),  # 1500 ms after: outside the window
        ],
    )
    hits = duplicates(m, window_ms=W)
    assert [(f.kind, f.partition, f.offset, f.detail) for f in hits.findings] == [
        (DUPLICATE, 1, 0, "published 500 ms after the last time")
    ]
    assert duplicates(m, window_ms=3_000).rows.sum() == 2


def test_misplaced_is_a_publication_off_its_owner_and_unchecked_without_workers() -> None:
    home = owner("a", 3)
    away = (home + 1) % 3
    inputs = [InputRecord(0, 0, "a")]
    outputs = [OutputRecord(0, 0, "a", partition=away)]
    hits = misplaced(frame(inputs, outputs, workers=3))
    assert [(f.kind, f.partition, f.detail) for f in hits.findings] == [
        (MISPLACED, away, f"on output partition {away}, its owner is {home} of 3")
    ]
    placed = [OutputRecord(0, 0, "a", partition=home)]
    assert misplaced(frame(inputs, placed, workers=3)).findings == []
    assert misplaced(frame(inputs, outputs, workers=None)).findings == []


def test_a_content_mismatch_differs_from_every_occurrence_with_its_id_and_time() -> None:
    inputs = [InputRecord(0, 10, "a", digest=1), InputRecord(0, 10, "a", digest=2, partition=1)]
    changed = content_mismatches(frame(inputs, [OutputRecord(0, 10, "a", digest=3)]))
    assert [(f.kind, f.offset) for f in changed.findings] == [(CONTENT_MISMATCH, 0)]
    assert "(first: 0:0)" in changed.findings[0].detail
    same = content_mismatches(frame(inputs, [OutputRecord(0, 10, "a", digest=2)]))
    assert same.findings == []
    unknown = [InputRecord(0, 10, "a"), InputRecord(0, 10, "a", digest=2, partition=1)]
    assert content_mismatches(frame(unknown, [OutputRecord(0, 10, "a", digest=3)])).findings == []


def test_unaccounted_input_has_no_publication_of_its_id_within_reach() -> None:
    inputs = [
        InputRecord(0, 0, "a"),  # published
        InputRecord(1, 300, "a"),  # accounted for by the publication at 0 ms
        InputRecord(2, 5_000, "a"),  # too far from it
        InputRecord(3, 100, "b"),  # never published
    ]
    m = frame(inputs, [OutputRecord(0, 0, "a")])
    assert unaccounted(m, reach_ms=W).tolist() == [False, False, True, True]
    assert unaccounted(m, reach_ms=6_000).tolist() == [False, False, False, True]


def test_a_later_offset_of_the_same_partition_does_not_account_for_an_earlier_one() -> None:
    inputs = [InputRecord(0, 0, "a"), InputRecord(1, 10, "a"), InputRecord(0, 20, "a", partition=1)]
    later = frame(inputs[:2], [OutputRecord(0, 10, "a")])
    assert unaccounted(later, reach_ms=W).tolist() == [True, False]
    elsewhere = frame([inputs[0], inputs[2]], [OutputRecord(0, 20, "a")])
    assert unaccounted(elsewhere, reach_ms=W).tolist() == [False, False]


def test_missing_says_whether_the_id_was_published_at_all() -> None:
    m = frame(
        [InputRecord(0, 0, "a"), InputRecord(1, 5_000, "a"), InputRecord(2, 9, "b")],
        [OutputRecord(0, 0, "a")],
    )
    hits = missing(m, unaccounted(m, reach_ms=W))
    assert [(f.kind, f.id, f.offset, f.detail) for f in hits.findings] == [
        (MISSING, "a", 1, "not published within the window"),
        (MISSING, "b", 2, "not published"),
    ]


def test_unverifiable_is_unaccounted_input_whose_publication_may_be_deleted() -> None:
    home = owner("a", 2)
    m = frame([InputRecord(0, 100, "a"), InputRecord(1, 9_000, "a")], [], workers=2)
    lost = unaccounted(m, reach_ms=W)
    deleted = {home: Retention(output_start=5, output_first_ms=5_000)}
    hits = unverifiable(m, lost, reach_ms=W, retention=deleted)
    assert hits.rows.tolist() == [True, False]
    assert [(f.kind, f.offset) for f in hits.findings] == [(UNVERIFIABLE, 0)]
    assert "(oldest retained output record: 5000)" in hits.findings[0].detail
    other = {1 - home: Retention(output_start=5, output_first_ms=5_000)}
    assert unverifiable(m, lost, reach_ms=W, retention=other).findings == []
    assert unverifiable(m, lost, reach_ms=W, retention={}).findings == []


def test_order_sources_leave_out_unexpected_and_duplicate_publications() -> None:
    m = frame(
        [InputRecord(0, 0, "a"), InputRecord(1, 100, "a", partition=1)],
        [OutputRecord(0, 0, "a"), OutputRecord(1, 100, "a"), OutputRecord(2, 5, "ghost")],
    )
    sources = order_sources(m, unexpected=unexpected(m), duplicates=duplicates(m, window_ms=W))
    assert sources.to_pylist() == [
        {
            "partition": 0,
            "offset": 0,
            "timestamp_ms": 0,
            "id": "a",
            "source_partition": 0,
            "source_offset": 0,
            "checked": True,
        }
    ]


def test_counts_of_published_and_checked_input() -> None:
    m = frame(
        [
            InputRecord(0, 0, "a"),
            InputRecord(1, 10, "a"),
            InputRecord(0, 20, "a", partition=1),
            InputRecord(2, 30, "b"),
        ],
        [OutputRecord(0, 0, "a", partition=1)],
        committed={0: 2, 1: 5},
    )
    result = AuditResult()
    count_published(m, result)
    count_input(m, result)
    assert dict(result.counts[0]) == {"input": 2, "valid": 2, "distinct": 1, "pending": 1}
    assert dict(result.counts[1]) == {"published": 1, "input": 1, "valid": 1, "distinct": 1}
    assert result.distinct_ids == 1
