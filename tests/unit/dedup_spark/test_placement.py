"""Placement keys: one audit task per partition (dedup_spark.placement)."""

from __future__ import annotations

import pytest

from dedup_spark.placement import slot_keys, spark_hash_int

# Spark 4.0's own `SELECT hash(0), hash(1), ...` (tests/integration/test_spark_smoke.py
# compares a wider range against a live session).
SPARK_HASHES = {
    0: 933211791,
    1: -559580957,
    -1: -1604776387,
    42: 29417773,
    2**31 - 1: 133916647,
    -(2**31): 723455942,
}


@pytest.mark.parametrize(("value", "expected"), sorted(SPARK_HASHES.items()))
def test_the_hash_is_sparks(value: int, expected: int) -> None:
    assert spark_hash_int(value) == expected


@pytest.mark.parametrize("slots", [1, 2, 8, 37, 1000])
def test_each_slot_gets_the_smallest_key_that_lands_there(slots: int) -> None:
    keys = slot_keys(slots)
    assert [spark_hash_int(k) % slots for k in keys] == list(range(slots))
    for slot, key in enumerate(keys):
        assert all(spark_hash_int(k) % slots != slot for k in range(key))


def test_no_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        slot_keys(0)
