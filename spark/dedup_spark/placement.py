"""One audit task per Kafka partition: grouping keys that Spark places where we say.

Spark places the groups of `groupBy(...)` by hash: Murmur3 (seed 42) of the key,
modulo the number of tasks. With 8 partitions over 8 tasks that gave tasks with 3, 2, 1
and 0 partitions (measured: the audit stage took as long as its fullest task, ~1.7x a
balanced one), and with more partitions about a third of the tasks get two or more.

`slot_keys(n)` gives, for each task index `0..n-1`, an int key that Spark's hash
partitioning into `n` tasks sends to that index; a job repartitions by the key of each
record's partition and so runs partition `p` alone in task `p`. The hash is Spark's
`Murmur3_x86_32.hashInt` as `HashPartitioning` uses it (`pmod(hash(key), n)`); a test
checks it against Spark's own `hash()`. It decides only where work runs, never what is
computed: a wrong key would cost balance, not correctness.
"""

from __future__ import annotations

from typing import Final

SPARK_HASH_SEED: Final = 42
"""The seed of Spark's `Murmur3Hash` expression, which `HashPartitioning` uses."""

_C1: Final = 0xCC9E2D51
_C2: Final = 0x1B873593
_MASK: Final = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `hash(value)` for an INT column (signed 32-bit result)."""
    k = (value & _MASK) * _C1 & _MASK
    k = _rotl(k, 15) * _C2 & _MASK
    h = _rotl((seed & _MASK) ^ k, 13)
    h = (h * 5 + 0xE6546B64) & _MASK
    h ^= 4  # the input's length in bytes
    h ^= h >> 16
    h = h * 0x85EBCA6B & _MASK
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _MASK
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def slot_keys(slots: int) -> list[int]:
    """For each task index `0..slots-1`, the smallest non-negative INT key that Spark's
    hash partitioning into `slots` tasks places there."""
    if slots < 1:
        raise ValueError(f"slots must be positive, not {slots}")
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < slots:
        keys.setdefault(spark_hash_int(candidate) % slots, candidate)
        candidate += 1
    return [keys[slot] for slot in range(slots)]
