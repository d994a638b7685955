"""Which worker owns an id: the one rule, for every part that must agree on it.

    owner(id) = toPositive(murmur2(id as UTF-8)) % workers

`workers` is the pipeline's `spec.partitions`. It is the partition Kafka's default (Java)
partitioner picks for a record keyed by the id's UTF-8 bytes (librdkafka agrees with
`partitioner=murmur2_random`; its own default, `consistent_random`, does not). Producers
keyed that way put every occurrence of an id on its owner's input partition when the
input's partition count is a multiple of `workers` ((h % I) % W == h % W exactly when W
divides I).

The hash runs in C (`dedup_contract._murmur2`, built with the package): one call per batch
(`owners`) costs well under 0.3 us an id, where this module's pure-Python
`murmur2_reference` costs 3-4 us. The reference stays as what the C code is tested
against (Kafka's and librdkafka's own vectors, and random bytes: tests/unit/dedup_contract/test_ownership.py).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from dedup_contract import _murmur2


def owner(message_id: str | bytes, workers: int) -> int:
    """The worker (and output partition) that owns the id, for `workers` workers."""
    data = message_id.encode() if isinstance(message_id, str) else message_id
    return _murmur2.owner(data, workers)


def owners(utf8_ids: Sequence[bytes], workers: int) -> list[int]:
    """`owner` of each id given as its UTF-8 bytes, in order: one C call for a batch."""
    return _murmur2.owners(utf8_ids, workers)


def owners_unless_all_owned_by(
    me: int, utf8_ids: Sequence[bytes], workers: int
) -> list[int] | None:
    """None when worker `me` owns every id (producers keyed by id: the hot path then
    builds no list of owners and compares nothing in Python), else `owners`."""
    return _murmur2.owners_unless_all(utf8_ids, workers, me)


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of the bytes, as a signed 32-bit int (in C)."""
    return _murmur2.murmur2(data)


_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF
_SEED: Final = 0x9747B28C


def murmur2_reference(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` in Python: 32-bit MurmurHash2, seed 0x9747b28c, signed.
    The reference the C implementation is tested against; not for the hot path."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for k in struct.unpack_from(f"<{whole >> 2}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def owner_reference(data: bytes, workers: int) -> int:
    """`owner` by the reference hash."""
    if workers < 1:
        raise ValueError(f"workers must be positive, not {workers}")
    return (murmur2_reference(data) & 0x7FFFFFFF) % workers
