"""The reconciliation audit of a pipeline under ownership, as pure rules over what was read.

The contract it checks: `owner(id) = (murmur2(id) & 0x7fffffff) % workers`; worker `w`
publishes only the ids it owns, to output partition `w`, whatever input partition an
occurrence arrived on (a worker forwards what it does not own through the internal topic
to its owner, which publishes it unchanged plus the `dedup.id` header). Which occurrence
of an id is published first is not defined across partitions, so the audit groups by id
across all partitions, with its own hash (`murmur2.py`, not the worker's).

What it reads is in `audit_model.py` (input, output, dead-letter and forwarded records,
the range, retention, findings); only input in range, committed by the pipeline and, if
forwarded, consumed by its owner is checked, the rest is `pending`. What it counts
(`audit_result.py`) is defined in docs/audit.md, "What it counts"; the audit passes when
every failure count is zero (`passed(totals, fail_on_unverifiable=...)`).

Nothing here does I/O. The work is split so Spark can run it in groups: `audit_ids` (all
records of a set of ids, across partitions: source matching in `audit_matching.py`, then
one function per rule over the matched frame, here), `audit_invalid` (one input
partition's invalid records and dead letters), `order_violations` (one output
partition's publications and their sources) and `lost_input` (retention, per input
partition); `audit_records` runs all of them in one process (unit tests,
`bench/audit.py`'s reader).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from dedup_spark.audit_arrays import (
    NO_PUBLICATION,
    column_ints,
    count_near,
    distinct_sorted,
    latest_earlier_publication,
    per_partition,
    previous_publication,
    rows_in,
    strings,
    within,
)
from dedup_spark.audit_matching import NO_DIGEST, IdColumns, MatchedIds, match_ids
from dedup_spark.audit_model import (
    CONTENT_MISMATCH,
    DUPLICATE,
    MISPLACED,
    MISSING,
    MISSING_DEAD_LETTER,
    ORDER_VIOLATION,
    UNEXPECTED,
    UNVERIFIABLE,
    AuditRange,
    DeadLetter,
    Finding,
    Forwarded,
    InputRecord,
    OutputRecord,
    Retention,
)
from dedup_spark.audit_result import AuditResult

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


# --- the rules over ids, one function each over the matched frame ------------------------


@dataclass(frozen=True)
class Hits:
    """What one rule found on one side of the frame: which rows (a mask over its output
    rows or its input rows) and the findings, one per row found, in row order."""

    rows: npt.NDArray[np.bool_]
    findings: list[Finding]


def _output_finding(frame: MatchedIds, i: int, kind: str, detail: str) -> Finding:
    return Finding(
        kind,
        frame.output_id[i].as_py(),
        int(frame.output_offset[i]),
        int(frame.output_timestamp_ms[i]),
        detail,
        int(frame.output_partition[i]),
    )


def _input_finding(frame: MatchedIds, i: int, kind: str, detail: str) -> Finding:
    return Finding(
        kind,
        frame.input_id[i].as_py(),
        int(frame.input_offset[i]),
        int(frame.input_timestamp_ms[i]),
        detail,
        int(frame.input_partition[i]),
    )


def unexpected(frame: MatchedIds) -> Hits:
    """Checked output records whose id has no input occurrence (or that have no id)."""
    rows = frame.output_in_range & ~frame.output_of_input
    return Hits(
        rows,
        [
            _output_finding(frame, int(i), UNEXPECTED, "no input occurrence")
            for i in np.flatnonzero(rows)
        ],
    )


def duplicates(frame: MatchedIds, *, window_ms: int) -> Hits:
    """Checked output records of an id with an input occurrence that are dated less than
    the window after the id's previous publication, on any output partition (by
    timestamp, ties by partition and offset)."""
    stamp = frame.output_timestamp_ms
    previous = previous_publication(
        frame.output_code, stamp, frame.output_partition, frame.output_offset
    )
    rows = (
        frame.output_in_range
        & frame.output_of_input
        & (previous != NO_PUBLICATION)
        & (stamp - previous < window_ms)
    )
    return Hits(
        rows,
        [
            _output_finding(
                frame,
                int(i),
                DUPLICATE,
                f"published {int(stamp[i]) - int(previous[i])} ms after the last time",
            )
            for i in np.flatnonzero(rows)
        ],
    )


def misplaced(frame: MatchedIds) -> Hits:
    """Checked output records of an id with an input occurrence that are on another
    output partition than the id's owner (none when placement is not checked)."""
    if frame.workers is None or not len(frame.ids):
        return Hits(np.zeros(len(frame.output_code), dtype=bool), [])
    owner = frame.id_owner[np.maximum(frame.output_code, 0)]
    rows = frame.output_in_range & frame.output_of_input & (frame.output_partition != owner)
    return Hits(
        rows,
        [
            _output_finding(
                frame,
                int(i),
                MISPLACED,
                f"on output partition {int(frame.output_partition[i])}, its owner is "
                f"{int(owner[i])} of {frame.workers}",
            )
            for i in np.flatnonzero(rows)
        ],
    )


def content_mismatches(frame: MatchedIds) -> Hits:
    """Checked output records, with an input occurrence and compared contents, whose key,
    value or headers differ from those of every input occurrence with their id and
    timestamp (not when one of those occurrences' contents are not compared)."""
    changed = np.zeros(len(frame.output_code), dtype=bool)
    source = frame.output_source
    if frame.inputs:
        in_key, in_digest = frame.input_key, frame.input_digest
        out_key, out_digest = frame.output_key, frame.output_digest
        # Most records match the first occurrence with their id and timestamp; the rest
        # are compared with every occurrence with it.
        compare = frame.output_in_range & frame.output_of_input & frame.output_has_source
        compare &= out_digest != NO_DIGEST
        compare &= in_digest[np.maximum(source, 0)] != out_digest
        if compare.any():
            rows = np.flatnonzero(compare)
            unknown = np.isin(out_key[rows], in_key[in_digest == NO_DIGEST])
            same = rows_in(out_key[rows], out_digest[rows], in_key, in_digest)
            changed[rows] = ~unknown & ~same
    findings = []
    for i in np.flatnonzero(changed):
        at = f"{int(frame.input_partition[source[i]])}:{int(frame.input_offset[source[i]])}"
        findings.append(
            _output_finding(
                frame,
                int(i),
                CONTENT_MISMATCH,
                f"key, value or headers differ from every input occurrence with its id "
                f"and timestamp (first: {at})",
            )
        )
    return Hits(changed, findings)


def unaccounted(frame: MatchedIds, *, reach_ms: int) -> npt.NDArray[np.bool_]:
    """The checked input occurrences neither published nor accounted for by a
    publication of their id within `reach_ms` (window + slack) of them from elsewhere
    than a later offset of their own input partition (the owner meets one input
    partition's records in order): missing or unverifiable."""
    ip, io, it = frame.input_partition, frame.input_offset, frame.input_timestamp_ms
    in_code, n_in = frame.input_code, frame.inputs
    source, has_source = frame.output_source, frame.output_has_source
    out_valid = frame.output_valid
    src = np.maximum(source, 0)
    published = np.zeros(n_in, dtype=bool)
    published[source[has_source]] = True
    pub_code, pub_ts = frame.output_code[out_valid], frame.output_timestamp_ms[out_valid]
    pub_part = np.where(has_source, ip[src] if n_in else -1, -1)[out_valid]
    pub_at = np.where(has_source, io[src] if n_in else -1, -1)[out_valid]
    lanes = int(max(ip.max(initial=0), pub_part.max(initial=0))) + 2
    # Only unpublished checked occurrences need accounting for.
    ask = np.flatnonzero(frame.input_checked & ~published)
    q_code, q_part, q_at, q_ts = in_code[ask], ip[ask], io[ask], it[ask]
    pub_times = np.unique(pub_ts)
    # Publications of the id near it, less those from its own input partition ...
    near = count_near(pub_code, pub_ts, q_code, q_ts, reach_ms, pub_times) - count_near(
        pub_code * lanes + pub_part + 1,
        pub_ts,
        q_code * lanes + q_part + 1,
        q_ts,
        reach_ms,
        pub_times,
    )
    # ... and, from its own input partition, the newest from an earlier offset.
    latest = latest_earlier_publication(
        q_code * lanes + q_part + 1,
        q_at,
        q_ts,
        np.where(pub_part >= 0, pub_code * lanes + pub_part + 1, -1),
        pub_at,
        pub_ts,
    )
    out = np.zeros(n_in, dtype=bool)
    out[ask] = (near == 0) & ~((latest != NO_PUBLICATION) & (latest >= q_ts - reach_ms))
    return out


def unverifiable(
    frame: MatchedIds,
    unaccounted: npt.NDArray[np.bool_],
    *,
    reach_ms: int,
    retention: Mapping[int, Retention],
) -> Hits:
    """The `unaccounted` input occurrences a publication could have accounted for that
    retention may have deleted from the output: dated less than `reach_ms` after the
    oldest retained record of their owner's output partition (owners not known: of any)."""
    owner_of_row = frame.id_owner[frame.input_code] if frame.workers is not None else None
    horizon = _horizons(retention, owner_of_row, frame.inputs)
    rows = unaccounted & (frame.input_timestamp_ms - reach_ms < horizon)
    return Hits(
        rows,
        [
            _input_finding(
                frame,
                int(i),
                UNVERIFIABLE,
                "not published, and output it could be accounted for by is deleted "
                f"(oldest retained output record: {int(horizon[i])})",
            )
            for i in np.flatnonzero(rows)
        ],
    )


def missing(frame: MatchedIds, rows: npt.NDArray[np.bool_]) -> Hits:
    """The findings of the missing input occurrences `rows` (those `unaccounted` that
    are not `unverifiable`), saying whether their id was published at all."""
    ever = np.zeros(frame.codes, dtype=bool)
    ever[frame.output_code[frame.output_valid]] = True
    return Hits(
        rows,
        [
            _input_finding(
                frame,
                int(i),
                MISSING,
                "not published within the window" if ever[frame.input_code[i]] else "not published",
            )
            for i in np.flatnonzero(rows)
        ],
    )


def order_sources(frame: MatchedIds, *, unexpected: Hits, duplicates: Hits) -> pa.Table:
    """The SOURCES_SCHEMA rows of the output records with an input occurrence; the
    checked ones that are neither unexpected nor duplicates have their order checked."""
    ordered = frame.output_has_source & ~(unexpected.rows | duplicates.rows)
    source = frame.output_source[ordered]
    n_in = frame.inputs
    return pa.table(
        {
            "partition": pa.array(frame.output_partition[ordered], pa.int32()),
            "offset": pa.array(frame.output_offset[ordered], pa.int64()),
            "timestamp_ms": pa.array(frame.output_timestamp_ms[ordered], pa.int64()),
            "id": frame.output_id.filter(pa.array(ordered)),
            "source_partition": pa.array(frame.input_partition[source] if n_in else [], pa.int32()),
            "source_offset": pa.array(frame.input_offset[source] if n_in else [], pa.int64()),
            "checked": pa.array(frame.output_in_range[ordered], pa.bool_()),
        },
        schema=SOURCES_SCHEMA,
    )


def count_published(frame: MatchedIds, result: AuditResult) -> None:
    """The checked output records, per output partition."""
    for p, n in per_partition(frame.output_partition[frame.output_in_range]):
        result.add(int(p), "published", int(n))


def count_input(frame: MatchedIds, result: AuditResult) -> None:
    """The checked (all valid) and pending input per input partition, the distinct ids
    per input partition and the distinct ids across partitions."""
    ip, checked, code = frame.input_partition, frame.input_checked, frame.input_code
    for p, n in per_partition(ip[checked]):
        result.add(int(p), "input", int(n))
        result.add(int(p), "valid", int(n))
    for p, n in per_partition(ip[frame.input_pending]):
        result.add(int(p), "pending", int(n))
    lanes = int(ip.max(initial=0)) + 1
    pairs = distinct_sorted(code[checked] * lanes + ip[checked])
    for p, n in per_partition(pairs % lanes):
        result.add(int(p), "distinct", int(n))
    result.distinct_ids = len(distinct_sorted(code[checked]))


def _in_row_order(*hits: Hits) -> list[Finding]:
    """The findings of rules over one side of the frame by row, and within a row in the
    order the rules are given."""
    keyed = [
        (int(row), rule, finding)
        for rule, hit in enumerate(hits)
        for row, finding in zip(np.flatnonzero(hit.rows), hit.findings, strict=True)
    ]
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [finding for _, _, finding in keyed]


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
    vectorised: source matching (`match_ids`), then each rule over the matched frame.
    `workers`: the owner function's modulus (None: placement is not checked);
    `committed`: the group's committed offset per input partition (None: all input is
    the pipeline's; a partition not named has committed nothing). Returns the counts and
    findings (output findings in output order, then input findings in input order) and
    the sources for `order_violations`."""
    if window_ms <= 0:
        raise ValueError(f"the window must be positive, not {window_ms} ms")
    frame = match_ids(records, workers=workers, audit_range=audit_range, committed=committed)
    result = AuditResult()

    # Output: unexpected or duplicate (never both), misplaced, changed contents.
    count_published(frame, result)
    ghosts = unexpected(frame)
    repeats = duplicates(frame, window_ms=window_ms)
    for finding in _in_row_order(ghosts, repeats, misplaced(frame), content_mismatches(frame)):
        result.found(finding)
    sources = order_sources(frame, unexpected=ghosts, duplicates=repeats)

    # Input: each checked occurrence is published or accounted for; what is neither is
    # missing, or unverifiable when the publication it lacks may have been deleted.
    count_input(frame, result)
    reach_ms = window_ms + slack_ms
    lost = unaccounted(frame, reach_ms=reach_ms)
    blind = unverifiable(frame, lost, reach_ms=reach_ms, retention=retention or {})
    for finding in _in_row_order(blind, missing(frame, lost & ~blind.rows)):
        if finding.kind == UNVERIFIABLE:
            result.add(finding.partition, "unverifiable")
        result.found(finding)
    return result, sources


def _horizons(
    retention: Mapping[int, Retention], owner_of_row: npt.NDArray[np.int64] | None, n: int
) -> npt.NDArray[np.int64]:
    """Per input row, the time before which a publication of its id may have been
    deleted: that of its owner's output partition, or (owners not known) the latest of
    any output partition; `NO_PUBLICATION` where nothing was deleted."""
    horizon = np.full(n, NO_PUBLICATION, dtype=np.int64)
    for p, kept in retention.items():
        h = kept.output_horizon_ms()
        if h is None:
            continue
        if owner_of_row is None:
            horizon = np.maximum(horizon, h)
        else:
            horizon[owner_of_row == p] = h
    return horizon


def order_violations(sources: pa.Table) -> list[Finding]:
    """Per (input partition, output partition) pair, the output records (`checked`)
    whose input offset is below that of an earlier output record of the pair (by output
    offset). `sources`: SOURCES_SCHEMA rows, of any output partitions."""
    if sources.num_rows == 0:
        return []
    out_part = column_ints(sources, "partition")
    out_offset = column_ints(sources, "offset")
    src_part = column_ints(sources, "source_partition")
    src_offset = column_ints(sources, "source_offset")
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
    stamps = column_ints(sources, "timestamp_ms")
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
    offsets = column_ints(inputs, "offset")
    stamps = column_ints(inputs, "timestamp_ms")
    reasons = strings(inputs, "reason")
    in_range = audit_range.input_mask(np.full(len(offsets), partition), offsets, stamps)
    pending = np.zeros(len(offsets), dtype=bool)
    if committed_offset is not None:
        pending = in_range & (offsets >= committed_offset)
    checked = in_range & ~pending
    result.add(partition, "input", int(checked.sum()))
    result.add(partition, "pending", int(pending.sum()))
    origin = column_ints(dead, "origin_offset")
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
        counted |= within(column_ints(dead, "timestamp_ms"), audit_range.from_ms, audit_range.to_ms)
    result.add(partition, "deadLettered", int(counted.sum()))
    reasons_counted = Counter(
        reason or "unknown"
        for reason in strings(dead, "reason").filter(pa.array(counted)).to_pylist()
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
