"""The array operations the audit's rules are made of: int64 columns out of Arrow, sorted
keys, running maxima and binary searches over time ranks. Nothing here knows a record,
a finding or a rule (`audit_matching.py` and `audit_rules.py` do)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

NO_PUBLICATION: Final = np.iinfo(np.int64).min
"""No publication (an int64 no timestamp reaches)."""


def ints(values: Sequence[int] | npt.ArrayLike) -> npt.NDArray[np.int64]:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def column_ints(table: pa.Table, name: str, null: int = -1) -> npt.NDArray[np.int64]:
    column = table.column(name).combine_chunks().cast(pa.int64()).fill_null(null)
    return ints(column.to_numpy())


def strings(table: pa.Table, name: str) -> pa.Array:
    return table.column(name).combine_chunks().cast(pa.string())


def within(values: npt.NDArray[np.int64], lo: int | None, hi: int | None) -> npt.NDArray[np.bool_]:
    """Which `values` lie in `[lo, hi)` (None: unbounded on that side)."""
    mask = np.ones(len(values), dtype=bool)
    if lo is not None:
        mask &= values >= lo
    if hi is not None:
        mask &= values < hi
    return mask


def id_codes(
    input_ids: pa.Array, output_ids: pa.Array
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], pa.Array]:
    """Each id as an integer code shared by inputs and outputs (-1: no id), and the
    distinct ids (the code's dictionary)."""
    encoded = pc.dictionary_encode(pa.concat_arrays([input_ids, output_ids]))
    flat = ints(encoded.indices.cast(pa.int64()).fill_null(-1).to_numpy())
    return flat[: len(input_ids)], flat[len(input_ids) :], encoded.dictionary


def per_partition(partitions: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """(partition, how many times it occurs) for each partition present."""
    counts = np.bincount(partitions) if len(partitions) else np.zeros(0, dtype=np.int64)
    return [(int(p), int(counts[p])) for p in np.flatnonzero(counts)]


def distinct_sorted(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The distinct values, sorted (a sort: faster here than `np.unique`'s hashing)."""
    ordered = np.sort(values)
    keep = np.ones(len(ordered), dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def place_order(
    partitions: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The order of records by (partition, offset) (none needed when already so)."""
    key = partitions * (int(offsets.max(initial=0)) + 1) + offsets
    if len(key) < 2 or bool((key[1:] >= key[:-1]).all()):
        return np.arange(len(key), dtype=np.int64)
    return np.argsort(key, kind="stable").astype(np.int64)


def pairs_in(
    parts: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    in_parts: npt.NDArray[np.int64],
    in_offsets: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Which (partition, offset) pairs are among the given ones."""
    k = int(max(offsets.max(initial=0), in_offsets.max(initial=0))) + 1
    return np.isin(parts * k + offsets, in_parts * k + in_offsets)


def rows_in(
    key: npt.NDArray[np.int64],
    value: npt.NDArray[np.int64],
    in_key: npt.NDArray[np.int64],
    in_value: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Which (key, value) pairs are among the (in_key, in_value) ones."""
    both = np.stack([np.concatenate([key, in_key]), np.concatenate([value, in_value])], axis=1)
    _, row = np.unique(both, axis=0, return_inverse=True)
    row = row.reshape(-1)
    return np.isin(row[: len(key)], row[len(key) :])


def first_row(
    in_key: npt.NDArray[np.int64], out_key: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Per output key, the first input row with that key (-1: none); negative keys
    (no id) match nothing."""
    order = np.argsort(in_key, kind="stable")
    key = in_key[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    key, row = key[first], order[first]
    at = np.minimum(np.searchsorted(key, out_key), len(key) - 1)
    return np.where((out_key >= 0) & (key[at] == out_key), row[at], -1).astype(np.int64)


def first_pair_row(
    in_key: npt.NDArray[np.int64],
    in_value: npt.NDArray[np.int64],
    key: npt.NDArray[np.int64],
    value: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per (key, value) pair, the first input row with that pair (-1: none)."""
    both = np.stack([np.concatenate([in_key, key]), np.concatenate([in_value, value])], axis=1)
    _, pair = np.unique(both, axis=0, return_inverse=True)
    pair = pair.reshape(-1).astype(np.int64)
    found = first_row(pair[: len(in_key)], pair[len(in_key) :])
    return np.where(key >= 0, found, -1).astype(np.int64)


def previous_publication(
    code: npt.NDArray[np.int64],
    ts: npt.NDArray[np.int64],
    part: npt.NDArray[np.int64],
    offset: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per output record, the timestamp of the same id's previous publication on any
    partition, by timestamp (ties by partition and offset); `NO_PUBLICATION` for the first."""
    previous = np.full(len(code), NO_PUBLICATION, dtype=np.int64)
    order = np.lexsort((offset, part, ts, code))
    c, t = code[order], ts[order]
    repeat = np.zeros(len(c), dtype=bool)
    repeat[1:] = (c[1:] == c[:-1]) & (c[1:] >= 0)
    previous[order[repeat]] = t[np.flatnonzero(repeat) - 1]
    return previous


def count_near(
    pub_code: npt.NDArray[np.int64],
    pub_ts: npt.NDArray[np.int64],
    code: npt.NDArray[np.int64],
    ts: npt.NDArray[np.int64],
    reach: int,
    times: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per query (code, ts), how many publications of the same code are dated within
    `[ts - reach, ts + reach]`. `times`: the sorted distinct publication timestamps."""
    if not len(pub_code):
        return np.zeros(len(code), dtype=np.int64)
    span = len(times) + 1
    keys = np.sort(pub_code * span + np.searchsorted(times, pub_ts))
    lo = code * span + np.searchsorted(times, ts - reach, "left")
    hi = code * span + np.searchsorted(times, ts + reach, "right")
    return (np.searchsorted(keys, hi, "left") - np.searchsorted(keys, lo, "left")).astype(np.int64)


def latest_earlier_publication(
    in_code: npt.NDArray[np.int64],
    in_offset: npt.NDArray[np.int64],
    in_ts: npt.NDArray[np.int64],
    pub_code: npt.NDArray[np.int64],
    pub_at: npt.NDArray[np.int64],
    pub_ts: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per input record, the newest timestamp among publications of its code (here: id
    and input partition) from an earlier input offset; `NO_PUBLICATION` when there is none.
    Publications with a negative code are ignored."""
    pubs = pub_code >= 0
    pub_code, pub_ts, pub_at = pub_code[pubs], pub_ts[pubs], pub_at[pubs]
    n_in, n_pub = len(in_code), len(pub_code)
    # Events sorted by (code, offset), a query before a publication at the same offset
    # (its own publication is not earlier than itself).
    code = np.concatenate([pub_code, in_code])
    at = np.concatenate([pub_at, in_offset])
    is_query = np.concatenate([np.zeros(n_pub, dtype=bool), np.ones(n_in, dtype=bool)])
    times, rank = np.unique(np.concatenate([pub_ts, in_ts]), return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    order = np.lexsort((~is_query, at, code))
    # Running maximum of publication time ranks within each code: each code's values
    # are lifted by code * k, so a maximum never crosses from one code into the next.
    k = len(times) + 1
    lifted = code * k + np.where(is_query, -1, rank)
    running = np.maximum.accumulate(lifted[order]) if len(order) else lifted
    found = running - code[order] * k
    latest = np.full(n_in, NO_PUBLICATION, dtype=np.int64)
    query_rows = order[is_query[order]] - n_pub
    got = found[is_query[order]]
    has = got >= 0
    latest[query_rows[has]] = times[got[has]]
    return latest
