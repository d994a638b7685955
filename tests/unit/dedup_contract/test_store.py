"""The RocksDB window store, against real RocksDB in temporary directories (no Kafka)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from dedup_contract.ids import id_key
from dedup_contract.release import VERSION
from dedup_contract.store import (
    PARALLEL_LOOKUP_MIN,
    MiB,
    Ownership,
    Store,
    StoreConfig,
    StoreError,
    StoreOwner,
    StoreOwnershipError,
    wipe,
)
from dedup_contract.window import WindowPolicy

OWNER = StoreOwner("analytics", "events", 3)
SMALL = StoreConfig(block_cache_bytes=8 * MiB, write_buffer_bytes=1 * MiB, generations=4)
BY_COUNT = WindowPolicy(max_keys=100)  # 25 ids per generation
BY_TIME = WindowPolicy(duration_ms=1000)  # a generation stays open 250 ms


def keys(start: int, stop: int) -> list[bytes]:
    return [id_key(f"id-{i}") for i in range(start, stop)]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(path: Path) -> Iterator[Store]:
    with Store.open(path, OWNER, BY_COUNT, SMALL) as opened:
        yield opened


def reopen(path: Path, window: WindowPolicy = BY_COUNT, owner: StoreOwner = OWNER) -> Store:
    return Store.open(path, owner, window, SMALL)


# --- opening and ownership ---------------------------------------------------------------


def test_new_store_is_empty(store: Store, path: Path) -> None:
    assert store.key_count == 0
    assert store.input_next_offset is None
    assert store.output_next_offset is None
    assert store.oldest_timestamp_ms is None
    assert store.generations == ()
    assert store.owner == OWNER
    assert store.path == path
    assert store.contains_many(keys(0, 3)) == [False, False, False]
    assert store.contains_many([]) == []


@pytest.mark.parametrize(
    "other",
    [
        StoreOwner("analytics", "events", 4),
        StoreOwner("analytics", "clicks", 3),
        StoreOwner("staging", "events", 3),
    ],
)
def test_refuses_a_store_owned_by_another(path: Path, other: StoreOwner) -> None:
    reopen(path).close()
    with pytest.raises(StoreOwnershipError) as refused:
        reopen(path, owner=other)
    message = str(refused.value)
    assert str(OWNER) in message and str(other) in message
    with reopen(path) as store:  # the refusal left the store usable by its owner
        assert store.owner == OWNER


def test_a_store_is_used_only_under_the_ownership_generation_it_was_written_under(
    path: Path,
) -> None:
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(4)) as store:
        store.record_batch(keys(0, 5), 1, input_next_offset=None, output_next_offset=9)
    with pytest.raises(StoreError, match=r"written under ownership.*runs without it"):
        reopen(path)  # a worker without ownership (or of a commit before it: format 1 only)
    with pytest.raises(StoreError, match=r"generation workers=4,reshards=0.*workers=5"):
        Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(5))
    with pytest.raises(StoreError, match=r"generation workers=4,reshards=0.*reshards=1"):
        Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(4, reshards=1))
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(4)) as store:
        assert store.key_count == 5 and store.output_next_offset == 9


def test_a_store_written_before_ownership_is_refused_under_it(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 5), 1, input_next_offset=3, output_next_offset=3)
    with pytest.raises(StoreError, match=r"before ownership.*switched to ownership as a whole"):
        Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(2))
    with reopen(path) as store:
        assert store.key_count == 5


def test_a_store_written_before_ownership_is_switched_once_completed(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 5), 1, input_next_offset=3, output_next_offset=7)
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(2), switch=True) as store:
        assert store.switching and store.output_next_offset == 7
        store.record_batch(keys(100, 103), 2, input_next_offset=None, output_next_offset=None)
        # a crash here: still format 1, switched again at the next start
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(2), switch=True) as store:
        assert store.switching and store.key_count == 8
        store.complete_switch()
        assert not store.switching
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(2)) as store:
        assert not store.switching and store.key_count == 8 and store.output_next_offset == 7
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(2), switch=True) as store:
        assert not store.switching, "switched once; the flag is harmless after"
        with pytest.raises(StoreError, match="not being switched"):
            store.complete_switch()
    with pytest.raises(StoreError, match="written under ownership"):
        reopen(path)


def test_second_open_while_locked_fails_clearly(store: Store, path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open store"):
        reopen(path)


def test_closed_store_refuses_use(path: Path) -> None:
    store = reopen(path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.contains_many(keys(0, 1))
    with pytest.raises(StoreError, match="closed"):
        store.record_batch(keys(0, 1), 0, input_next_offset=None, output_next_offset=None)


def test_unknown_format_is_refused(path: Path) -> None:
    reopen(path).close()
    with Rdict(str(path), Options(raw_mode=True)) as raw:
        raw[b"format"] = b"99"
    with pytest.raises(StoreError, match="format 99"):
        reopen(path)


def test_each_open_records_the_release_that_writes_the_store(path: Path) -> None:
    reopen(path).close()
    with Rdict(str(path), Options(raw_mode=True)) as raw:
        assert raw[b"writer"] == VERSION.encode()
        raw[b"writer"] = b"0.1.9"  # an older release opened it since
    reopen(path).close()
    with Rdict(str(path), Options(raw_mode=True)) as raw:
        assert raw[b"writer"] == VERSION.encode()
        raw[b"format"], raw[b"writer"] = b"7", b"9.0.0"  # a newer release's format
    with pytest.raises(StoreError, match=f"release 9.0.0; this worker is release {VERSION}"):
        reopen(path)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="generations"):
        StoreConfig(generations=1)
    with pytest.raises(ValueError, match="block cache"):
        StoreConfig(block_cache_bytes=1000)
    with pytest.raises(ValueError, match="write buffers"):
        StoreConfig(max_write_buffers=1)
    with pytest.raises(ValueError, match="lookup threads"):
        StoreConfig(lookup_threads=0)


# --- offsets --------------------------------------------------------------------------------


def test_offsets_persist_across_reopen_and_none_leaves_them(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 5), 1000, input_next_offset=10, output_next_offset=7)
        assert (store.input_next_offset, store.output_next_offset) == (10, 7)
        store.record_batch([], 1000, input_next_offset=12, output_next_offset=None)
        assert (store.input_next_offset, store.output_next_offset) == (12, 7)
        store.record_batch(keys(5, 6), 1000, input_next_offset=None, output_next_offset=8)
    with reopen(path) as store:
        assert (store.input_next_offset, store.output_next_offset) == (12, 8)
        assert store.key_count == 6


CRASH_AFTER_WRITE = """
import os, sys
from dedup_contract.ids import id_key
from dedup_contract.store import MiB, Store, StoreConfig, StoreOwner
from dedup_contract.window import WindowPolicy
store = Store.open(sys.argv[1], StoreOwner("analytics", "events", 3), WindowPolicy(max_keys=100),
                   StoreConfig(block_cache_bytes=8 * MiB, write_buffer_bytes=MiB, generations=4))
store.record_batch([id_key(f"id-{i}") for i in range(5)], 1000, input_next_offset=3, output_next_offset=2)
os._exit(0)  # no close, no flush: only the write-ahead log has the batch
"""


def test_write_batch_survives_a_process_crash(path: Path) -> None:
    subprocess.run([sys.executable, "-c", CRASH_AFTER_WRITE, str(path)], check=True, timeout=60)
    with reopen(path) as again:
        assert (again.input_next_offset, again.output_next_offset) == (3, 2)
        assert again.contains_many(keys(0, 6)) == [True] * 5 + [False]


def test_negative_offsets_are_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="negative"):
        store.record_batch([], 0, input_next_offset=-1, output_next_offset=None)


# --- lookups and recording ----------------------------------------------------------------


def test_contains_many_across_generations(store: Store) -> None:
    for start in range(0, 90, 10):
        store.record_batch(
            keys(start, start + 10), 1000 + start, input_next_offset=None, output_next_offset=None
        )
    assert len(store.generations) == 4  # 25 + 25 + 25 + 15
    query = [*keys(85, 95), *keys(0, 3), id_key("never"), *keys(40, 41), *keys(40, 41)]
    assert store.contains_many(query) == [True] * 5 + [False] * 5 + [True] * 3 + [False] + [
        True,
        True,
    ]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_large_batches_are_shared_by_the_lookup_threads(path: Path, threads: int) -> None:
    """Above PARALLEL_LOOKUP_MIN keys the batch is split; answers keep the input order."""
    config = StoreConfig(block_cache_bytes=8 * MiB, write_buffer_bytes=MiB, lookup_threads=threads)
    window = WindowPolicy(max_keys=40_000)
    with Store.open(path, OWNER, window, config) as store:
        for start in range(0, 30_000, 3_000):  # several generations, some flushed
            store.record_batch(
                keys(start, start + 3_000), start, input_next_offset=None, output_next_offset=None
            )
        query = [
            key for n in range(0, 2 * PARALLEL_LOOKUP_MIN + 7) for key in keys(n * 29, n * 29 + 1)
        ]
        expected = [n * 29 < 30_000 for n in range(len(query))]
        assert store.contains_many(query) == expected
        # The absent ones are remembered across the slices: recording them adds exactly them.
        store.record_batch(query, 50_000, input_next_offset=None, output_next_offset=None)
        assert store.key_count == 30_000 + expected.count(False)
        assert all(store.contains_many(query))


def test_record_batch_skips_repeats_and_present_ids(store: Store) -> None:
    store.record_batch(
        keys(0, 10) + keys(0, 10), 1000, input_next_offset=None, output_next_offset=None
    )
    assert store.key_count == 10
    store.record_batch(keys(5, 15), 1000, input_next_offset=None, output_next_offset=None)
    assert store.key_count == 15
    assert store.contains_many(keys(0, 16)) == [True] * 15 + [False]
    # Ids reported absent by contains_many are trusted without a second lookup...
    assert store.contains_many(keys(15, 20)) == [False] * 5
    store.record_batch(keys(15, 20), 1000, input_next_offset=None, output_next_offset=None)
    assert store.key_count == 20
    # ...and a replay of everything (catch-up from the output topic) adds nothing.
    store.record_batch(keys(0, 20), 2000, input_next_offset=None, output_next_offset=None)
    assert store.key_count == 20


def test_key_count_and_generations_persist(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 60), 1000, input_next_offset=None, output_next_offset=None)
        generations = store.generations
        assert [g.keys for g in generations] == [25, 25, 10]
    with reopen(path) as store:
        assert store.generations == generations
        assert store.key_count == 60
        assert store.contains_many(keys(0, 61)) == [True] * 60 + [False]
        store.record_batch(keys(60, 70), 1000, input_next_offset=None, output_next_offset=None)
        assert [g.keys for g in store.generations] == [25, 25, 20]


# --- expiry -------------------------------------------------------------------------------


def test_expire_by_count_drops_oldest_generations(store: Store) -> None:
    for start in range(0, 100, 20):
        store.record_batch(
            keys(start, start + 20), 1000, input_next_offset=None, output_next_offset=None
        )
    assert store.expire(1000) == 0
    assert store.key_count == 100
    store.record_batch(keys(100, 101), 1000, input_next_offset=None, output_next_offset=None)
    assert store.key_count == 101
    assert store.expire(1000) == 25
    assert store.key_count == 76
    found = store.contains_many(keys(0, 101))
    assert found == [False] * 25 + [True] * 76
    # An expired id is new again.
    store.record_batch(keys(0, 1), 1000, input_next_offset=None, output_next_offset=None)
    assert store.contains_many(keys(0, 1)) == [True]
    assert store.key_count == 77


def test_count_bound_holds_for_a_batch_larger_than_the_window(store: Store) -> None:
    store.record_batch(keys(0, 250), 1000, input_next_offset=None, output_next_offset=None)
    assert store.expire(1000) == 150
    assert store.key_count == 100
    assert store.contains_many(keys(0, 250)) == [False] * 150 + [True] * 100


def test_expire_by_time(path: Path) -> None:
    with reopen(path, BY_TIME) as store:
        store.record_batch(keys(0, 10), 1000, input_next_offset=None, output_next_offset=None)
        store.record_batch(keys(10, 20), 1100, input_next_offset=None, output_next_offset=None)
        store.record_batch(
            keys(20, 30), 1300, input_next_offset=None, output_next_offset=None
        )  # rolls over
        store.record_batch(
            keys(30, 40), 1600, input_next_offset=None, output_next_offset=None
        )  # rolls over
        assert [g.keys for g in store.generations] == [20, 10, 10]
        assert store.oldest_timestamp_ms == 1000
        assert store.expire(2100) == 0  # newest id of the first generation is exactly 1000 ms old
        assert store.expire(2101) == 20
        assert store.contains_many(keys(0, 40)) == [False] * 20 + [True] * 20
        assert store.oldest_timestamp_ms == 1300
        assert store.key_count == 20
        assert store.expire(10_000) == 20
        assert store.key_count == 0
        assert store.oldest_timestamp_ms is None
        # After everything expired, recording starts a fresh generation.
        store.record_batch(keys(0, 5), 10_000, input_next_offset=None, output_next_offset=None)
        assert store.contains_many(keys(0, 6)) == [True] * 5 + [False]


def test_reopen_after_expiry(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 130), 1000, input_next_offset=5, output_next_offset=5)
        store.expire(1000)
        kept = store.key_count
        generations = store.generations
    assert kept == 80  # 130 ids in 25-id generations: drop two of six, 80 left
    with reopen(path) as store:
        assert store.key_count == kept
        assert store.generations == generations
        assert store.contains_many(keys(0, 130)) == [False] * 50 + [True] * 80
        store.record_batch(keys(130, 131), 1000, input_next_offset=None, output_next_offset=None)
        assert store.generations[-1] == generations[-1].with_keys(1, 1000)
        assert store.key_count == 81


def test_a_smaller_window_on_reopen_applies_at_the_next_expiry(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 100), 1000, input_next_offset=None, output_next_offset=None)
    with reopen(path, WindowPolicy(max_keys=50)) as store:
        assert store.expire(1000) == 50
        assert store.key_count == 50


# --- reset, wipe, recovery of interrupted writes ------------------------------------------------


def test_reset_forgets_ids_and_offsets_but_keeps_owner(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 60), 1000, input_next_offset=9, output_next_offset=4)
        store.reset()
        assert store.key_count == 0
        assert store.input_next_offset is None and store.output_next_offset is None
        assert store.contains_many(keys(0, 60)) == [False] * 60
        store.record_batch(keys(0, 2), 1000, input_next_offset=None, output_next_offset=1)
    with reopen(path) as store:
        assert store.key_count == 2
        assert (store.input_next_offset, store.output_next_offset) == (None, 1)
    with pytest.raises(StoreOwnershipError):
        reopen(path, owner=StoreOwner("analytics", "events", 0))


def test_wipe_removes_everything(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 10), 1000, input_next_offset=1, output_next_offset=1)
    wipe(path)
    assert not path.exists()
    wipe(path)  # nothing there: fine
    other = StoreOwner("analytics", "events", 0)
    with reopen(path, owner=other) as store:
        assert store.key_count == 0
        assert store.owner == other


def test_open_drops_column_families_the_metadata_does_not_know(path: Path) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 30), 1000, input_next_offset=None, output_next_offset=None)
    with Rdict(str(path), Options(raw_mode=True)) as raw:  # as if a crash hit mid-rollover
        orphan = raw.create_column_family("gen-0000000099", Options(raw_mode=True))
        orphan[b"x" * 16] = b""
        del orphan
    with reopen(path) as store:
        assert store.key_count == 30
        assert store.contains_many([b"x" * 16]) == [False]
    assert "gen-0000000099" not in Rdict.list_cf(str(path))


def test_open_forgets_generations_whose_data_is_gone(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with reopen(path) as store:
        store.record_batch(keys(0, 30), 1000, input_next_offset=None, output_next_offset=None)
        first = store.generations[0].number
    families = Rdict.list_cf(str(path))
    with Rdict(
        str(path),
        Options(raw_mode=True),
        column_families={n: Options(raw_mode=True) for n in families},
    ) as raw:
        raw.drop_column_family(f"gen-{first:010d}")
    with caplog.at_level(logging.WARNING), reopen(path) as store:
        assert store.key_count == 5
        assert store.contains_many(keys(0, 30)) == [False] * 25 + [True] * 5
    assert "forgetting 25 ids" in caplog.text


def test_disk_bytes_and_compaction(path: Path) -> None:
    with reopen(path, WindowPolicy(max_keys=10_000)) as store:
        for start in range(0, 2000, 500):
            store.record_batch(
                keys(start, start + 500), 1000, input_next_offset=None, output_next_offset=None
            )
        assert store.disk_bytes() > 0
        store.compact()
        compacted = store.disk_bytes()
        assert 0 < compacted < 2000 * 64
        assert store.contains_many(keys(1990, 2010)) == [True] * 10 + [False] * 10


def test_wipe_refuses_an_open_store(store: Store, path: Path) -> None:
    store.record_batch(keys(0, 3), 1000, input_next_offset=None, output_next_offset=None)
    with pytest.raises(StoreError, match="cannot wipe"):
        wipe(path)
    assert store.contains_many(keys(0, 3)) == [True] * 3


def test_record_batch_known_new_skips_the_lookup_and_counts_exactly(store: Store) -> None:
    batch = keys(0, 10)
    store.record_batch(batch, 1, input_next_offset=10, output_next_offset=10, known_new=True)
    assert store.key_count == 10
    assert store.contains_many(batch) == [True] * 10


def _format_on_disk(path: Path) -> bytes | None:
    """The format record as RocksDB holds it, read without Store (read-only, default
    column family)."""
    from rocksdict import AccessType, Rdict

    db = Rdict(str(path), access_type=AccessType.read_only())
    try:
        value = db.get(b"format")
        return value if isinstance(value, bytes) or value is None else bytes(value)
    finally:
        db.close()


def test_a_finalized_worker_marks_the_store_format_3_and_it_stays(path: Path) -> None:
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(4)) as store:
        store.record_batch(keys(0, 5), 1, input_next_offset=None, output_next_offset=9)
    assert _format_on_disk(path) == b"2", "until the upgrade is finalized: the old format"
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(4), finalized=True) as store:
        assert store.key_count == 5 and store.output_next_offset == 9
    assert _format_on_disk(path) == b"3"
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(4)) as store:
        assert store.key_count == 5, "a format-3 store opens without the flag too"
    assert _format_on_disk(path) == b"3", "and is never written back"


def test_a_store_of_another_owner_is_not_marked_by_a_finalized_worker(path: Path) -> None:
    with Store.open(path, OWNER, BY_COUNT, SMALL, Ownership(4)):
        pass
    other = StoreOwner(OWNER.namespace, OWNER.pipeline, OWNER.partition + 1)
    with pytest.raises(StoreOwnershipError):
        Store.open(path, other, BY_COUNT, SMALL, Ownership(4), finalized=True)
    assert _format_on_disk(path) == b"2"
