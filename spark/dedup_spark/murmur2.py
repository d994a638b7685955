"""The audit's own ownership hash: Kafka's murmur2, vectorised over Arrow string arrays.

    owner(id) = (murmur2(id as UTF-8) & 0x7fffffff) % workers

The audit checks that every publication is on its owner's output partition, so it must
not trust the function it checks: this is written independently of the worker's
`dedup_contract.ownership` (which runs in C), from Kafka's `Utils.murmur2` (32-bit
MurmurHash2, seed 0x9747b28c, little-endian 4-byte blocks). It runs as numpy operations
over a whole column: one pass per 4-byte block of the longest id, each over every id
that long, so its cost per id is a few array operations, not a Python loop.
Tested on Kafka's vectors and against a plain loop over random bytes
(tests/unit/dedup_spark/test_audit_ownership.py).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

_M: Final = np.uint32(0x5BD1E995)
_SEED: Final = np.uint32(0x9747B28C)


def murmur2(values: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int32]:
    """Kafka's murmur2 of each value's UTF-8 (or binary) bytes, as signed 32-bit ints.
    A null value hashes as the empty string (callers mask nulls themselves)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_string(values.type):
        values = values.cast(pa.binary())
    elif pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    buffers = values.buffers()
    offset_type = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    offsets: npt.NDArray[np.int64] = np.frombuffer(buffers[1], dtype=offset_type)[
        values.offset : values.offset + n + 1
    ].astype(np.int64)
    data = (
        np.zeros(4, dtype=np.uint8)
        if buffers[2] is None
        else np.frombuffer(buffers[2], dtype=np.uint8)
    )
    start = offsets[:-1]
    length = offsets[1:] - offsets[:-1]
    if values.null_count:
        length = np.where(np.asarray(values.is_null()), 0, length)
    h = _SEED ^ length.astype(np.uint32)
    blocks = length >> 2
    for j in range(int(blocks.max())):
        rows = np.flatnonzero(blocks > j)
        pos = start[rows] + 4 * j
        k = (
            data[pos].astype(np.uint32)
            | (data[pos + 1].astype(np.uint32) << 8)
            | (data[pos + 2].astype(np.uint32) << 16)
            | (data[pos + 3].astype(np.uint32) << 24)
        )
        k *= _M
        k ^= k >> 24
        k *= _M
        h[rows] = (h[rows] * _M) ^ k
    tail = length & 3
    base = start + (blocks << 2)
    three = np.flatnonzero(tail == 3)
    h[three] ^= data[base[three] + 2].astype(np.uint32) << 16
    two = np.flatnonzero(tail >= 2)
    h[two] ^= data[base[two] + 1].astype(np.uint32) << 8
    one = np.flatnonzero(tail >= 1)
    h[one] ^= data[base[one]].astype(np.uint32)
    h[one] *= _M
    h ^= h >> 13
    h *= _M
    h ^= h >> 15
    return h.view(np.int32)


def owners(values: pa.Array | pa.ChunkedArray, workers: int) -> npt.NDArray[np.int64]:
    """The owning worker (and output partition) of each id, for `workers` workers."""
    if workers < 1:
        raise ValueError(f"workers must be positive, not {workers}")
    return (murmur2(values).astype(np.int64) & 0x7FFFFFFF) % workers
