"""The audit's rules as a plain loop over records (the first statement of
spark/dedup_spark/audit.py's rules), the oracle for its vectorised implementation."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from dedup_spark.audit import (
    DUPLICATE,
    MISSING,
    MISSING_DEAD_LETTER,
    ORDER_VIOLATION,
    UNEXPECTED,
    AuditRange,
    DeadLetter,
    Finding,
    InputRecord,
    OutputRecord,
    PartitionAudit,
)


def reference_audit(
    partition: int,
    inputs: Sequence[InputRecord],
    outputs: Sequence[OutputRecord],
    dead_letters: Sequence[DeadLetter],
    *,
    audit_range: AuditRange,
    window_ms: int,
    slack_ms: int = 0,
    committed_offset: int | None = None,
) -> PartitionAudit:
    """The audit written as a loop over records: the rules as first stated, kept as the
    oracle the vectorised `audit_partition` must agree with."""
    if window_ms <= 0:
        raise ValueError(f"the window must be positive, not {window_ms} ms")
    audit = PartitionAudit(partition)

    # Where each id occurs in the input: (timestamp, offset) -> offset of first occurrence.
    first_input: dict[tuple[str, int], int] = {}
    input_ids: set[str] = set()
    checked: list[InputRecord] = []
    for rec in inputs:
        if rec.id is not None:
            input_ids.add(rec.id)
            first_input.setdefault((rec.id, rec.timestamp_ms), rec.offset)
        if audit_range.offsets is not None:
            bounds = audit_range.offsets.get(partition)
            in_range = bounds is not None and bounds[0] <= rec.offset < bounds[1]
        else:
            in_range = (
                audit_range.from_ms is None or rec.timestamp_ms >= audit_range.from_ms
            ) and (audit_range.to_ms is None or rec.timestamp_ms < audit_range.to_ms)
        if not in_range:
            continue
        if committed_offset is not None and rec.offset >= committed_offset:
            audit.pending += 1
            continue
        checked.append(rec)

    # The time span of the range, for output records without an input occurrence.
    if audit_range.offsets is None:
        span = (audit_range.from_ms, audit_range.to_ms)
    elif checked:
        span = (min(r.timestamp_ms for r in checked), max(r.timestamp_ms for r in checked) + 1)
    else:
        span = (0, 0)
    checked_offsets = {r.offset for r in checked}

    # Output: duplicates, unexpected, order.
    published_at: dict[str, list[int]] = {}
    last_published: dict[str, int] = {}
    newest_source = -1
    for out in outputs:
        source = None if out.id is None else first_input.get((out.id, out.timestamp_ms))
        in_range = (
            source in checked_offsets
            if source is not None
            else (span[0] is None or out.timestamp_ms >= span[0])
            and (span[1] is None or out.timestamp_ms < span[1])
        )
        previous = None if out.id is None else last_published.get(out.id)
        if out.id is not None:
            last_published[out.id] = out.timestamp_ms
            published_at.setdefault(out.id, []).append(out.timestamp_ms)
        if not in_range:
            if source is not None:
                newest_source = max(newest_source, source)
            continue
        audit.published += 1
        if out.id is None or out.id not in input_ids:
            audit.findings.append(
                Finding(UNEXPECTED, out.id, out.offset, out.timestamp_ms, "no input occurrence")
            )
            continue
        if previous is not None and abs(out.timestamp_ms - previous) < window_ms:
            audit.findings.append(
                Finding(
                    DUPLICATE,
                    out.id,
                    out.offset,
                    out.timestamp_ms,
                    f"published {out.timestamp_ms - previous} ms after the last time",
                )
            )
            continue  # a repeat is not also an order violation
        if source is not None:
            if source < newest_source:
                audit.findings.append(
                    Finding(
                        ORDER_VIOLATION,
                        out.id,
                        out.offset,
                        out.timestamp_ms,
                        f"input offset {source} published after input offset {newest_source}",
                    )
                )
            newest_source = max(newest_source, source)

    for times in published_at.values():
        times.sort()

    # Input: missing ids and missing dead letters.
    dead_offsets = {d.origin_offset for d in dead_letters}
    distinct: set[str] = set()
    missing: set[str] = set()
    for rec in checked:
        audit.input += 1
        if rec.id is None:
            if rec.offset not in dead_offsets:
                audit.findings.append(
                    Finding(
                        MISSING_DEAD_LETTER,
                        None,
                        rec.offset,
                        rec.timestamp_ms,
                        f"invalid ({rec.reason}) but no dead letter",
                    )
                )
            continue
        audit.valid += 1
        distinct.add(rec.id)
        if rec.id in missing:
            continue
        times = published_at.get(rec.id, [])
        earliest = rec.timestamp_ms - window_ms - slack_ms
        if bisect.bisect_left(times, earliest) == len(times):
            missing.add(rec.id)
            audit.findings.append(
                Finding(
                    MISSING,
                    rec.id,
                    rec.offset,
                    rec.timestamp_ms,
                    "not published" if not times else "not published within the window",
                )
            )
    audit.distinct = len(distinct)

    lo, hi = span
    for dead in dead_letters:
        if dead.origin_offset is not None and dead.origin_offset in checked_offsets:
            counted = True
        elif audit_range.offsets is None:
            counted = (lo is None or dead.timestamp_ms >= lo) and (
                hi is None or dead.timestamp_ms < hi
            )
        else:
            counted = False
        if counted:
            audit.dead_lettered += 1
            audit.dead_lettered_by_reason[dead.reason or "unknown"] += 1
    return audit
