"""Source matching, the first step of the audit over ids (`audit_rules.audit_ids`): the
records of a set of ids, across partitions (`IdColumns`), become one aligned frame
(`MatchedIds`). Ids become integer codes shared by inputs and outputs; the input is
marked checked, pending or out of range; each output record is given the input
occurrence it published and whether it is checked. The rules read the frame and nothing
else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from dedup_spark.audit_arrays import (
    column_ints,
    first_pair_row,
    first_row,
    id_codes,
    ints,
    pairs_in,
    per_partition,
    place_order,
    strings,
    within,
)
from dedup_spark.audit_model import AuditRange, Forwarded, InputRecord, OutputRecord

NO_DIGEST: Final = np.iinfo(np.int64).min
"""A record whose content is not compared."""


def _digests(table: pa.Table) -> npt.NDArray[np.int64]:
    if "digest" not in table.column_names:
        return np.full(table.num_rows, NO_DIGEST, dtype=np.int64)
    return column_ints(table, "digest", NO_DIGEST)


@dataclass(frozen=True)
class IdColumns:
    """The records of a set of ids, across partitions, as columns: valid input
    occurrences, output records (those without an id included: they are unexpected),
    and the forwarded records not yet consumed by their owner. Offsets, timestamps and
    content digests as int64 arrays (`NO_DIGEST`: not compared), ids as Arrow strings."""

    input_partition: npt.NDArray[np.int64]
    input_offset: npt.NDArray[np.int64]
    input_timestamp_ms: npt.NDArray[np.int64]
    input_id: pa.Array
    input_digest: npt.NDArray[np.int64]
    output_partition: npt.NDArray[np.int64]
    output_offset: npt.NDArray[np.int64]
    output_timestamp_ms: npt.NDArray[np.int64]
    output_id: pa.Array
    output_digest: npt.NDArray[np.int64]
    forwarded_partition: npt.NDArray[np.int64]
    forwarded_offset: npt.NDArray[np.int64]

    @classmethod
    def of_records(
        cls,
        inputs: Sequence[InputRecord],
        outputs: Sequence[OutputRecord],
        forwarded: Sequence[Forwarded] = (),
    ) -> IdColumns:
        valid = [r for r in inputs if r.id is not None]
        return cls(
            ints([r.partition for r in valid]),
            ints([r.offset for r in valid]),
            ints([r.timestamp_ms for r in valid]),
            pa.array([r.id for r in valid], pa.string()),
            ints([NO_DIGEST if r.digest is None else r.digest for r in valid]),
            ints([r.partition for r in outputs]),
            ints([r.offset for r in outputs]),
            ints([r.timestamp_ms for r in outputs]),
            pa.array([r.id for r in outputs], pa.string()),
            ints([NO_DIGEST if r.digest is None else r.digest for r in outputs]),
            ints([f.origin_partition for f in forwarded]),
            ints([f.origin_offset for f in forwarded]),
        )

    @classmethod
    def of_tables(
        cls, inputs: pa.Table, outputs: pa.Table, forwarded: pa.Table | None = None
    ) -> IdColumns:
        """From Arrow tables with the `InputRecord` and `OutputRecord` field names as
        columns (`digest` optional; input rows without an id are left out) and the
        forwarded records' `origin_partition` and `origin_offset`."""
        inputs = inputs.filter(pc.is_valid(inputs.column("id")))
        return cls(
            column_ints(inputs, "partition"),
            column_ints(inputs, "offset"),
            column_ints(inputs, "timestamp_ms"),
            strings(inputs, "id"),
            _digests(inputs),
            column_ints(outputs, "partition"),
            column_ints(outputs, "offset"),
            column_ints(outputs, "timestamp_ms"),
            strings(outputs, "id"),
            _digests(outputs),
            ints([]) if forwarded is None else column_ints(forwarded, "origin_partition"),
            ints([]) if forwarded is None else column_ints(forwarded, "origin_offset"),
        )


@dataclass(frozen=True)
class MatchedIds:
    """The records of a set of ids aligned for the rules (`match_ids`). Input rows are the
    valid input occurrences in (partition, offset) order, so a row's index orders
    occurrences; output rows are the output records in (partition, offset) order, each
    naming the input row it published; per id code (an index into `ids`), whether the id
    has an input occurrence and its owner."""

    input_partition: npt.NDArray[np.int64]
    input_offset: npt.NDArray[np.int64]
    input_timestamp_ms: npt.NDArray[np.int64]
    input_digest: npt.NDArray[np.int64]
    input_id: pa.Array
    input_code: npt.NDArray[np.int64]
    input_key: npt.NDArray[np.int64]
    """Id code and timestamp in one int64: equal for an input row and the output rows
    that may have published it."""
    input_in_range: npt.NDArray[np.bool_]
    input_pending: npt.NDArray[np.bool_]
    """In range but not the pipeline's yet: at or above the group's committed offset, or
    forwarded and not yet consumed by its owner."""
    input_checked: npt.NDArray[np.bool_]
    """In range and not pending: the input the audit checks."""

    output_partition: npt.NDArray[np.int64]
    output_offset: npt.NDArray[np.int64]
    output_timestamp_ms: npt.NDArray[np.int64]
    output_digest: npt.NDArray[np.int64]
    output_id: pa.Array
    output_code: npt.NDArray[np.int64]
    """-1: the output record has no valid id."""
    output_key: npt.NDArray[np.int64]
    output_source: npt.NDArray[np.int64]
    """The input row the output record published (-1: none with its id and timestamp)."""
    output_in_range: npt.NDArray[np.bool_]
    """Checked: its input occurrence is, or (without one) it is dated in the range's time
    span."""

    ids: pa.Array
    """The distinct ids, in code order."""
    id_has_input: npt.NDArray[np.bool_]
    id_owner: npt.NDArray[np.int64]
    """The output partition that owns each id (all 0 when placement is not checked)."""
    workers: int | None
    """The owner function's modulus (None: placement is not checked)."""

    @property
    def inputs(self) -> int:
        return len(self.input_code)

    @property
    def codes(self) -> int:
        """The length of the per-id columns (at least 1: they are indexed with the code -1
        clipped to 0)."""
        return len(self.id_has_input)

    @property
    def output_valid(self) -> npt.NDArray[np.bool_]:
        """The output records with a valid id."""
        return self.output_code >= 0

    @property
    def output_has_source(self) -> npt.NDArray[np.bool_]:
        return self.output_source >= 0

    @property
    def output_of_input(self) -> npt.NDArray[np.bool_]:
        """The output records whose id has an input occurrence (in range or not)."""
        return self.output_valid & self.id_has_input[np.maximum(self.output_code, 0)]


def match_ids(
    records: IdColumns,
    *,
    workers: int | None,
    audit_range: AuditRange,
    committed: Mapping[int, int] | None = None,
) -> MatchedIds:
    """The aligned frame of `records` (`MatchedIds`). `committed`: the group's committed
    offset per input partition (None: all input is the pipeline's; a partition not named
    has committed nothing)."""
    r = records
    by_place = place_order(r.input_partition, r.input_offset)
    ip, io = r.input_partition[by_place], r.input_offset[by_place]
    it, idig = r.input_timestamp_ms[by_place], r.input_digest[by_place]
    input_id = r.input_id.take(pa.array(by_place, pa.int64()))
    out_order = place_order(r.output_partition, r.output_offset)
    op, oo = r.output_partition[out_order], r.output_offset[out_order]
    ot, odig = r.output_timestamp_ms[out_order], r.output_digest[out_order]
    output_id = r.output_id.take(pa.array(out_order, pa.int64()))
    in_code, out_code, dictionary = id_codes(input_id, output_id)
    n_codes = max(len(dictionary), 1)  # per-id arrays are indexed with code -1 clipped to 0
    n_in = len(in_code)

    in_range = audit_range.input_mask(ip, io, it)
    pending = _pending(ip, io, committed, r.forwarded_partition, r.forwarded_offset) & in_range
    checked = in_range & ~pending

    # The input occurrence each output record published: same id and timestamp, the
    # first by partition and offset, preferring its contents.
    times, rank = np.unique(np.concatenate([it, ot]), return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    in_key = in_code * len(times) + rank[:n_in]
    out_key = out_code * len(times) + rank[n_in:]
    source = first_row(in_key, out_key) if n_in else np.full(len(out_code), -1, np.int64)
    # Copies of an id with one timestamp (a millisecond) can arrive on several partitions;
    # when their contents differ, the output's contents say which one it published.
    other = (source >= 0) & (odig != NO_DIGEST)
    other[other] = idig[source[other]] != odig[other]
    if other.any():
        rows = np.flatnonzero(other)
        same_row = first_pair_row(in_key, idig, out_key[rows], odig[rows])
        source[rows] = np.where(same_row >= 0, same_row, source[rows])

    # Which output is checked: that of checked input, or, without an input occurrence,
    # dated in the range's time span.
    lo, hi = _time_span(audit_range, it, checked)
    has_source = source >= 0
    src = np.maximum(source, 0)
    out_in_range = (
        np.where(has_source, checked[src], within(ot, lo, hi)) if n_in else within(ot, lo, hi)
    )

    has_input = np.zeros(n_codes, dtype=bool)
    has_input[in_code] = True
    owner = np.zeros(n_codes, dtype=np.int64)
    if workers is not None and len(dictionary):
        from dedup_spark.murmur2 import owners

        owner = owners(dictionary, workers)
    return MatchedIds(
        input_partition=ip,
        input_offset=io,
        input_timestamp_ms=it,
        input_digest=idig,
        input_id=input_id,
        input_code=in_code,
        input_key=in_key,
        input_in_range=in_range,
        input_pending=pending,
        input_checked=checked,
        output_partition=op,
        output_offset=oo,
        output_timestamp_ms=ot,
        output_digest=odig,
        output_id=output_id,
        output_code=out_code,
        output_key=out_key,
        output_source=source,
        output_in_range=out_in_range,
        ids=dictionary,
        id_has_input=has_input,
        id_owner=owner,
        workers=workers,
    )


def _pending(
    partition: npt.NDArray[np.int64],
    offset: npt.NDArray[np.int64],
    committed: Mapping[int, int] | None,
    forwarded_partition: npt.NDArray[np.int64],
    forwarded_offset: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Which input (in or out of range) is not the pipeline's yet: at or above its
    partition's committed offset, or forwarded and not consumed by its owner."""
    pending = np.zeros(len(offset), dtype=bool)
    if committed is not None:
        floor = np.zeros(len(offset), dtype=np.int64)
        for p, _ in per_partition(partition):
            floor[partition == p] = committed.get(int(p), 0)
        pending |= offset >= floor
    if len(forwarded_offset):
        pending |= pairs_in(partition, offset, forwarded_partition, forwarded_offset)
    return pending


def _time_span(
    audit_range: AuditRange, timestamp_ms: npt.NDArray[np.int64], checked: npt.NDArray[np.bool_]
) -> tuple[int | None, int | None]:
    """The time span of the range, for output records without an input occurrence: the
    range's own, or, for an offset range, that of the checked input (none if none)."""
    if audit_range.offsets is None:
        return audit_range.from_ms, audit_range.to_ms
    if checked.any():
        return int(timestamp_ms[checked].min()), int(timestamp_ms[checked].max()) + 1
    return 0, 0
