"""The owner of an id: Kafka's murmur2 in C (dedup_contract._murmur2) against the Python
reference (dedup_contract.ownership.murmur2_reference), on Kafka's and librdkafka's own
vectors and on random bytes of every length up to 300."""

from __future__ import annotations

import random

import pytest

from dedup_contract.ownership import (
    murmur2,
    murmur2_reference,
    owner,
    owner_reference,
    owners,
    owners_unless_all_owned_by,
)

# Kafka's clients/src/test/.../utils/UtilsTest.testMurmur2 (Java's Utils.murmur2).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# librdkafka src/rdmurmur2.c unittest_murmur2 "java_murmur2_results" (unsigned hex).
LIBRDKAFKA_VECTORS = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x78424F1C,
    b"reAmbleWillBeRemoved,ThePrePartThatIs": 0x4A62B377,
    b"eAmbleWillBeRemoved,ThePrePartThatIs": 0xE0E4E09E,
    b"AmbleWillBeRemoved,ThePrePartThatIs": 0x62B8B43F,
    b"": 0x106E08D9,
}


@pytest.mark.parametrize("hash_", [murmur2, murmur2_reference])
@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka_utils_test(hash_: object, data: bytes, expected: int) -> None:
    assert hash_(data) == expected  # type: ignore[operator]


@pytest.mark.parametrize("hash_", [murmur2, murmur2_reference])
@pytest.mark.parametrize(("data", "expected"), LIBRDKAFKA_VECTORS.items())
def test_murmur2_matches_librdkafka(hash_: object, data: bytes, expected: int) -> None:
    assert hash_(data) & 0xFFFFFFFF == expected  # type: ignore[operator]


def test_the_c_hash_equals_the_reference_on_random_bytes() -> None:
    rng = random.Random(26)
    for length in range(301):
        for _ in range(20):
            data = rng.randbytes(length)
            assert murmur2(data) == murmur2_reference(data), data.hex()
    # bytes-like objects too (the C side takes any buffer)
    assert murmur2(bytearray(b"foobar")) == murmur2(memoryview(b"foobar")) == -790332482


def test_owner_is_kafkas_default_partitioner() -> None:
    for data, hashed in KAFKA_VECTORS.items():
        for workers in (1, 3, 12, 100):
            expected = (hashed & 0x7FFFFFFF) % workers
            assert owner(data, workers) == expected == owner_reference(data, workers)
            assert owner(data.decode(), workers) == expected
    # "21" hashes negative: toPositive masks the sign bit (not abs(), not a signed modulo).
    assert owner("21", 7) == 3  # abs() would give 6, Python's signed % gives 1
    assert owner("ü", 7) == owner("ü".encode(), 7)


def test_owners_of_a_batch_equal_one_by_one() -> None:
    rng = random.Random(7)
    batch = [rng.randbytes(rng.randrange(0, 64)) for _ in range(5000)]
    for workers in (1, 2, 3, 4, 16, 64, 1000):
        assert owners(batch, workers) == [owner_reference(d, workers) for d in batch]
    assert owners((b"21", b"foobar"), 7) == [3, 0]  # any sequence
    assert owners([], 3) == []


def test_owners_unless_all_owned_by_is_none_exactly_when_every_reference_owner_is_me() -> None:
    rng = random.Random(11)
    for workers in (1, 2, 4, 64):
        ids = [rng.randbytes(rng.randrange(0, 40)) for _ in range(3000)]
        by_reference = [owner_reference(d, workers) for d in ids]
        for me in range(min(workers, 4)):
            mine = [d for d, o in zip(ids, by_reference, strict=True) if o == me]
            assert owners_unless_all_owned_by(me, mine, workers) is None
            # one foreign id anywhere (first, middle, last): every owner, by the reference
            others = [d for d, o in zip(ids, by_reference, strict=True) if o != me]
            for at in (0, len(mine) // 2, len(mine)):
                if not others:
                    continue
                batch = [*mine[:at], others[0], *mine[at:]]
                expected = [owner_reference(d, workers) for d in batch]
                assert owners_unless_all_owned_by(me, batch, workers) == expected
            assert owners_unless_all_owned_by(me, ids, workers) == (
                None if workers == 1 else by_reference
            )
    assert owners_unless_all_owned_by(0, [], 3) is None


def test_bad_arguments_are_clear_errors() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="workers must be positive"):
            owner("a", bad)
        with pytest.raises(ValueError, match="workers must be positive"):
            owners([b"a"], bad)
        with pytest.raises(ValueError, match="workers must be positive"):
            owner_reference(b"a", bad)
    with pytest.raises(TypeError, match="takes bytes, not str at 1"):
        owners([b"a", "b"], 3)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"owners_unless_all\(\) takes bytes, not str at 1"):
        owners_unless_all_owned_by(0, [b"a", "b"], 3)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="workers must be positive"):
        owners_unless_all_owned_by(0, [b"a"], 0)
    with pytest.raises(TypeError, match=r"owners\(\) takes a sequence of bytes, not int"):
        owners(3, 3)  # type: ignore[arg-type]
