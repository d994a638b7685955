"""The backfill's rule (spark/dedup_spark/backfill.py), pure: the worker's semantics."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dedup_contract.batch import DLQ_REASON, dead_letter_headers
from dedup_contract.ids import ID_HEADER, IdSpec, id_key
from dedup_contract.store import Store, StoreConfig, StoreOwner
from dedup_contract.window import WindowPolicy, WindowState
from dedup_spark.backfill import Published, SourceRecord, first_occurrences

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
        WindowPolicy(1000),
    )
    assert [(p.record.offset, p.message_id) for p in published] == [(0, "a"), (1, "b"), (4, "c")]
    assert [(r.record.offset, r.reason) for r in rejected] == [(3, "not_json")]


def test_a_repeat_after_the_window_is_published_again_as_the_worker_expires() -> None:
    """The worker looks a batch's ids up before it expires at that batch's timestamp: the
    repeat at 1300 still finds `a` (expired only after that batch), the one at 1500 not."""
    records = [rec(0, "a", 0), rec(1, "a", 500), rec(2, "a", 1300), rec(3, "a", 1500)]
    published, _ = first_occurrences(records, SPEC, WindowPolicy(1000))
    assert [p.record.offset for p in published] == [0, 3]  # the drop at 500 does not renew
    published, _ = first_occurrences(records, SPEC, None)
    assert [p.record.offset for p in published] == [0]


def test_the_window_keeps_an_id_up_to_a_quarter_longer() -> None:
    # 4 generations of 250 ms: `a` (at 0) is in the first, which goes once its newest id
    # is older than 1000 ms; `b` at 240 keeps that generation alive until 1240.
    records = [rec(0, "a", 0), rec(1, "b", 240), rec(2, "c", 1100), rec(3, "a", 1200)]
    published, _ = first_occurrences(records, SPEC, WindowPolicy(1000))
    assert [p.record.offset for p in published] == [0, 1, 2]  # `a` at 1200: still held
    records[3] = rec(3, "a", 1300)
    published, _ = first_occurrences(records, SPEC, WindowPolicy(1000))
    assert [p.record.offset for p in published] == [0, 1, 2]  # expired after, not before
    records.append(rec(4, "a", 1310))
    published, _ = first_occurrences(records, SPEC, WindowPolicy(1000))
    assert [p.record.offset for p in published] == [0, 1, 2, 4]


def test_max_keys_drops_the_oldest_generation() -> None:
    # maxKeys 4 over 4 generations: one id per generation; the 5th id drops the first.
    records = [rec(i, f"id-{i}", i) for i in range(5)] + [rec(5, "id-0", 6), rec(6, "id-1", 7)]
    published, _ = first_occurrences(records, SPEC, WindowPolicy(None, 4))
    # id-0 was dropped when id-4 came; id-0 again then drops id-1 ... and so on.
    assert [p.record.offset for p in published] == [0, 1, 2, 3, 4, 5, 6]
    published, _ = first_occurrences(records, SPEC, WindowPolicy(None, 8))
    assert [p.record.offset for p in published] == [0, 1, 2, 3, 4]


def test_batches_decide_as_the_workers_do() -> None:
    # In one batch the repeat is dropped inside it; its window clock is the batch's newest.
    records = [rec(0, "a", 0), rec(1, "a", 5000), rec(2, "b", 5001)]
    one, _ = first_occurrences(records, SPEC, WindowPolicy(1000), batch_size=1)
    assert [p.record.offset for p in one] == [0, 2]  # `a` at 5000 still held (lookup first)
    together, _ = first_occurrences(records, SPEC, WindowPolicy(1000), batch_size=3)
    assert [p.record.offset for p in together] == [0, 2]


@pytest.mark.parametrize("seed", range(4))
def test_the_in_memory_window_keeps_what_the_workers_store_keeps(seed: int, tmp_path: Path) -> None:
    """`WindowState` (the backfill's) against the worker's RocksDB `Store`, batch by
    batch as the worker drives it: the same lookups, the same ids expired."""
    rng = random.Random(seed)
    duration = rng.choice([None, 1000, 5000])
    policy = WindowPolicy(duration, rng.choice([7, 40] if duration is None else [None, 7, 40]))
    config = StoreConfig()
    state = WindowState(policy, config.generations)
    now = 0
    with Store.open(tmp_path / "s", StoreOwner("ns", "p", 0), policy, config) as store:
        for _ in range(150):
            now += rng.choice([0, 10, 100, 400])
            keys = list({id_key(f"id-{rng.randrange(60)}") for _ in range(rng.randint(1, 6))})
            present = store.contains_many(keys)
            assert present == [k in state for k in keys]
            new = [k for k, hit in zip(keys, present, strict=True) if not hit]
            store.record_batch(
                new, now, input_next_offset=None, output_next_offset=None, known_new=True
            )
            state.record(new, now)
            assert store.expire(now) == state.expire(now)
            assert store.generations == state.live


def test_output_headers_are_the_inputs_plus_the_id() -> None:
    item = Published(rec(0, "a", headers=[("trace", b"t1")]), "a")
    assert item.headers() == [("trace", b"t1"), (ID_HEADER, b"a")]


def test_dead_letter_headers_say_why_and_where_from() -> None:
    headers = dict(dead_letter_headers([("x", b"1")], "not_json", "bad", "in", 3, 17))
    assert headers[DLQ_REASON] == b"not_json"
    assert headers["dedup.origin.partition"] == b"3" and headers["dedup.origin.offset"] == b"17"
    assert headers["x"] == b"1"


# --- under ownership (issue 26) -----------------------------------------------------------


def test_each_id_is_decided_by_its_owner_whatever_its_input_partition() -> None:
    """An id on two input partitions is published once, by its owner, to its partition;
    a record without an id is dead-lettered by the worker that reads its partition."""
    from dedup_contract.ownership import owner_reference
    from dedup_spark.backfill import by_owner

    workers = 3
    records = [
        rec(0, "a", 0)._replace(partition=0),
        rec(0, "a", 5)._replace(partition=1),
        rec(1, "b", 6)._replace(partition=1),
        rec(1, None, 7)._replace(partition=0),
        rec(2, "b", 8)._replace(partition=3),
    ]
    decided = by_owner(records, SPEC, WindowPolicy(1000), workers=workers)
    published = {
        p.message_id: (w, p.record.partition) for w, (pubs, _) in decided.items() for p in pubs
    }
    assert published == {
        "a": (owner_reference(b"a", workers), 0),  # the first the owner met, by time
        "b": (owner_reference(b"b", workers), 1),
    }
    dead = [(w, r.record.partition, r.reason) for w, (_, rej) in decided.items() for r in rej]
    assert dead == [(0, 0, "not_json")]


def test_a_worker_meets_each_input_partition_in_offset_order() -> None:
    from dedup_spark.backfill import met_order

    records = [
        rec(0, "x", 50)._replace(partition=1),
        rec(1, "y", 10)._replace(partition=1),  # an older timestamp at a later offset
        rec(0, "z", 20)._replace(partition=0),
    ]
    order = [(r.partition, r.offset) for r in met_order(records)]
    assert order.index((1, 0)) < order.index((1, 1))
    assert order[0] == (0, 0)
