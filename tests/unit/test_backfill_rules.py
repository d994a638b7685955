"""The backfill's rule (spark/dedup_spark/backfill.py), pure: the worker's semantics."""

from __future__ import annotations

import json

from dedup_spark.backfill import Published, SourceRecord, first_occurrences
from dedup_worker.batch import DLQ_REASON, dead_letter_headers
from dedup_worker.ids import ID_HEADER, IdSpec

SPEC = IdSpec("jsonField", "messageId")


def rec(
    offset: int, mid: str | None, ts: int = 0, headers: list[tuple[str, bytes | None]] | None = None
) -> SourceRecord:
    value = b"{oops" if mid is None else json.dumps({"messageId": mid}).encode()
    return SourceRecord(offset, ts, None, value, headers)


def test_the_first_occurrence_wins_and_invalid_records_are_dead_letters() -> None:
    published, rejected = first_occurrences(
        [rec(0, "a"), rec(1, "b"), rec(2, "a"), rec(3, None), rec(4, "c"), rec(5, "b")],
        SPEC,
        window_ms=1000,
    )
    assert [(p.record.offset, p.message_id) for p in published] == [(0, "a"), (1, "b"), (4, "c")]
    assert [(r.record.offset, r.reason) for r in rejected] == [(3, "not_json")]


def test_a_repeat_after_the_window_is_published_again() -> None:
    records = [rec(0, "a", 0), rec(1, "a", 500), rec(2, "a", 1200), rec(3, "a", 1500)]
    published, _ = first_occurrences(records, SPEC, window_ms=1000)
    assert [p.record.offset for p in published] == [0, 2]  # the drop at 500 does not renew
    published, _ = first_occurrences(records, SPEC, window_ms=None)
    assert [p.record.offset for p in published] == [0]


def test_output_headers_are_the_inputs_plus_the_id() -> None:
    item = Published(rec(0, "a", headers=[("trace", b"t1")]), "a")
    assert item.headers() == [("trace", b"t1"), (ID_HEADER, b"a")]


def test_dead_letter_headers_say_why_and_where_from() -> None:
    headers = dict(dead_letter_headers([("x", b"1")], "not_json", "bad", "in", 3, 17))
    assert headers[DLQ_REASON] == b"not_json"
    assert headers["dedup.origin.partition"] == b"3" and headers["dedup.origin.offset"] == b"17"
    assert headers["x"] == b"1"
