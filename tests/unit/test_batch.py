"""Per-batch decisions: dead letters, in-batch repeats, window hits (no Kafka, no RocksDB)."""

from __future__ import annotations

import json

import pytest

from dedup_worker.batch import Record, select_new, triage
from dedup_worker.ids import IdSpec, id_key


def rec(offset: int, value: bytes | None, key: bytes | None = None) -> Record:
    return Record(offset, key, value, None, 1000 + offset)


def event(message_id: str) -> bytes:
    return json.dumps({"messageId": message_id, "payload": "x"}).encode()


def test_triage_keeps_first_occurrence_in_input_order_and_counts_repeats() -> None:
    records = [
        rec(0, event("a")),
        rec(1, event("b")),
        rec(2, event("a")),
        rec(3, event("c")),
        rec(4, event("b")),
    ]
    split = triage(records, IdSpec())
    assert [c.message_id for c in split.firsts] == ["a", "b", "c"]
    assert [c.record.offset() for c in split.firsts] == [0, 1, 3]
    assert split.repeats == 2
    assert split.dead_letters == []
    assert split.firsts[0].key == id_key("a")


def test_triage_routes_records_without_a_valid_id_to_dead_letters_with_reason() -> None:
    records = [
        rec(0, b"{not json"),
        rec(1, event("ok")),
        rec(2, json.dumps({"other": 1}).encode()),
        rec(3, None),
    ]
    split = triage(records, IdSpec())
    assert [c.message_id for c in split.firsts] == ["ok"]
    assert [(d.record.offset(), d.reason) for d in split.dead_letters] == [
        (0, "not_json"),
        (2, "missing_id"),
        (3, "null_value"),
    ]
    assert all(d.detail for d in split.dead_letters)


def test_select_new_drops_ids_the_window_holds() -> None:
    split = triage([rec(0, event("a")), rec(1, event("b")), rec(2, event("c"))], IdSpec())
    new = select_new(split.firsts, [False, True, False])
    assert [c.message_id for c in new] == ["a", "c"]


def test_select_new_rejects_mismatched_lookup() -> None:
    split = triage([rec(0, event("a"))], IdSpec())
    with pytest.raises(ValueError):
        select_new(split.firsts, [])


def test_key_source_uses_record_key() -> None:
    split = triage(
        [rec(0, b"anything", key=b"k1"), rec(1, b"other", key=b"k1")], IdSpec(source="key")
    )
    assert [c.message_id for c in split.firsts] == ["k1"]
    assert split.repeats == 1
