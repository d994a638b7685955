"""The store's on-disk format, without RocksDB: its records round-trip, and opening refuses
a store of another format, pipeline or ownership generation (test_store.py opens real
stores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedup_contract import store, store_format
from dedup_contract.release import VERSION
from dedup_contract.store_format import (
    FORMAT_KEY,
    FORMAT_VERSION,
    FORMAT_VERSION_FINALIZED,
    FORMAT_VERSION_OWNED,
    INPUT_OFFSET_KEY,
    NEXT_GENERATION_KEY,
    OUTPUT_OFFSET_KEY,
    OWNER_KEY,
    OWNERSHIP_KEY,
    Opening,
    Ownership,
    StoreError,
    StoreOwner,
    StoreOwnershipError,
)
from dedup_contract.window import Generation

PATH = Path("/data/store")
OWNER = StoreOwner("analytics", "events", 3)
OWNED = Ownership(workers=4)


def created(owner: StoreOwner = OWNER, ownership: Ownership | None = None) -> dict[bytes, bytes]:
    return dict(store_format.initial_records(owner, ownership))


# --- records ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "generation",
    [Generation(0, 1, 2, 3, 4), Generation(2**40, -5, 0, 2**62, 0), Generation.opened(7, 99)],
)
def test_a_generation_record_round_trips(generation: Generation) -> None:
    key = store_format.generation_key(generation.number)
    assert store_format.is_generation_key(key)
    value = store_format.encode_generation(generation)
    assert store_format.decode_generation(key, value) == generation


def test_the_next_generation_key_is_not_a_generation_record() -> None:
    assert NEXT_GENERATION_KEY.startswith(store_format.GENERATION_PREFIX)
    assert not store_format.is_generation_key(NEXT_GENERATION_KEY)


def test_the_column_family_names_are_unchanged() -> None:
    """They are on disk: a changed name would orphan every store's generations."""
    assert store_format.family_name(0) == "gen-0000000000"
    assert store_format.family_name(42) == "gen-0000000042"
    assert store_format.is_generation_family("gen-0000000042")
    assert not store_format.is_generation_family("default")


@pytest.mark.parametrize("offset", [0, 1, 2**63 - 1])
def test_an_offset_round_trips(offset: int) -> None:
    raw = store_format.encode_offset(offset)
    assert len(raw) == 8
    assert store_format.decode_offset(raw) == offset
    assert store_format.decode_offset(None) is None


def test_a_negative_offset_is_refused() -> None:
    store_format.check_offset("input", None)
    store_format.check_offset("input", 0)
    with pytest.raises(ValueError, match="input offset must not be negative"):
        store_format.check_offset("input", -1)


def test_the_owner_record_round_trips_and_is_stable() -> None:
    raw = store_format.encode_owner(OWNER)
    assert raw == b'{"namespace": "analytics", "partition": 3, "pipeline": "events"}'
    assert store_format.decode_owner(raw, PATH) == OWNER


@pytest.mark.parametrize("raw", [None, b"", b"not json", b'{"namespace": "a"}', b"[1]"])
def test_an_unreadable_owner_record_is_refused(raw: bytes | None) -> None:
    with pytest.raises(StoreError, match="unreadable owner record"):
        store_format.decode_owner(raw, PATH)


def test_read_recorded_decodes_offsets_and_generations() -> None:
    first, second = Generation(3, 10, 10, 20, 5), Generation(1, 0, 0, 9, 2)
    meta = {
        **created(),
        INPUT_OFFSET_KEY: store_format.encode_offset(12),
        OUTPUT_OFFSET_KEY: store_format.encode_offset(34),
        NEXT_GENERATION_KEY: store_format.encode_offset(2),
        store_format.generation_key(3): store_format.encode_generation(first),
        store_format.generation_key(1): store_format.encode_generation(second),
    }
    recorded = store_format.read_recorded(meta)
    assert recorded.input_next_offset == 12
    assert recorded.output_next_offset == 34
    assert recorded.generations == (second, first)  # by number
    assert recorded.next_generation == 4  # above every recorded generation


def test_read_recorded_of_a_new_store() -> None:
    recorded = store_format.read_recorded(created())
    assert (recorded.input_next_offset, recorded.output_next_offset) == (None, None)
    assert (recorded.generations, recorded.next_generation) == ((), 0)


def test_reconcile_matches_records_and_column_families() -> None:
    kept, lost = Generation.opened(1, 0), Generation.opened(2, 0)
    found = store_format.reconcile(
        [kept, lost], ["default", "gen-0000000001", "gen-0000000009", "gen-0000000005"]
    )
    assert found.live == [kept]
    assert found.lost == [lost]
    assert found.orphans == ["gen-0000000005", "gen-0000000009"]


# --- opening ---------------------------------------------------------------------------


def test_a_new_store_is_created_with_its_format_and_owner() -> None:
    assert store_format.opening({}, PATH, None, switch=False) is Opening.CREATE
    assert created() == {FORMAT_KEY: b"1", OWNER_KEY: store_format.encode_owner(OWNER)}
    assert created(ownership=OWNED)[FORMAT_KEY] == b"2"
    assert created(ownership=OWNED)[OWNERSHIP_KEY] == b"workers=4,reshards=0"


@pytest.mark.parametrize("ownership", [None, OWNED])
def test_a_store_of_the_workers_format_opens(ownership: Ownership | None) -> None:
    meta = created(ownership=ownership)
    assert store_format.opening(meta, PATH, ownership, switch=False) is Opening.OPEN
    store_format.check_owner(meta, PATH, OWNER, ownership, switching=False)


def test_data_without_a_format_record_is_refused() -> None:
    meta = {INPUT_OFFSET_KEY: store_format.encode_offset(5)}
    with pytest.raises(StoreError, match="has data but no format record"):
        store_format.opening(meta, PATH, None, switch=False)


def test_a_too_new_format_is_refused_naming_both_releases() -> None:
    meta = {**created(), FORMAT_KEY: b"99", store_format.WRITER_KEY: b"9.0.0"}
    for ownership in (None, OWNED):
        with pytest.raises(StoreError) as refused:
            store_format.opening(meta, PATH, ownership, switch=True)
        assert str(refused.value) == (
            f"store at {PATH} has format 99, written by release 9.0.0; this worker is "
            f"release {VERSION} and reads formats up to 3: a newer release wrote it "
            "(StoreTooNew; run that release or a later one)"
        )
    del meta[store_format.WRITER_KEY]  # a store of a release that did not record it
    with pytest.raises(StoreError, match="written by release unknown"):
        store_format.opening(meta, PATH, None, switch=False)


def test_an_other_unknown_format_names_the_one_read() -> None:
    meta = {**created(), FORMAT_KEY: b"x"}
    with pytest.raises(StoreError, match="has format x; this worker reads format 1"):
        store_format.opening(meta, PATH, None, switch=False)


def test_the_writer_record_names_this_release() -> None:
    assert store_format.writer_record() == (store_format.WRITER_KEY, VERSION.encode())
    assert store_format.writer_record("0.3.1") == (b"writer", b"0.3.1")


def test_an_ownership_store_is_refused_without_ownership() -> None:
    with pytest.raises(StoreError, match="written under ownership"):
        store_format.opening(created(ownership=OWNED), PATH, None, switch=True)


def test_a_format_1_store_is_refused_under_ownership_unless_switching() -> None:
    with pytest.raises(StoreError, match="switched to ownership as a whole"):
        store_format.opening(created(), PATH, OWNED, switch=False)
    assert store_format.opening(created(), PATH, OWNED, switch=True) is Opening.SWITCH
    # No ownership generation yet while it is switched.
    store_format.check_owner(created(), PATH, OWNER, OWNED, switching=True)
    switched = {**created(), **dict(store_format.switched_records(OWNED))}
    assert store_format.opening(switched, PATH, OWNED, switch=True) is Opening.OPEN
    store_format.check_owner(switched, PATH, OWNER, OWNED, switching=False)


def test_another_ownership_generation_is_refused() -> None:
    meta = created(ownership=Ownership(workers=2, reshards=1))
    with pytest.raises(StoreError, match="ownership generation workers=2,reshards=1"):
        store_format.check_owner(meta, PATH, OWNER, OWNED, switching=False)


def test_another_owner_is_refused() -> None:
    meta = created(owner=StoreOwner("analytics", "events", 4))
    with pytest.raises(StoreOwnershipError, match="belongs to analytics/events partition 4"):
        store_format.check_owner(meta, PATH, OWNER, None, switching=False)


def test_the_format_versions() -> None:
    assert (FORMAT_VERSION, FORMAT_VERSION_OWNED) == (1, 2)
    assert store_format.format_version(None) == 1
    assert store_format.format_version(OWNED) == 2


def test_the_store_module_still_exports_the_formats_names() -> None:
    """The worker, the Spark jobs, the benches and the tests import them from `store`."""
    for name in ("FORMAT_VERSION", "FORMAT_VERSION_OWNED", "Ownership", "StoreError"):
        assert getattr(store, name) is getattr(store_format, name)
    assert store.StoreOwner is StoreOwner
    assert store.StoreOwnershipError is StoreOwnershipError


# --- the two-phase upgrade: format 3 only once finalized ----------------------------------


def test_until_finalized_a_new_store_is_format_2_and_after_format_3() -> None:
    assert created(ownership=OWNED)[FORMAT_KEY] == b"2"
    finalized = dict(store_format.initial_records(OWNER, OWNED, finalized=True))
    assert finalized[FORMAT_KEY] == b"3"
    assert store_format.format_version(OWNED, finalized=True) == FORMAT_VERSION_FINALIZED == 3
    assert store_format.format_version(None, finalized=True) == 1, "finalize is ownership's"


def test_a_format_2_store_is_marked_format_3_only_when_finalized() -> None:
    meta = created(ownership=OWNED)
    assert store_format.opening(meta, PATH, OWNED, switch=False) is Opening.OPEN
    assert store_format.opening(meta, PATH, OWNED, switch=False, finalized=True) is (
        Opening.FINALIZE
    )
    assert store_format.finalized_records() == [(FORMAT_KEY, b"3")]


@pytest.mark.parametrize("finalized", [False, True])
def test_a_format_3_store_opens_and_stays_format_3(finalized: bool) -> None:
    """A worker never writes a format back: a format-3 store opens as it is, finalized or
    not (the spec field removed, or a replacement started before the roll reached it)."""
    meta = {**created(ownership=OWNED), FORMAT_KEY: b"3"}
    assert store_format.opening(meta, PATH, OWNED, switch=True, finalized=finalized) is (
        Opening.OPEN
    )


def test_a_format_3_store_is_refused_without_ownership() -> None:
    meta = {**created(ownership=OWNED), FORMAT_KEY: b"3"}
    with pytest.raises(StoreError, match="written under ownership"):
        store_format.opening(meta, PATH, None, switch=False)


def test_the_releases_before_format_3_are_those_before_0_2_0() -> None:
    """The guard dedupctl finalize-upgrade installs names the releases that cannot read
    format 3: every release before FINALIZED_SINCE (0.2.0), that is 0.1.0 alone."""
    assert store_format.FINALIZED_SINCE == "0.2.0"
    assert store_format.RELEASES_BEFORE_FINALIZED == ("0.1.0",)
