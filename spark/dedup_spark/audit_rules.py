"""The reconciliation audit of a pipeline under ownership, as pure rules over what was read.

The contract it checks: `owner(id) = (murmur2(id) & 0x7fffffff) % workers`; worker `w`
publishes only the ids it owns, to output partition `w`, whatever input partition an
occurrence arrived on (a worker forwards what it does not own through the internal topic
to its owner, which publishes it unchanged plus the `dedup.id` header). Which occurrence
of an id is published first is not defined across partitions, so the audit groups by id
across all partitions, with its own hash (`murmur2.py`, not the worker's).

Input: the input records (partition, offset, timestamp, id under the pipeline's rules or
dead-letter reason, content digest), the output records (partition, offset, timestamp,
id, digest), the dead letters (with the input partition and offset they name) and the
forwarded records their owner has not consumed yet (`Forwarded`, by `dedup.origin`). Only
input in range (`AuditRange`), committed by the pipeline and, if forwarded, consumed by
its owner is checked; the rest is `pending`. Counted: duplicates, misplaced, missing
(with the `slack` of `dedup_contract.window`), unverifiable (`Retention`), content
mismatches (`source.content_digest`), missing dead letters, unexpected, order violations,
per partition and in total: each defined in docs/audit.md, "What it counts". The audit
passes when every failure count is zero (`passed(totals, fail_on_unverifiable=...)`).

Nothing here does I/O. The work is split so Spark can run it in groups: `audit_ids` (all
records of a set of ids, across partitions), `audit_invalid` (one input partition's
invalid records and dead letters), `order_violations` (one output partition's
publications and their sources) and `lost_input` (retention, per input partition);
`audit_records` runs all of them in one process (unit tests, `bench/audit.py`'s reader).
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
MISPLACED: Final = "misplaced"
FINDING_KINDS: Final = (
    DUPLICATE,
    MISPLACED,
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
    partition: int = 0  # of the input topic


class OutputRecord(NamedTuple):
    offset: int
    timestamp_ms: int
    id: str | None  # None: the output record has no valid id (itself unexpected)
    digest: int | None = None  # of key, value and headers without `dedup.id`
    partition: int = 0  # of the output topic


class DeadLetter(NamedTuple):
    origin_offset: int | None
    timestamp_ms: int
    reason: str | None
    origin_partition: int = 0  # the input partition its headers name


class Forwarded(NamedTuple):
    """An internal-topic record its owner has not consumed yet (at or above the group's
    committed offset of its internal partition): the input occurrence its `dedup.origin`
    names is pending, not missing."""

    id: str | None
    origin_partition: int
    origin_offset: int


class Finding(NamedTuple):
    """One thing wrong, with where to look: the output partition and offset
    (duplicates, misplaced, unexpected, order violations, content mismatches) or the
    input partition and offset (missing, missing dead letters, unverifiable: for a
    deleted span, its first offset)."""

    kind: str
    id: str | None
    offset: int
    timestamp_ms: int
    detail: str
    partition: int = 0


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
        self,
        partitions: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        timestamps_ms: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.bool_]:
        """Which input records (given as columns) are in range."""
        if self.offsets is not None:
            mask = np.zeros(len(offsets), dtype=bool)
            for partition, bounds in self.offsets.items():
                mask |= (partitions == partition) & _within(offsets, *bounds)
            return mask
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
    """What retention left of one partition number when the audit read it: the log
    start offsets of the input and the output partition of that number (Kafka's low watermarks; 0: nothing
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
    "misplaced",
    "unverifiable",
)
FAILING: Final = (
    "duplicates",
    "missing",
    "missingDeadLetters",
    "unexpected",
    "orderViolations",
    "contentMismatches",
    "misplaced",
)
"""Counts that fail an audit whatever the settings; `unverifiable` fails it by default."""

_COUNT_OF_KIND: Final = {
    DUPLICATE: "duplicates",
    MISSING: "missing",
    MISSING_DEAD_LETTER: "missingDeadLetters",
    UNEXPECTED: "unexpected",
    ORDER_VIOLATION: "orderViolations",
    CONTENT_MISMATCH: "contentMismatches",
    MISPLACED: "misplaced",
}
"""The count each kind of finding adds one to (`unverifiable` counts offsets instead)."""


def totals_of(counts: Mapping[str, int]) -> dict[str, Any]:
    """`counts` with the derived input duplicate rate (1 - distinct / valid)."""
    out: dict[str, Any] = {name: int(counts.get(name, 0)) for name in COUNT_NAMES}
    valid = out["valid"]
    out["inputDuplicateRate"] = round(1 - out["distinct"] / valid, 6) if valid else 0.0
    return out


def add_totals(
    parts: Iterable[Mapping[str, Any]], *, distinct: int | None = None
) -> dict[str, Any]:
    """The sum of per-partition totals, rate recomputed. `distinct`: the distinct ids
    across partitions (an id may occur on several, so the per-partition counts do not
    add up to it); without it, their sum."""
    summed: Counter[str] = Counter()
    for part in parts:
        for name in COUNT_NAMES:
            summed[name] += int(part.get(name, 0))
    if distinct is not None:
        summed["distinct"] = distinct
    return totals_of(summed)


def passed(totals: Mapping[str, Any], *, fail_on_unverifiable: bool = True) -> bool:
    """No finding of loss, duplication, misplacement or change; and, unless told
    otherwise, nothing that retention kept from being verified."""
    failing = (*FAILING, "unverifiable") if fail_on_unverifiable else FAILING
    return all(int(totals.get(name, 0)) == 0 for name in failing)


@dataclass
class AuditResult:
    """What (part of) an audit found: counts per partition number (its input partition's
    and its output partition's, under their own names), dead letters by reason per input
    partition, the distinct ids across partitions, and the findings."""

    counts: dict[int, Counter[str]] = field(default_factory=dict)
    by_reason: dict[int, Counter[str]] = field(default_factory=dict)
    distinct_ids: int = 0
    findings: list[Finding] = field(default_factory=list)

    def add(self, partition: int, name: str, n: int = 1) -> None:
        if n:
            self.counts.setdefault(partition, Counter())[name] += n

    def found(self, finding: Finding) -> None:
        self.findings.append(finding)
        if finding.kind in _COUNT_OF_KIND:
            self.add(finding.partition, _COUNT_OF_KIND[finding.kind])

    def merge(self, other: AuditResult) -> None:
        for p, counts in other.counts.items():
            self.counts.setdefault(p, Counter()).update(counts)
        for p, reasons in other.by_reason.items():
            self.by_reason.setdefault(p, Counter()).update(reasons)
        self.distinct_ids += other.distinct_ids
        self.findings.extend(other.findings)

    def partition_totals(self, partition: int) -> dict[str, Any]:
        return totals_of(self.counts.get(partition, Counter()))

    def totals(self) -> dict[str, Any]:
        """The counts under the summary's names (docs/design.md, "Result to the pipeline"),
        over all partitions."""
        return add_totals(self.counts.values(), distinct=self.distinct_ids)

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def dead_lettered_by_reason(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for reasons in self.by_reason.values():
            out.update(reasons)
        return out

    def _total(self, name: str) -> int:
        return sum(c[name] for c in self.counts.values())

    @property
    def input(self) -> int:
        return self._total("input")

    @property
    def valid(self) -> int:
        return self._total("valid")

    @property
    def published(self) -> int:
        return self._total("published")

    @property
    def pending(self) -> int:
        return self._total("pending")

    @property
    def unverifiable(self) -> int:
        return self._total("unverifiable")

    @property
    def dead_lettered(self) -> int:
        return self._total("deadLettered")

    @property
    def distinct(self) -> int:
        return self.distinct_ids


NO_DIGEST: Final = np.iinfo(np.int64).min
"""A record whose content is not compared."""
_NONE: Final = np.iinfo(np.int64).min
"""No publication (an int64 no timestamp reaches)."""
_NEVER: Final = np.iinfo(np.int64).max
"""No output retained: every publication may have been deleted."""


def _ints(values: Sequence[int] | npt.ArrayLike) -> npt.NDArray[np.int64]:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _column_ints(table: pa.Table, name: str, null: int = -1) -> npt.NDArray[np.int64]:
    column = table.column(name).combine_chunks().cast(pa.int64()).fill_null(null)
    return _ints(column.to_numpy())


def _digests(table: pa.Table) -> npt.NDArray[np.int64]:
    if "digest" not in table.column_names:
        return np.full(table.num_rows, NO_DIGEST, dtype=np.int64)
    return _column_ints(table, "digest", NO_DIGEST)


def _strings(table: pa.Table, name: str) -> pa.Array:
    return table.column(name).combine_chunks().cast(pa.string())


# --- the rules over ids ----------------------------------------------------------------


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
            _ints([r.partition for r in valid]),
            _ints([r.offset for r in valid]),
            _ints([r.timestamp_ms for r in valid]),
            pa.array([r.id for r in valid], pa.string()),
            _ints([NO_DIGEST if r.digest is None else r.digest for r in valid]),
            _ints([r.partition for r in outputs]),
            _ints([r.offset for r in outputs]),
            _ints([r.timestamp_ms for r in outputs]),
            pa.array([r.id for r in outputs], pa.string()),
            _ints([NO_DIGEST if r.digest is None else r.digest for r in outputs]),
            _ints([f.origin_partition for f in forwarded]),
            _ints([f.origin_offset for f in forwarded]),
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
            _column_ints(inputs, "partition"),
            _column_ints(inputs, "offset"),
            _column_ints(inputs, "timestamp_ms"),
            _strings(inputs, "id"),
            _digests(inputs),
            _column_ints(outputs, "partition"),
            _column_ints(outputs, "offset"),
            _column_ints(outputs, "timestamp_ms"),
            _strings(outputs, "id"),
            _digests(outputs),
            _ints([]) if forwarded is None else _column_ints(forwarded, "origin_partition"),
            _ints([]) if forwarded is None else _column_ints(forwarded, "origin_offset"),
        )


SOURCES_SCHEMA: Final = pa.schema(
    [
        ("partition", pa.int32()),  # the output partition
        ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("id", pa.string()),
        ("source_partition", pa.int32()),
        ("source_offset", pa.int64()),
        ("checked", pa.bool_()),
    ]
)
"""Per output record with an input occurrence: where that occurrence is, and whether the
record's order is checked (in range, neither unexpected nor a duplicate); the input of
`order_violations`."""


def audit_ids(
    records: IdColumns,
    *,
    workers: int | None,
    audit_range: AuditRange,
    window_ms: int,
    slack_ms: int = 0,
    committed: Mapping[int, int] | None = None,
    retention: Mapping[int, Retention] | None = None,
) -> tuple[AuditResult, pa.Table]:
    """Every rule over ids (module docstring) for all records of a set of ids,
    vectorised: ids become integer codes once, and every rule is an array operation.
    `workers`: the owner function's modulus (None: placement is not checked);
    `committed`: the group's committed offset per input partition (None: all input is
    the pipeline's; a partition not named has committed nothing). Returns the counts and
    findings (output findings in output order, then input findings in input order) and
    the sources for `order_violations`."""
    if window_ms <= 0:
        raise ValueError(f"the window must be positive, not {window_ms} ms")
    r = records
    retention = retention or {}
    result = AuditResult()

    # Inputs in (partition, offset) order: a row's index orders occurrences.
    by_place = _place_order(r.input_partition, r.input_offset)
    ip, io = r.input_partition[by_place], r.input_offset[by_place]
    it, idig = r.input_timestamp_ms[by_place], r.input_digest[by_place]
    input_id = r.input_id.take(pa.array(by_place, pa.int64()))
    out_order = _place_order(r.output_partition, r.output_offset)
    op, oo = r.output_partition[out_order], r.output_offset[out_order]
    ot, odig = r.output_timestamp_ms[out_order], r.output_digest[out_order]
    output_id = r.output_id.take(pa.array(out_order, pa.int64()))
    in_code, out_code, dictionary = _id_codes(input_id, output_id)
    n_codes = max(len(dictionary), 1)  # per-id arrays are indexed with code -1 clipped to 0
    out_valid = out_code >= 0
    n_in = len(in_code)

    # Which input is checked: in range, committed, and not waiting at its owner.
    in_range = audit_range.input_mask(ip, io, it)
    pending = np.zeros(n_in, dtype=bool)
    if committed is not None:
        floor = np.zeros(n_in, dtype=np.int64)
        for p, _ in _per_partition(ip):
            floor[ip == p] = committed.get(int(p), 0)
        pending |= io >= floor
    if len(r.forwarded_offset):
        pending |= _pairs_in(ip, io, r.forwarded_partition, r.forwarded_offset)
    pending &= in_range
    checked = in_range & ~pending

    # The time span of the range, for output records without an input occurrence.
    lo: int | None
    hi: int | None
    if audit_range.offsets is None:
        lo, hi = audit_range.from_ms, audit_range.to_ms
    elif checked.any():
        lo, hi = int(it[checked].min()), int(it[checked].max()) + 1
    else:
        lo, hi = 0, 0

    # Output: the input occurrence each record published (same id and timestamp, the
    # first by partition and offset, preferring its contents), then duplicates, unexpected,
    # placement, contents.
    times, rank = np.unique(np.concatenate([it, ot]), return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    in_key = in_code * len(times) + rank[:n_in]
    out_key = out_code * len(times) + rank[n_in:]
    source = _first_row(in_key, out_key) if n_in else np.full(len(out_code), -1, np.int64)
    # Copies of an id with one timestamp (a millisecond) can arrive on several partitions;
    # when their contents differ, the output's contents say which one it published.
    other = (source >= 0) & (odig != NO_DIGEST)
    other[other] = idig[source[other]] != odig[other]
    if other.any():
        rows = np.flatnonzero(other)
        same_row = _first_pair_row(in_key, idig, out_key[rows], odig[rows])
        source[rows] = np.where(same_row >= 0, same_row, source[rows])
    has_source = source >= 0
    src = np.maximum(source, 0)
    out_in_range = (
        np.where(has_source, checked[src], _within(ot, lo, hi)) if n_in else _within(ot, lo, hi)
    )
    for p, n in _per_partition(op[out_in_range]):
        result.add(int(p), "published", int(n))
    in_input = np.zeros(n_codes, dtype=bool)
    in_input[in_code] = True
    unexpected = out_in_range & ~(out_valid & in_input[np.maximum(out_code, 0)])
    previous = _previous_publication(out_code, ot, op, oo)
    duplicate = out_in_range & ~unexpected & (previous != _NONE) & (ot - previous < window_ms)
    misplaced = np.zeros(len(out_code), dtype=bool)
    owner = np.zeros(n_codes, dtype=np.int64)
    if workers is not None and len(dictionary):
        from dedup_spark.murmur2 import owners

        owner = owners(dictionary, workers)
        misplaced = out_in_range & ~unexpected & (op != owner[np.maximum(out_code, 0)])
    changed = np.zeros(len(out_code), dtype=bool)
    if n_in:
        # Most records match the first occurrence with their id and timestamp; the rest
        # are compared with every occurrence with it.
        compare = out_in_range & ~unexpected & has_source & (odig != NO_DIGEST)
        compare &= idig[src] != odig
        if compare.any():
            rows = np.flatnonzero(compare)
            unknown = np.isin(out_key[rows], in_key[idig == NO_DIGEST])
            same = _rows_in(out_key[rows], odig[rows], in_key, idig)
            changed[rows] = ~unknown & ~same
    for i in np.flatnonzero(unexpected | duplicate | misplaced | changed):
        out_id = output_id[i].as_py()
        part, offset, ts = int(op[i]), int(oo[i]), int(ot[i])
        if unexpected[i]:
            result.found(Finding(UNEXPECTED, out_id, offset, ts, "no input occurrence", part))
        elif duplicate[i]:
            result.found(
                Finding(
                    DUPLICATE,
                    out_id,
                    offset,
                    ts,
                    f"published {ts - int(previous[i])} ms after the last time",
                    part,
                )
            )
        if misplaced[i]:
            result.found(
                Finding(
                    MISPLACED,
                    out_id,
                    offset,
                    ts,
                    f"on output partition {part}, its owner is {int(owner[out_code[i]])} "
                    f"of {workers}",
                    part,
                )
            )
        if changed[i]:
            at = f"{int(ip[source[i]])}:{int(io[source[i]])}"
            result.found(
                Finding(
                    CONTENT_MISMATCH,
                    out_id,
                    offset,
                    ts,
                    f"key, value or headers differ from every input occurrence with its id "
                    f"and timestamp (first: {at})",
                    part,
                )
            )
    ordered = has_source & ~(out_in_range & (unexpected | duplicate))
    sources = pa.table(
        {
            "partition": pa.array(op[ordered], pa.int32()),
            "offset": pa.array(oo[ordered], pa.int64()),
            "timestamp_ms": pa.array(ot[ordered], pa.int64()),
            "id": output_id.filter(pa.array(ordered)),
            "source_partition": pa.array(ip[source[ordered]] if n_in else [], pa.int32()),
            "source_offset": pa.array(io[source[ordered]] if n_in else [], pa.int64()),
            "checked": pa.array(out_in_range[ordered], pa.bool_()),
        },
        schema=SOURCES_SCHEMA,
    )

    # Input: each checked occurrence is published, or accounted for by a publication of
    # its id within window + slack of it from elsewhere than a later offset of its own
    # input partition (module docstring); what is neither is missing, or unverifiable
    # when the publication it lacks may have been deleted from the output.
    for p, n in _per_partition(ip[checked]):
        result.add(int(p), "input", int(n))
        result.add(int(p), "valid", int(n))
    for p, n in _per_partition(ip[pending]):
        result.add(int(p), "pending", int(n))
    lanes_in = int(ip.max(initial=0)) + 1
    pairs = _distinct(in_code[checked] * lanes_in + ip[checked])
    for p, n in _per_partition(pairs % lanes_in):
        result.add(int(p), "distinct", int(n))
    result.distinct_ids = len(_distinct(in_code[checked]))
    published_input = np.zeros(n_in, dtype=bool)
    published_input[source[has_source]] = True
    reach = window_ms + slack_ms
    pub_code, pub_ts = out_code[out_valid], ot[out_valid]
    pub_part = np.where(has_source, ip[src] if n_in else -1, -1)[out_valid]
    pub_at = np.where(has_source, io[src] if n_in else -1, -1)[out_valid]
    lanes = int(max(ip.max(initial=0), pub_part.max(initial=0))) + 2
    # Only unpublished checked occurrences need accounting for.
    ask = np.flatnonzero(checked & ~published_input)
    q_code, q_part, q_at, q_ts = in_code[ask], ip[ask], io[ask], it[ask]
    pub_times = np.unique(pub_ts)
    near = _count_near(pub_code, pub_ts, q_code, q_ts, reach, pub_times) - _count_near(
        pub_code * lanes + pub_part + 1, pub_ts, q_code * lanes + q_part + 1, q_ts, reach, pub_times
    )
    latest = _latest_earlier_publication(
        q_code * lanes + q_part + 1,
        q_at,
        q_ts,
        np.where(pub_part >= 0, pub_code * lanes + pub_part + 1, -1),
        pub_at,
        pub_ts,
    )
    earliest = it - reach
    unaccounted = np.zeros(n_in, dtype=bool)
    unaccounted[ask] = (near == 0) & ~((latest != _NONE) & (latest >= q_ts - reach))
    horizon = _horizons(retention, owner[in_code] if workers is not None else None, n_in)
    blind = unaccounted & (earliest < horizon)
    ever = np.zeros(n_codes, dtype=bool)
    ever[out_code[out_valid]] = True
    for i in np.flatnonzero(unaccounted):
        part, offset, ts = int(ip[i]), int(io[i]), int(it[i])
        if blind[i]:
            result.add(part, "unverifiable")
            result.found(
                Finding(
                    UNVERIFIABLE,
                    input_id[i].as_py(),
                    offset,
                    ts,
                    "not published, and output it could be accounted for by is deleted "
                    f"(oldest retained output record: {int(horizon[i])})",
                    part,
                )
            )
        else:
            result.found(
                Finding(
                    MISSING,
                    input_id[i].as_py(),
                    offset,
                    ts,
                    "not published within the window" if ever[in_code[i]] else "not published",
                    part,
                )
            )
    return result, sources


def order_violations(sources: pa.Table) -> list[Finding]:
    """Per (input partition, output partition) pair, the output records (`checked`)
    whose input offset is below that of an earlier output record of the pair (by output
    offset). `sources`: SOURCES_SCHEMA rows, of any output partitions."""
    if sources.num_rows == 0:
        return []
    out_part = _column_ints(sources, "partition")
    out_offset = _column_ints(sources, "offset")
    src_part = _column_ints(sources, "source_partition")
    src_offset = _column_ints(sources, "source_offset")
    checked = np.asarray(sources.column("checked").combine_chunks().fill_null(False))
    _, lane = np.unique(out_part * (int(src_part.max()) + 1) + src_part, return_inverse=True)
    lane = lane.astype(np.int64).reshape(-1)
    order = np.lexsort((out_offset, lane))
    k = int(src_offset.max()) + 2
    lifted = lane[order] * k + src_offset[order] + 1  # >= lane * k + 1 within a lane
    running = np.maximum.accumulate(lifted)
    before = np.concatenate([[-1], running[:-1]]) - lane[order] * k - 1  # -1..: none yet
    violation = checked[order] & (src_offset[order] < before)
    findings = []
    ids = sources.column("id").combine_chunks()
    stamps = _column_ints(sources, "timestamp_ms")
    for j in np.flatnonzero(violation):
        i = order[j]
        findings.append(
            Finding(
                ORDER_VIOLATION,
                ids[i].as_py(),
                int(out_offset[i]),
                int(stamps[i]),
                f"input offset {int(src_offset[i])} of input partition {int(src_part[i])} "
                f"published after input offset {int(before[j])}",
                int(out_part[i]),
            )
        )
    return sorted(findings, key=lambda f: (f.partition, f.offset))


def audit_invalid(
    partition: int,
    inputs: pa.Table,
    dead: pa.Table,
    *,
    audit_range: AuditRange,
    committed_offset: int | None = None,
) -> AuditResult:
    """One input partition's invalid records (`offset`, `timestamp_ms`, `reason`
    columns, in offset order) against the dead letters naming it (`origin_offset`,
    `timestamp_ms`, `reason`): missing dead letters, and the dead letters counted (of
    checked invalid input or, for a time range, dated in it)."""
    result = AuditResult()
    offsets = _column_ints(inputs, "offset")
    stamps = _column_ints(inputs, "timestamp_ms")
    reasons = _strings(inputs, "reason")
    in_range = audit_range.input_mask(np.full(len(offsets), partition), offsets, stamps)
    pending = np.zeros(len(offsets), dtype=bool)
    if committed_offset is not None:
        pending = in_range & (offsets >= committed_offset)
    checked = in_range & ~pending
    result.add(partition, "input", int(checked.sum()))
    result.add(partition, "pending", int(pending.sum()))
    origin = _column_ints(dead, "origin_offset")
    for i in np.flatnonzero(checked & ~np.isin(offsets, origin)):
        result.found(
            Finding(
                MISSING_DEAD_LETTER,
                None,
                int(offsets[i]),
                int(stamps[i]),
                f"invalid ({reasons[i].as_py()}) but no dead letter",
                partition,
            )
        )
    counted = (origin >= 0) & np.isin(origin, offsets[checked])
    if audit_range.offsets is None:
        counted |= _within(
            _column_ints(dead, "timestamp_ms"), audit_range.from_ms, audit_range.to_ms
        )
    result.add(partition, "deadLettered", int(counted.sum()))
    reasons_counted = Counter(
        reason or "unknown"
        for reason in _strings(dead, "reason").filter(pa.array(counted)).to_pylist()
    )
    if reasons_counted:
        result.by_reason[partition] = reasons_counted
    return result


def lost_input(partition: int, retention: Retention, audit_range: AuditRange) -> AuditResult:
    """The input offsets of one partition that retention deleted before the audit read
    them (`Retention.lost_input`), as one finding and their count."""
    result = AuditResult()
    lost = retention.lost_input(partition, audit_range)
    if lost is None:
        return result
    start, end = lost
    result.add(partition, "unverifiable", end - start)
    exact = audit_range.offsets is not None
    result.found(
        Finding(
            UNVERIFIABLE,
            None,
            start,
            retention.input_first_ms or 0,
            f"input offsets {start}-{end - 1} deleted by retention"
            + ("" if exact else ": the range starts before the oldest retained record"),
            partition,
        )
    )
    return result


def audit_records(
    inputs: Sequence[InputRecord],
    outputs: Sequence[OutputRecord],
    dead_letters: Sequence[DeadLetter],
    forwarded: Sequence[Forwarded] = (),
    *,
    workers: int | None,
    audit_range: AuditRange,
    window_ms: int,
    slack_ms: int = 0,
    committed: Mapping[int, int] | None = None,
    retention: Mapping[int, Retention] | None = None,
) -> AuditResult:
    """The whole audit (module docstring) in one process, from records of any
    partitions: `audit_ids` over every id, `order_violations`, `audit_invalid` per input
    partition and `lost_input` per partition `retention` names."""
    retention = retention or {}
    result, sources = audit_ids(
        IdColumns.of_records(inputs, outputs, forwarded),
        workers=workers,
        audit_range=audit_range,
        window_ms=window_ms,
        slack_ms=slack_ms,
        committed=committed,
        retention=retention,
    )
    for finding in order_violations(sources):
        result.found(finding)
    partitions = {r.partition for r in inputs} | {
        d.origin_partition for d in dead_letters if d.origin_offset is not None
    }
    for p in sorted(partitions):
        invalid = [r for r in inputs if r.partition == p and r.id is None]
        invalid.sort(key=lambda r: r.offset)
        dead = [d for d in dead_letters if d.origin_partition == p]
        result.merge(
            audit_invalid(
                p,
                pa.table(
                    {
                        "offset": pa.array([r.offset for r in invalid], pa.int64()),
                        "timestamp_ms": pa.array([r.timestamp_ms for r in invalid], pa.int64()),
                        "reason": pa.array([r.reason for r in invalid], pa.string()),
                    }
                ),
                pa.table(
                    {
                        "origin_offset": pa.array(
                            [-1 if d.origin_offset is None else d.origin_offset for d in dead],
                            pa.int64(),
                        ),
                        "timestamp_ms": pa.array([d.timestamp_ms for d in dead], pa.int64()),
                        "reason": pa.array([d.reason for d in dead], pa.string()),
                    }
                ),
                audit_range=audit_range,
                committed_offset=None if committed is None else committed.get(p, 0),
            )
        )
    for p in sorted(retention):
        result.merge(lost_input(p, retention[p], audit_range))
    return result


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
) -> AuditResult:
    """The rules for one input partition whose ids are all published to the output
    partition of the same number (every record is placed there; placement is not
    checked): the audit of one worker that owns every id it reads."""
    return audit_records(
        [r._replace(partition=partition) for r in inputs],
        [r._replace(partition=partition) for r in outputs],
        [d._replace(origin_partition=partition) for d in dead_letters],
        workers=None,
        audit_range=audit_range,
        window_ms=window_ms,
        slack_ms=slack_ms,
        committed=None if committed_offset is None else {partition: committed_offset},
        retention=None if retention is None else {partition: retention},
    )


# --- array helpers ---------------------------------------------------------------------


def _id_codes(
    input_ids: pa.Array, output_ids: pa.Array
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], pa.Array]:
    """Each id as an integer code shared by inputs and outputs (-1: no id), and the
    distinct ids (the code's dictionary)."""
    encoded = pc.dictionary_encode(pa.concat_arrays([input_ids, output_ids]))
    flat = _ints(encoded.indices.cast(pa.int64()).fill_null(-1).to_numpy())
    return flat[: len(input_ids)], flat[len(input_ids) :], encoded.dictionary


def _per_partition(partitions: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """(partition, how many times it occurs) for each partition present."""
    counts = np.bincount(partitions) if len(partitions) else np.zeros(0, dtype=np.int64)
    return [(int(p), int(counts[p])) for p in np.flatnonzero(counts)]


def _distinct(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The distinct values, sorted (a sort: faster here than `np.unique`'s hashing)."""
    ordered = np.sort(values)
    keep = np.ones(len(ordered), dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def _place_order(
    partitions: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The order of records by (partition, offset) (none needed when already so)."""
    key = partitions * (int(offsets.max(initial=0)) + 1) + offsets
    if len(key) < 2 or bool((key[1:] >= key[:-1]).all()):
        return np.arange(len(key), dtype=np.int64)
    return np.argsort(key, kind="stable").astype(np.int64)


def _pairs_in(
    parts: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    in_parts: npt.NDArray[np.int64],
    in_offsets: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Which (partition, offset) pairs are among the given ones."""
    k = int(max(offsets.max(initial=0), in_offsets.max(initial=0))) + 1
    return np.isin(parts * k + offsets, in_parts * k + in_offsets)


def _rows_in(
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


def _first_row(
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


def _first_pair_row(
    in_key: npt.NDArray[np.int64],
    in_value: npt.NDArray[np.int64],
    key: npt.NDArray[np.int64],
    value: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per (key, value) pair, the first input row with that pair (-1: none)."""
    both = np.stack([np.concatenate([in_key, key]), np.concatenate([in_value, value])], axis=1)
    _, pair = np.unique(both, axis=0, return_inverse=True)
    pair = pair.reshape(-1).astype(np.int64)
    found = _first_row(pair[: len(in_key)], pair[len(in_key) :])
    return np.where(key >= 0, found, -1).astype(np.int64)


def _previous_publication(
    code: npt.NDArray[np.int64],
    ts: npt.NDArray[np.int64],
    part: npt.NDArray[np.int64],
    offset: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per output record, the timestamp of the same id's previous publication on any
    partition, by timestamp (ties by partition and offset); `_NONE` for the first."""
    previous = np.full(len(code), _NONE, dtype=np.int64)
    order = np.lexsort((offset, part, ts, code))
    c, t = code[order], ts[order]
    repeat = np.zeros(len(c), dtype=bool)
    repeat[1:] = (c[1:] == c[:-1]) & (c[1:] >= 0)
    previous[order[repeat]] = t[np.flatnonzero(repeat) - 1]
    return previous


def _count_near(
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


def _horizons(
    retention: Mapping[int, Retention], owner_of_row: npt.NDArray[np.int64] | None, n: int
) -> npt.NDArray[np.int64]:
    """Per input row, the time before which a publication of its id may have been
    deleted: that of its owner's output partition, or (owners not known) the latest of
    any output partition; `_NONE` where nothing was deleted."""
    horizon = np.full(n, _NONE, dtype=np.int64)
    for p, kept in retention.items():
        h = kept.output_horizon_ms()
        if h is None:
            continue
        if owner_of_row is None:
            horizon = np.maximum(horizon, h)
        else:
            horizon[owner_of_row == p] = h
    return horizon


def _latest_earlier_publication(
    in_code: npt.NDArray[np.int64],
    in_offset: npt.NDArray[np.int64],
    in_ts: npt.NDArray[np.int64],
    pub_code: npt.NDArray[np.int64],
    pub_at: npt.NDArray[np.int64],
    pub_ts: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Per input record, the newest timestamp among publications of its code (here: id
    and input partition) from an earlier input offset; `_NONE` when there is none.
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
    latest = np.full(n_in, _NONE, dtype=np.int64)
    query_rows = order[is_query[order]] - n_pub
    got = found[is_query[order]]
    has = got >= 0
    latest[query_rows[has]] = times[got[has]]
    return latest
