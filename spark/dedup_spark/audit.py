"""The reconciliation audit of one partition, as pure rules over what was read.

Input: the partition's input records (offset order, each with its id under the
pipeline's rules or its dead-letter reason), its output records (offset order, each
with its id), and the dead letters that name it as their origin. The output of a worker
keeps the input record's timestamp, so an output record's timestamp is that of the
input occurrence it published.

What is checked, for the records *in range* (`AuditRange`) and only for input the
worker has committed (offsets below the pipeline's committed consumer offset, when
known; the rest is `pending`, not yet the worker's to have done):

* **duplicates**: output records whose id was already published less than a window
  earlier (by record timestamp);
* **missing**: valid input occurrences that no output accounts for. An occurrence is
  accounted for when it is *published* (an output record is its publication: same id
  and timestamp, the first such input offset, as the worker keeps the input's
  timestamp) or when it is a *repeat*: a publication of the same id from an earlier
  input offset has a timestamp at or after the occurrence's minus the window and
  `slack` (the worker keeps an id a little longer than its duration: up to
  `1/generations` more, see `dedup_worker.window`). Any later publication of the id
  (a legitimate repeat after the window) covers nothing before it. Each unaccounted
  occurrence is one finding;
* **unverifiable**: what retention deleted before the audit could read it (`Retention`):
  in-range input offsets no longer in the input topic (one finding per span, counted
  by offset; for a time range whose start is older than the oldest retained input
  record, all deleted offsets are counted: an upper bound, as their timestamps are
  gone), and unaccounted occurrences whose publication, or the publication they
  repeat, may have been in deleted output (the window reaches back past the oldest
  retained output record). Not findings of loss, not proof of its absence:
  `passed(totals, fail_on_unverifiable=...)` decides (README, "Reconciliation audit");
* **content mismatches**: output records whose key, value or headers (the worker's
  `dedup.id` header aside) differ from those of the input occurrence they publish,
  compared by 64-bit digests (`source.content_digest`) when both sides have one;
* **missing dead letters**: invalid input records with no dead letter from their offset;
* **unexpected**: output records whose id has no input occurrence at all;
* **order violations**: output records whose input occurrence comes before that of an
  earlier output record (the output must keep the input order of first occurrences);
* counts: input, valid, distinct, published, dead-lettered (by reason), pending, and
  the input's duplicate rate.

The audit passes when duplicates, missing, missing dead letters, unexpected, order
violations and content mismatches are all zero (and, by default, nothing is
unverifiable). Nothing here does I/O; `reconcile.py` runs it per partition
inside Spark and `bench/reconcile.py` runs it in a plain Python reader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

DUPLICATE: Final = "duplicate"
MISSING: Final = "missing"
MISSING_DEAD_LETTER: Final = "missing_dead_letter"
UNEXPECTED: Final = "unexpected"
ORDER_VIOLATION: Final = "order_violation"
CONTENT_MISMATCH: Final = "content_mismatch"
UNVERIFIABLE: Final = "unverifiable"
FINDING_KINDS: Final = (
    DUPLICATE,
    MISSING,
    MISSING_DEAD_LETTER,
    UNEXPECTED,
    ORDER_VIOLATION,
    CONTENT_MISMATCH,
    UNVERIFIABLE,
)


class InputRecord(NamedTuple):
    offset: int
    timestamp_ms: int
    id: str | None  # None: invalid, see reason
    reason: str | None = None
    digest: int | None = None  # of key, value and headers (None: not compared)


class OutputRecord(NamedTuple):
    offset: int
    timestamp_ms: int
    id: str | None  # None: the output record has no valid id (itself unexpected)
    digest: int | None = None  # of key, value and headers without `dedup.id`


class DeadLetter(NamedTuple):
    origin_offset: int | None
    timestamp_ms: int
    reason: str | None


class Finding(NamedTuple):
    """One thing wrong, with where to look: the output offset (duplicates, unexpected,
    order violations, content mismatches) or the input offset (missing, missing dead
    letters, unverifiable: for a deleted span, its first offset)."""

    kind: str
    id: str | None
    offset: int
    timestamp_ms: int
    detail: str


@dataclass(frozen=True)
class AuditRange:
    """Which records are checked: input records with a timestamp in `[from_ms, to_ms)`,
    or in per-partition offset ranges `[start, end)`; output records whose input
    occurrence is checked (or, without one, whose timestamp falls in the range's time
    span)."""

    from_ms: int | None = None
    to_ms: int | None = None
    offsets: Mapping[int, tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        if self.offsets is not None and (self.from_ms is not None or self.to_ms is not None):
            raise ValueError("a range is either times or offsets, not both")
        if self.from_ms is not None and self.to_ms is not None and self.from_ms >= self.to_ms:
            raise ValueError("the range's start must come before its end")

    def input_mask(
        self, partition: int, offsets: npt.NDArray[np.int64], timestamps_ms: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """Which of a partition's input records (given as columns) are in range."""
        if self.offsets is not None:
            bounds = self.offsets.get(partition)
            if bounds is None:
                return np.zeros(len(offsets), dtype=bool)
            return _within(offsets, *bounds)
        return _within(timestamps_ms, self.from_ms, self.to_ms)


def _within(values: npt.NDArray[np.int64], lo: int | None, hi: int | None) -> npt.NDArray[np.bool_]:
    """Which `values` lie in `[lo, hi)` (None: unbounded on that side)."""
    mask = np.ones(len(values), dtype=bool)
    if lo is not None:
        mask &= values >= lo
    if hi is not None:
        mask &= values < hi
    return mask


@dataclass(frozen=True)
class Retention:
    """What retention left of one partition when the audit read it: the log start
    offsets of the input and output partitions (Kafka's low watermarks; 0: nothing
    deleted) and the timestamps of their oldest retained committed records (None: none
    retained, or not asked because nothing was deleted)."""

    input_start: int = 0
    input_first_ms: int | None = None
    output_start: int = 0
    output_first_ms: int | None = None

    def lost_input(self, partition: int, audit_range: AuditRange) -> tuple[int, int] | None:
        """The span `[start, end)` of deleted input offsets that may hold records in range
        (None: none). Exact for an offset range; for a time range, every deleted offset
        when the range starts before the oldest retained input record."""
        if self.input_start <= 0:
            return None
        if audit_range.offsets is not None:
            bounds = audit_range.offsets.get(partition)
            if bounds is None or bounds[0] >= min(bounds[1], self.input_start):
                return None
            return bounds[0], min(bounds[1], self.input_start)
        first = self.input_first_ms
        if audit_range.from_ms is not None and first is not None and first <= audit_range.from_ms:
            return None  # retained input reaches back before the range
        return 0, self.input_start

    def output_horizon_ms(self) -> int | None:
        """Publications older than this may have been deleted (None: none were)."""
        if self.output_start <= 0:
            return None
        return _NEVER if self.output_first_ms is None else self.output_first_ms


@dataclass
class PartitionAudit:
    partition: int
    input: int = 0
    valid: int = 0
    distinct: int = 0
    published: int = 0
    dead_lettered: int = 0
    pending: int = 0
    unverifiable: int = 0
    dead_lettered_by_reason: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)

    @property
    def passed(self) -> bool:
        return not self.findings

    def totals(self) -> dict[str, Any]:
        """The counts under the summary's names (CONTRACTS.md)."""
        return totals_of(
            {
                "input": self.input,
                "valid": self.valid,
                "distinct": self.distinct,
                "published": self.published,
                "deadLettered": self.dead_lettered,
                "pending": self.pending,
                "duplicates": self.count(DUPLICATE),
                "missing": self.count(MISSING),
                "missingDeadLetters": self.count(MISSING_DEAD_LETTER),
                "unexpected": self.count(UNEXPECTED),
                "orderViolations": self.count(ORDER_VIOLATION),
                "contentMismatches": self.count(CONTENT_MISMATCH),
                "unverifiable": self.unverifiable,
            }
        )


COUNT_NAMES: Final = (
    "input",
    "valid",
    "distinct",
    "published",
    "deadLettered",
    "pending",
    "duplicates",
    "missing",
    "missingDeadLetters",
    "unexpected",
    "orderViolations",
    "contentMismatches",
    "unverifiable",
)
FAILING: Final = (
    "duplicates",
    "missing",
    "missingDeadLetters",
    "unexpected",
    "orderViolations",
    "contentMismatches",
)
"""Counts that fail an audit whatever the settings; `unverifiable` fails it by default."""


def totals_of(counts: Mapping[str, int]) -> dict[str, Any]:
    """`counts` with the derived input duplicate rate (1 - distinct / valid)."""
    out: dict[str, Any] = {name: int(counts.get(name, 0)) for name in COUNT_NAMES}
    valid = out["valid"]
    out["inputDuplicateRate"] = round(1 - out["distinct"] / valid, 6) if valid else 0.0
    return out


def add_totals(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of per-partition totals, rate recomputed."""
    summed: Counter[str] = Counter()
    for part in parts:
        for name in COUNT_NAMES:
            summed[name] += int(part.get(name, 0))
    return totals_of(summed)


def passed(totals: Mapping[str, Any], *, fail_on_unverifiable: bool = True) -> bool:
    """No finding of loss, duplication or change; and, unless told otherwise, nothing
    that retention kept from being verified."""
    failing = (*FAILING, "unverifiable") if fail_on_unverifiable else FAILING
    return all(int(totals.get(name, 0)) == 0 for name in failing)


def audit_partition(
    partition: int,
    inputs: Sequence[InputRecord],
    outputs: Sequence[OutputRecord],
    dead_letters: Sequence[DeadLetter],
    *,
    audit_range: AuditRange,
    window_ms: int,
    slack_ms: int = 0,
    committed_offset: int | None = None,
    retention: Retention | None = None,
) -> PartitionAudit:
    """Audit one partition (module docstring), from records in offset order."""
    return audit_columns(
        partition,
        PartitionColumns.of_records(inputs, outputs, dead_letters),
        audit_range=audit_range,
        window_ms=window_ms,
        slack_ms=slack_ms,
        committed_offset=committed_offset,
        retention=retention,
    )


@dataclass(frozen=True)
class PartitionColumns:
    """One partition's records as columns, inputs and outputs in offset order: offsets,
    timestamps and content digests as int64 arrays, ids and reasons as Arrow string
    arrays (null: none). A dead letter without an origin offset has -1; a record without
    a digest has `NO_DIGEST` (not compared)."""

    input_offset: npt.NDArray[np.int64]
    input_timestamp_ms: npt.NDArray[np.int64]
    input_id: pa.Array
    input_reason: pa.Array
    output_offset: npt.NDArray[np.int64]
    output_timestamp_ms: npt.NDArray[np.int64]
    output_id: pa.Array
    dead_origin_offset: npt.NDArray[np.int64]
    dead_timestamp_ms: npt.NDArray[np.int64]
    dead_reason: pa.Array
    input_digest: npt.NDArray[np.int64] | None = None
    output_digest: npt.NDArray[np.int64] | None = None

    @classmethod
    def of_records(
        cls,
        inputs: Sequence[InputRecord],
        outputs: Sequence[OutputRecord],
        dead_letters: Sequence[DeadLetter],
    ) -> PartitionColumns:
        return cls(
            _ints([r.offset for r in inputs]),
            _ints([r.timestamp_ms for r in inputs]),
            pa.array([r.id for r in inputs], pa.string()),
            pa.array([r.reason for r in inputs], pa.string()),
            _ints([r.offset for r in outputs]),
            _ints([r.timestamp_ms for r in outputs]),
            pa.array([r.id for r in outputs], pa.string()),
            _ints([-1 if d.origin_offset is None else d.origin_offset for d in dead_letters]),
            _ints([d.timestamp_ms for d in dead_letters]),
            pa.array([d.reason for d in dead_letters], pa.string()),
            _ints([NO_DIGEST if r.digest is None else r.digest for r in inputs]),
            _ints([NO_DIGEST if r.digest is None else r.digest for r in outputs]),
        )

    @classmethod
    def of_tables(cls, inputs: pa.Table, outputs: pa.Table, dead: pa.Table) -> PartitionColumns:
        """From Arrow tables with the `InputRecord`, `OutputRecord` and `DeadLetter` field
        names as columns (in offset order; `digest` optional)."""
        return cls(
            _column_ints(inputs, "offset"),
            _column_ints(inputs, "timestamp_ms"),
            inputs.column("id").combine_chunks(),
            inputs.column("reason").combine_chunks(),
            _column_ints(outputs, "offset"),
            _column_ints(outputs, "timestamp_ms"),
            outputs.column("id").combine_chunks(),
            _column_ints(dead, "origin_offset"),
            _column_ints(dead, "timestamp_ms"),
            dead.column("reason").combine_chunks(),
            _digests(inputs),
            _digests(outputs),
        )


NO_DIGEST: Final = np.iinfo(np.int64).min
"""A record whose content is not compared."""


def _ints(values: Sequence[int]) -> npt.NDArray[np.int64]:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _column_ints(table: pa.Table, name: str, null: int = -1) -> npt.NDArray[np.int64]:
    column = table.column(name).combine_chunks().cast(pa.int64()).fill_null(null)
    return _ints(column.to_numpy())


def _digests(table: pa.Table) -> npt.NDArray[np.int64] | None:
    if "digest" not in table.column_names:
        return None
    return _column_ints(table, "digest", NO_DIGEST)


def audit_columns(
    partition: int,
    records: PartitionColumns,
    *,
    audit_range: AuditRange,
    window_ms: int,
    slack_ms: int = 0,
    committed_offset: int | None = None,
    retention: Retention | None = None,
) -> PartitionAudit:
    """Audit one partition (module docstring), vectorised over its columns: ids become
    integer codes once, and every rule is an array operation (records/s in
    bench/README.md). Findings come in output order, then in input order."""
    if window_ms <= 0:
        raise ValueError(f"the window must be positive, not {window_ms} ms")
    r = records
    retention = retention or Retention()
    audit = PartitionAudit(partition)
    in_code, out_code, n_codes = _id_codes(r.input_id, r.output_id)
    n_codes = max(n_codes, 1)  # per-id arrays are indexed with code -1 clipped to 0
    in_valid, out_valid = in_code >= 0, out_code >= 0

    # Which input is checked: in range, and (when known) committed by the worker.
    in_range = audit_range.input_mask(partition, r.input_offset, r.input_timestamp_ms)
    pending = np.zeros(len(in_range), dtype=bool)
    if committed_offset is not None:
        pending = in_range & (r.input_offset >= committed_offset)
    audit.pending = int(pending.sum())
    checked = in_range & ~pending
    checked_offsets = r.input_offset[checked]

    # The time span of the range, for output records without an input occurrence.
    lo: int | None
    hi: int | None
    if audit_range.offsets is None:
        lo, hi = audit_range.from_ms, audit_range.to_ms
    elif checked.any():
        lo = int(r.input_timestamp_ms[checked].min())
        hi = int(r.input_timestamp_ms[checked].max()) + 1
    else:
        lo, hi = 0, 0

    # Output: the input occurrence each record published (same id and timestamp, first
    # such input offset), duplicates, unexpected, order, contents.
    source = _first_occurrence(
        in_code, r.input_timestamp_ms, r.input_offset, out_code, r.output_timestamp_ms
    )
    has_source = source >= 0
    out_in_range = np.where(
        has_source, np.isin(source, checked_offsets), _within(r.output_timestamp_ms, lo, hi)
    )
    audit.published = int(out_in_range.sum())
    in_input = np.zeros(n_codes, dtype=bool)
    in_input[in_code[in_valid]] = True
    unexpected = out_in_range & ~(out_valid & in_input[np.maximum(out_code, 0)])
    previous = _previous_publication(out_code, r.output_timestamp_ms)
    duplicate = (
        out_in_range
        & ~unexpected
        & (previous != _NONE)
        & (np.abs(r.output_timestamp_ms - np.where(previous != _NONE, previous, 0)) < window_ms)
    )
    ordered = has_source & ~(out_in_range & (unexpected | duplicate))
    newest = np.maximum.accumulate(np.where(ordered, source, -1)) if len(source) else source
    newest_before = np.concatenate([[-1], newest[:-1]]) if len(newest) else newest
    violation = out_in_range & ~unexpected & ~duplicate & has_source & (source < newest_before)
    # The input row of each output's source (inputs are in offset order).
    source_row = np.searchsorted(r.input_offset, source) if len(source) else source
    changed = np.zeros(len(source), dtype=bool)
    if r.input_digest is not None and r.output_digest is not None and len(r.input_digest):
        source_digest = r.input_digest[np.clip(source_row, 0, len(r.input_digest) - 1)]
        changed = (
            out_in_range
            & ~unexpected
            & has_source
            & (r.output_digest != NO_DIGEST)
            & (source_digest != NO_DIGEST)
            & (r.output_digest != source_digest)
        )
    for i in np.flatnonzero(unexpected | duplicate | violation | changed):
        out_id = r.output_id[i].as_py()
        offset, ts = int(r.output_offset[i]), int(r.output_timestamp_ms[i])
        if unexpected[i]:
            audit.findings.append(Finding(UNEXPECTED, out_id, offset, ts, "no input occurrence"))
        elif duplicate[i]:
            audit.findings.append(
                Finding(
                    DUPLICATE,
                    out_id,
                    offset,
                    ts,
                    f"published {ts - int(previous[i])} ms after the last time",
                )
            )
        elif violation[i]:
            audit.findings.append(
                Finding(
                    ORDER_VIOLATION,
                    out_id,
                    offset,
                    ts,
                    f"input offset {int(source[i])} published after input offset "
                    f"{int(newest_before[i])}",
                )
            )
        if changed[i]:
            audit.findings.append(
                Finding(
                    CONTENT_MISMATCH,
                    out_id,
                    offset,
                    ts,
                    f"key, value or headers differ from input offset {int(source[i])}",
                )
            )

    # Input: each checked valid occurrence is published or repeats a publication of its
    # id from an earlier input offset dated at or after its timestamp minus the window
    # and slack; what is neither is missing, or unverifiable when the publication it
    # lacks may have been deleted from the output. Then missing dead letters.
    checked_valid = checked & in_valid
    audit.input = int(checked.sum())
    audit.valid = int(checked_valid.sum())
    audit.distinct = len(np.unique(in_code[checked_valid]))
    published_input = np.zeros(len(in_code), dtype=bool)
    published_input[source_row[has_source]] = True
    latest = _latest_earlier_publication(
        in_code, r.input_offset, r.input_timestamp_ms, out_code, source, r.output_timestamp_ms
    )
    earliest = r.input_timestamp_ms - window_ms - slack_ms
    unaccounted = checked_valid & ~published_input & ~((latest != _NONE) & (latest >= earliest))
    horizon = retention.output_horizon_ms()
    blind = unaccounted & (earliest < (_NONE if horizon is None else horizon))
    ever = np.zeros(n_codes, dtype=bool)
    ever[out_code[out_valid]] = True
    no_dead_letter = checked & ~in_valid & ~np.isin(r.input_offset, r.dead_origin_offset)
    lost = retention.lost_input(partition, audit_range)
    if lost is not None:
        start, end = lost
        audit.unverifiable += end - start
        first_ts = int(r.input_timestamp_ms[0]) if len(r.input_timestamp_ms) else 0
        exact = audit_range.offsets is not None
        audit.findings.append(
            Finding(
                UNVERIFIABLE,
                None,
                start,
                first_ts,
                f"input offsets {start}-{end - 1} deleted by retention"
                + ("" if exact else ": the range starts before the oldest retained record"),
            )
        )
    for i in np.flatnonzero(unaccounted | no_dead_letter):
        offset, ts = int(r.input_offset[i]), int(r.input_timestamp_ms[i])
        if blind[i]:
            audit.unverifiable += 1
            audit.findings.append(
                Finding(
                    UNVERIFIABLE,
                    r.input_id[i].as_py(),
                    offset,
                    ts,
                    "not published, and output it could be accounted for by is deleted "
                    f"(oldest retained output record: {horizon})",
                )
            )
        elif in_valid[i]:
            audit.findings.append(
                Finding(
                    MISSING,
                    r.input_id[i].as_py(),
                    offset,
                    ts,
                    "not published within the window" if ever[in_code[i]] else "not published",
                )
            )
        else:
            audit.findings.append(
                Finding(
                    MISSING_DEAD_LETTER,
                    None,
                    offset,
                    ts,
                    f"invalid ({r.input_reason[i].as_py()}) but no dead letter",
                )
            )

    # Dead letters: those of checked input (or, for a time range, dated in it).
    of_checked = (r.dead_origin_offset >= 0) & np.isin(r.dead_origin_offset, checked_offsets)
    counted = of_checked | (_within(r.dead_timestamp_ms, lo, hi) & (audit_range.offsets is None))
    audit.dead_lettered = int(counted.sum())
    for reason in r.dead_reason.filter(pa.array(counted)).to_pylist():
        audit.dead_lettered_by_reason[reason or "unknown"] += 1
    return audit


def _latest_earlier_publication(
    in_code: npt.NDArray[np.int64],
    in_offset: npt.NDArray[np.int64],
    in_ts: npt.NDArray[np.int64],
    out_code: npt.NDArray[np.int64],
    source: npt.NDArray[np.int64],
    out_ts: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per input record, the newest timestamp among publications of its id from an
    earlier input offset (an output without a source in the input read counts as
    earlier than all of it); `_NONE` when there is none."""
    pubs = out_code >= 0
    pub_code, pub_ts = out_code[pubs], out_ts[pubs]
    pub_at = np.where(source[pubs] >= 0, source[pubs], -1)
    n_in, n_pub = len(in_code), len(pub_code)
    # Events sorted by (id, offset), a publication before a query at the same offset
    # (its own occurrence is not earlier than itself: it sorts after it instead).
    code = np.concatenate([pub_code, in_code])
    at = np.concatenate([pub_at, in_offset])
    is_query = np.concatenate([np.zeros(n_pub, dtype=bool), np.ones(n_in, dtype=bool)])
    times, rank = np.unique(np.concatenate([pub_ts, in_ts]), return_inverse=True)
    rank = rank.astype(np.int64)
    order = np.lexsort((~is_query, at, code))
    # Running maximum of publication time ranks within each id: each id's values are
    # lifted by code * k, so a maximum never crosses from one id into the next.
    k = len(times) + 1
    lifted = code * k + np.where(is_query, -1, rank[: n_pub + n_in])
    running = np.maximum.accumulate(lifted[order]) if len(order) else lifted
    found = running - code[order] * k
    # A query's running maximum must not include its own publication: queries sort
    # before publications at the same offset (lexsort key ~is_query: False first).
    latest = np.full(n_in, _NONE, dtype=np.int64)
    query_rows = order[is_query[order]] - n_pub
    got = found[is_query[order]]
    has = (got >= 0) & (in_code[query_rows] >= 0)
    latest[query_rows[has]] = times[got[has]]
    return latest


_NONE: Final = np.iinfo(np.int64).min
"""No publication (an int64 no timestamp reaches)."""
_NEVER: Final = np.iinfo(np.int64).max
"""No output retained: every publication may have been deleted."""


def _id_codes(
    input_ids: pa.Array, output_ids: pa.Array
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    """Each id as an integer code shared by inputs and outputs (-1: no id), and how
    many distinct ids there are."""
    encoded = pc.dictionary_encode(pa.chunked_array([input_ids, output_ids], pa.string()))
    codes = pa.chunked_array([c.indices for c in encoded.chunks], pa.int32())
    flat = _ints(codes.combine_chunks().fill_null(-1).to_numpy())
    n_codes = len(encoded.chunks[0].dictionary) if encoded.num_chunks else 0
    return flat[: len(input_ids)], flat[len(input_ids) :], n_codes


def _first_occurrence(
    in_code: npt.NDArray[np.int64],
    in_ts: npt.NDArray[np.int64],
    in_offset: npt.NDArray[np.int64],
    out_code: npt.NDArray[np.int64],
    out_ts: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per output record, the first input offset with its id and timestamp (-1: none)."""
    # One sortable key per (id, timestamp): the id's code times the number of distinct
    # timestamps plus the timestamp's rank.
    times, rank = np.unique(np.concatenate([in_ts, out_ts]), return_inverse=True)
    in_key = in_code * len(times) + rank[: len(in_ts)]
    out_key = out_code * len(times) + rank[len(in_ts) :]
    valid = in_code >= 0
    key, offset = in_key[valid], in_offset[valid]
    order = np.lexsort((offset, key))
    key, offset = key[order], offset[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    key, offset = key[first], offset[first]
    if not len(key):
        return np.full(len(out_code), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(key, out_key), len(key) - 1)
    return np.where((out_code >= 0) & (key[at] == out_key), offset[at], -1)


def _previous_publication(
    out_code: npt.NDArray[np.int64], out_ts: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Per output record, the timestamp of the same id's previous output record."""
    previous = np.full(len(out_code), _NONE, dtype=np.int64)
    order = np.lexsort((np.arange(len(out_code)), out_code))
    code, ts = out_code[order], out_ts[order]
    repeat = np.zeros(len(code), dtype=bool)
    repeat[1:] = (code[1:] == code[:-1]) & (code[1:] >= 0)
    previous[order[repeat]] = ts[np.flatnonzero(repeat) - 1]
    return previous
