"""The oracle for spark/dedup_spark/audit.py: the audit as a record-by-record replay.

`audit.py` states its input rule as array operations over a whole partition (a running
maximum of publication times per id, sorted events). This oracle does not reuse that
formula: it walks the input in offset order as the worker did, remembering for each id
the timestamps of the occurrences that reached the output so far, and at each valid
occurrence asks the worker's question: was this id published, from an earlier offset, at
most a window (plus the slack the worker may keep an id longer) before? If not, the
worker owed a publication of *this* occurrence; the output must carry it. A later
publication of the id never answers for an earlier occurrence, because the replay has
not reached it yet.

Output-side rules (duplicates, unexpected, order, contents) are a loop over the output
records; dead letters and retention are counted offset by offset.
"""

from __future__ import annotations

from collections.abc import Sequence

from dedup_spark.audit import (
    CONTENT_MISMATCH,
    DUPLICATE,
    MISSING,
    MISSING_DEAD_LETTER,
    ORDER_VIOLATION,
    UNEXPECTED,
    UNVERIFIABLE,
    AuditRange,
    DeadLetter,
    Finding,
    InputRecord,
    OutputRecord,
    PartitionAudit,
    Retention,
)


def _in_range(audit_range: AuditRange, partition: int, offset: int, timestamp_ms: int) -> bool:
    if audit_range.offsets is not None:
        bounds = audit_range.offsets.get(partition)
        return bounds is not None and bounds[0] <= offset < bounds[1]
    if audit_range.from_ms is not None and timestamp_ms < audit_range.from_ms:
        return False
    return audit_range.to_ms is None or timestamp_ms < audit_range.to_ms


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
    retention: Retention | None = None,
) -> PartitionAudit:
    if window_ms <= 0:
        raise ValueError(f"the window must be positive, not {window_ms} ms")
    retention = retention or Retention()
    audit = PartitionAudit(partition)

    # Which input is checked.
    checked: dict[int, InputRecord] = {}
    for rec in inputs:
        if not _in_range(audit_range, partition, rec.offset, rec.timestamp_ms):
            continue
        if committed_offset is not None and rec.offset >= committed_offset:
            audit.pending += 1
        else:
            checked[rec.offset] = rec

    # The time span of the range, for output records without an input occurrence.
    span: tuple[int | None, int | None]
    if audit_range.offsets is None:
        span = (audit_range.from_ms, audit_range.to_ms)
    elif checked:
        stamps = [r.timestamp_ms for r in checked.values()]
        span = (min(stamps), max(stamps) + 1)
    else:
        span = (0, 0)

    def in_span(ts: int) -> bool:
        return (span[0] is None or ts >= span[0]) and (span[1] is None or ts < span[1])

    # Which input occurrence each output record publishes: the first with its id and
    # timestamp (the worker keeps the input's timestamp).
    origin_of: dict[tuple[str, int], InputRecord] = {}
    input_ids: set[str] = set()
    for rec in inputs:
        if rec.id is not None:
            input_ids.add(rec.id)
            origin_of.setdefault((rec.id, rec.timestamp_ms), rec)

    # Output, record by record.
    publications: dict[int, list[int]] = {}  # input offset -> timestamps published from it
    before_input: dict[str, list[int]] = {}  # ids published with no occurrence read
    last_time: dict[str, int] = {}
    newest_origin = -1
    for out in outputs:
        origin = None if out.id is None else origin_of.get((out.id, out.timestamp_ms))
        previous = None if out.id is None else last_time.get(out.id)
        if out.id is not None:
            last_time[out.id] = out.timestamp_ms
            if origin is not None:
                publications.setdefault(origin.offset, []).append(out.timestamp_ms)
            else:
                before_input.setdefault(out.id, []).append(out.timestamp_ms)
        counted = origin.offset in checked if origin is not None else in_span(out.timestamp_ms)
        if not counted:
            if origin is not None:
                newest_origin = max(newest_origin, origin.offset)
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
        elif origin is not None:
            if origin.offset < newest_origin:
                audit.findings.append(
                    Finding(
                        ORDER_VIOLATION,
                        out.id,
                        out.offset,
                        out.timestamp_ms,
                        f"input offset {origin.offset} published after input offset "
                        f"{newest_origin}",
                    )
                )
            newest_origin = max(newest_origin, origin.offset)
        if (
            origin is not None
            and origin.digest is not None
            and out.digest is not None
            and origin.digest != out.digest
        ):
            audit.findings.append(
                Finding(
                    CONTENT_MISMATCH,
                    out.id,
                    out.offset,
                    out.timestamp_ms,
                    f"key, value or headers differ from input offset {origin.offset}",
                )
            )

    # Input deleted by retention before the audit could read it.
    if retention.input_start > 0:
        if audit_range.offsets is not None:
            bounds = audit_range.offsets.get(partition)
            deleted = (
                [o for o in range(bounds[0], bounds[1]) if o < retention.input_start]
                if bounds is not None
                else []
            )
            suffix = ""
        else:
            reaches_back = (
                audit_range.from_ms is not None
                and retention.input_first_ms is not None
                and retention.input_first_ms <= audit_range.from_ms
            )
            deleted = [] if reaches_back else list(range(retention.input_start))
            suffix = ": the range starts before the oldest retained record"
        if deleted:
            audit.unverifiable += len(deleted)
            audit.findings.append(
                Finding(
                    UNVERIFIABLE,
                    None,
                    deleted[0],
                    inputs[0].timestamp_ms if inputs else 0,
                    f"input offsets {deleted[0]}-{deleted[-1]} deleted by retention{suffix}",
                )
            )

    # The replay: input in offset order, as the worker met it.
    deleted_before: int | None = None  # publications older than this may be gone
    if retention.output_start > 0:
        first = retention.output_first_ms
        deleted_before = first if first is not None else 2**63 - 1
    published_so_far: dict[str, list[int]] = {k: list(v) for k, v in before_input.items()}
    dead_offsets = {d.origin_offset for d in dead_letters}
    distinct: set[str] = set()
    for rec in inputs:
        is_checked = rec.offset in checked
        if is_checked:
            audit.input += 1
        if rec.id is None:
            if is_checked and rec.offset not in dead_offsets:
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
        if is_checked:
            audit.valid += 1
            distinct.add(rec.id)
        from_here = publications.get(rec.offset, [])
        if is_checked and not from_here:
            # Not published: the worker must have held the id from a publication at most
            # window + slack older.
            oldest_allowed = rec.timestamp_ms - window_ms - slack_ms
            held = any(t >= oldest_allowed for t in published_so_far.get(rec.id, []))
            if not held:
                if deleted_before is not None and oldest_allowed < deleted_before:
                    audit.unverifiable += 1
                    audit.findings.append(
                        Finding(
                            UNVERIFIABLE,
                            rec.id,
                            rec.offset,
                            rec.timestamp_ms,
                            "not published, and output it could be accounted for by is "
                            f"deleted (oldest retained output record: {deleted_before})",
                        )
                    )
                else:
                    ever = rec.id in last_time
                    audit.findings.append(
                        Finding(
                            MISSING,
                            rec.id,
                            rec.offset,
                            rec.timestamp_ms,
                            "not published within the window" if ever else "not published",
                        )
                    )
        published_so_far.setdefault(rec.id, []).extend(from_here)
    audit.distinct = len(distinct)

    lo, hi = span
    for dead in dead_letters:
        if dead.origin_offset is not None and dead.origin_offset in checked:
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
