"""Per-batch decisions: dead letters, in-batch repeats, window hits (no Kafka, no RocksDB)."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from dedup_contract import ids
from dedup_contract.batch import Record, select_new, triage
from dedup_contract.ids import IdSpec, InvalidRecord, extract_id, id_key
from support.id_corpus import BAD_ID_BYTES, FAST_PATH_CORPUS, MALFORMED_JSON, PLAIN_JSON_CASES


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


def replay(
    records: list[Record], spec: IdSpec
) -> tuple[list[tuple[int, str]], int, list[tuple[int, str]], int]:
    """The oracle: each record on its own through the full rules (`extract_id`), its key
    hashed here, first occurrences kept in order; no fast path."""
    firsts: list[tuple[int, str]] = []
    dead: list[tuple[int, str]] = []
    seen: set[bytes] = set()
    repeats = 0
    for record in records:
        try:
            message_id = extract_id(spec, record.key(), record.value(), record.headers())
        except InvalidRecord as invalid:
            dead.append((record.offset(), invalid.reason))
            continue
        key = hashlib.blake2b(message_id.encode(), digest_size=16).digest()
        if key in seen:
            repeats += 1
        else:
            seen.add(key)
            firsts.append((record.offset(), message_id))
    newest = max([0, *(record.timestamp()[1] for record in records)])
    return firsts, repeats, dead, newest


@pytest.mark.parametrize("seed", range(40))
def test_triage_is_the_record_by_record_replay(seed: int) -> None:
    """Batches of plain ids (decided at once), with repeats, and batches mixing in ids
    the fast path defers (an integer, a non-ASCII id) and records without an id (dead
    letters): triage's split equals the replay's, whichever path it took."""
    rng = random.Random(seed)
    plain_only = seed % 2 == 0
    odd = [
        b'{"messageId": 42}',
        '{"messageId": "zürich"}'.encode(),
        b'{"messageId": ""}',
        b"{not json",
        None,
        b'{"other": 1}',
        b'{"messageId": "a", "messageId": "b"}',
    ]
    records = []
    for offset in range(rng.randint(0, 60)):
        if not plain_only and rng.random() < 0.2:
            value = rng.choice(odd)
        else:
            value = event(f"id-{rng.randrange(25)}")
        records.append(
            Record(offset, None, value, None, rng.choice([-1, 0, 5, 1_000 + rng.randrange(99)]))
        )
    split = triage(records, IdSpec())
    firsts, repeats, dead, newest = replay(records, IdSpec())
    assert [(c.record.offset(), c.message_id) for c in split.firsts] == firsts
    assert [c.key for c in split.firsts] == [id_key(m) for _, m in firsts]
    assert split.firsts.utf8_ids == [m.encode() for _, m in firsts]
    assert split.repeats == repeats
    assert [(d.record.offset(), d.reason) for d in split.dead_letters] == dead
    assert split.newest_ms == newest


def test_firsts_where_keeps_rows_together() -> None:
    split = triage([rec(0, event("a")), rec(1, event("b")), rec(2, event("c"))], IdSpec())
    kept = split.firsts.where([True, False, True])
    assert [(c.record.offset(), c.message_id, c.key) for c in kept] == [
        (0, "a", id_key("a")),
        (2, "c", id_key("c")),
    ]
    assert kept.utf8_ids == [b"a", b"c"]
    with pytest.raises(ValueError):
        split.firsts.where([True])


def test_store_keys_are_hashed_only_for_the_rows_kept() -> None:
    # A worker hashes the ids it owns, not those it forwards: `where` before `keys`
    # carries no keys, and the kept rows' keys are the ids' own.
    split = triage([rec(0, event("a")), rec(1, event("b")), rec(2, event("a"))], IdSpec())
    assert split.repeats == 1  # found by the ids' bytes, before any key exists
    assert split.firsts.computed_keys is None
    kept = split.firsts.where([False, True])
    assert kept.computed_keys is None
    assert kept.keys == [id_key("b")]
    assert kept.computed_keys == [id_key("b")]  # computed once
    assert split.firsts.keys == [id_key("a"), id_key("b")]
    assert split.firsts.where([True, False]).computed_keys == [id_key("a")]


def random_bytes(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(12)))


def mutated(rng: random.Random, value: bytes) -> bytes:
    """`value` with one byte changed, dropped or doubled."""
    at = rng.randrange(len(value))
    changed = value[:at] + bytes([rng.randrange(256)]) + value[at + 1 :]
    return rng.choice([changed, value[:at] + value[at + 1 :], value[: at + 1] + value[at:]])


SOURCES = [IdSpec(), IdSpec("header", "event-id"), IdSpec("key")]
GOOD_IDS = ["id-1", "id-2", "id-3", "zürich", "東京", "x" * 512, "a b "]


def odd_value(rng: random.Random, spec: IdSpec) -> bytes | None:
    """A value (of the record's id source) from the corpus, random bytes, or a good one
    mutated: mostly not an id."""
    if spec.source == "jsonField":
        corpus: list[bytes | None] = [*MALFORMED_JSON[:-2], *FAST_PATH_CORPUS, *PLAIN_JSON_CASES]
        good = json.dumps({"messageId": rng.choice(GOOD_IDS)}).encode()
    else:
        corpus = list(BAD_ID_BYTES)
        good = rng.choice(GOOD_IDS).encode()
    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice(corpus)
    return random_bytes(rng) if kind == 1 else mutated(rng, good)


def record_of(
    offset: int, spec: IdSpec, found: bytes | None, rng: random.Random, good: bool
) -> Record:
    """A record whose id source holds `found` (the other parts random); unless `good`, a
    header source may lack the header."""
    stamp = rng.choice([-1, 0, 1_000 + offset])
    if spec.source == "jsonField":
        return Record(offset, random_bytes(rng), found, None, stamp)
    if spec.source == "key":
        return Record(offset, found, random_bytes(rng), None, stamp)
    others: list[tuple[str, bytes | None]] = [("other", random_bytes(rng))]
    layout = rng.choice([0, 1, 3] if good else [0, 1, 2, 3])
    if layout == 0:  # an earlier header of the name, overridden by the last
        headers = [("event-id", b"earlier"), *others, ("event-id", found)]
    elif layout == 1:  # a name that differs in case only: not the header
        headers = [("Event-Id", b"x"), ("event-id", found)]
    elif layout == 2:  # no header of the name, or none at all
        return Record(offset, None, None, rng.choice([None, [], others]), stamp)
    else:
        headers = [*others, ("event-id", found)]
    return Record(offset, None, None, headers, stamp)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("spec", SOURCES, ids=lambda s: s.source)
def test_every_source_triages_a_batch_as_the_replay_with_random_bytes(
    spec: IdSpec, seed: int
) -> None:
    """The batch paths (`plain_json_ids`, `plain_key_ids`, `plain_header_ids`) against
    the rules record by record, for each id source: batches of good ids with repeats
    (decided at once) and batches mixing in the id rules' corpus, random bytes and good
    ids with a byte changed (decided record by record). The split equals the replay's."""
    rng = random.Random(seed)
    good_only = seed % 2 == 0
    records = []
    for offset in range(rng.randint(0, 40)):
        if not good_only and rng.random() < 0.3:
            found = odd_value(rng, spec)
        else:
            message_id = rng.choice(GOOD_IDS)
            found = (
                json.dumps({"messageId": message_id, "n": offset}).encode()
                if spec.source == "jsonField"
                else message_id.encode()
            )
        records.append(record_of(offset, spec, found, rng, good_only))
    split = triage(records, spec)
    firsts, repeats, dead, newest = replay(records, spec)
    assert [(c.record.offset(), c.message_id) for c in split.firsts] == firsts
    assert [c.key for c in split.firsts] == [id_key(m) for _, m in firsts]
    assert split.repeats == repeats
    assert [(d.record.offset(), d.reason) for d in split.dead_letters] == dead
    assert split.newest_ms == newest
    if good_only and spec.source != "jsonField":
        batch = (
            ids.plain_key_ids([r.key() for r in records])
            if spec.source == "key"
            else ids.plain_header_ids(spec.field, [r.headers() for r in records])
        )
        assert batch == [extract(spec, r) for r in records]  # the fast path was taken


def extract(spec: IdSpec, record: Record) -> str:
    return extract_id(spec, record.key(), record.value(), record.headers())
