"""The oracle for spark/dedup_spark/audit_rules.py: the audit under ownership as plain loops.

`audit_rules.py` states its rules as array operations over columns (sorted keys, running
maxima, binary searches over time ranks). This oracle does not reuse those formulas: it
loops over records. Ids are grouped across partitions; which occurrence of an id is the
published one is not defined across partitions, so it accepts any occurrence with the
publication's id and timestamp for the contents (and takes, for the order, the first
whose contents are the publication's: copies of an id in one millisecond on two
partitions are told apart by their payloads), and asks of each unpublished checked
occurrence only: is there a publication of its id within window + slack of it that the
owner may have made before meeting it? A publication from a later offset of the same
input partition cannot be one (the owner meets one input partition's records in order);
one from an earlier offset of the same partition may be any time after the occurrence
minus window + slack (the rule before ownership).

Ownership uses the worker's pure-Python reference hash (`murmur2_reference`), so the
audit's vectorised hash is checked against a second implementation here too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from dedup_contract.ownership import owner_reference
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


def _in_range(audit_range: AuditRange, partition: int, offset: int, timestamp_ms: int) -> bool:
    if audit_range.offsets is not None:
        bounds = audit_range.offsets.get(partition)
        return bounds is not None and bounds[0] <= offset < bounds[1]
    if audit_range.from_ms is not None and timestamp_ms < audit_range.from_ms:
        return False
    return audit_range.to_ms is None or timestamp_ms < audit_range.to_ms


def reference_records(
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
    if window_ms <= 0:
        raise ValueError(f"the window must be positive, not {window_ms} ms")
    retention = retention or {}
    audit = AuditResult()
    inputs = sorted(inputs, key=lambda r: (r.partition, r.offset))
    outputs = sorted(outputs, key=lambda r: (r.partition, r.offset))
    waiting = {(f.origin_partition, f.origin_offset) for f in forwarded}

    def owner(mid: str) -> int:
        assert workers is not None
        return owner_reference(mid.encode(), workers)

    # Which input is checked.
    checked: set[tuple[int, int]] = set()
    for rec in inputs:
        if not _in_range(audit_range, rec.partition, rec.offset, rec.timestamp_ms):
            continue
        place = (rec.partition, rec.offset)
        behind = committed is not None and rec.offset >= committed.get(rec.partition, 0)
        if behind or (rec.id is not None and place in waiting):
            audit.add(rec.partition, "pending")
        else:
            checked.add(place)
            audit.add(rec.partition, "input")

    # The time span of the range, for output records without an input occurrence.
    span: tuple[int | None, int | None]
    if audit_range.offsets is None:
        span = (audit_range.from_ms, audit_range.to_ms)
    else:
        stamps = [
            r.timestamp_ms
            for r in inputs
            if r.id is not None and (r.partition, r.offset) in checked
        ]
        span = (min(stamps), max(stamps) + 1) if stamps else (0, 0)

    def in_span(ts: int) -> bool:
        return (span[0] is None or ts >= span[0]) and (span[1] is None or ts < span[1])

    # The occurrences of each (id, timestamp), in (partition, offset) order.
    occurrences: dict[tuple[str, int], list[InputRecord]] = {}
    for rec in inputs:
        if rec.id is not None:
            occurrences.setdefault((rec.id, rec.timestamp_ms), []).append(rec)

    # Output, record by record.
    source: dict[tuple[int, int], InputRecord | None] = {}
    counted: dict[tuple[int, int], bool] = {}
    for out in outputs:
        found = occurrences.get((out.id, out.timestamp_ms), []) if out.id is not None else []
        # the first with the output's contents, when they are known; else the first
        same = [r for r in found if out.digest is not None and r.digest == out.digest]
        origin = same[0] if same else found[0] if found else None
        source[(out.partition, out.offset)] = origin
        is_counted = (
            (origin.partition, origin.offset) in checked
            if origin is not None
            else in_span(out.timestamp_ms)
        )
        counted[(out.partition, out.offset)] = is_counted
    ids_in_input = {r.id for r in inputs if r.id is not None}
    last_time: dict[str, int] = {}
    bad: set[tuple[int, int]] = set()  # unexpected or duplicate
    for out in sorted(outputs, key=lambda o: (o.timestamp_ms, o.partition, o.offset)):
        place = (out.partition, out.offset)
        previous = None if out.id is None else last_time.get(out.id)
        if out.id is not None:
            last_time[out.id] = out.timestamp_ms
        if not counted[place]:
            continue
        audit.add(out.partition, "published")
        if out.id is None or out.id not in ids_in_input:
            bad.add(place)
            audit.found(
                Finding(
                    UNEXPECTED,
                    out.id,
                    out.offset,
                    out.timestamp_ms,
                    "no input occurrence",
                    out.partition,
                )
            )
            continue
        if previous is not None and out.timestamp_ms - previous < window_ms:
            bad.add(place)
            audit.found(
                Finding(
                    DUPLICATE,
                    out.id,
                    out.offset,
                    out.timestamp_ms,
                    f"published {out.timestamp_ms - previous} ms after the last time",
                    out.partition,
                )
            )
        if workers is not None and out.partition != owner(out.id):
            audit.found(
                Finding(
                    MISPLACED,
                    out.id,
                    out.offset,
                    out.timestamp_ms,
                    f"on output partition {out.partition}, its owner is {owner(out.id)} "
                    f"of {workers}",
                    out.partition,
                )
            )
        candidates = occurrences.get((out.id, out.timestamp_ms), [])
        if (
            candidates
            and out.digest is not None
            and all(c.digest is not None for c in candidates)
            and all(c.digest != out.digest for c in candidates)
        ):
            first = candidates[0]
            audit.found(
                Finding(
                    CONTENT_MISMATCH,
                    out.id,
                    out.offset,
                    out.timestamp_ms,
                    "key, value or headers differ from every input occurrence with its id "
                    f"and timestamp (first: {first.partition}:{first.offset})",
                    out.partition,
                )
            )

    # Order, per (output partition, input partition), in output offset order.
    newest: dict[tuple[int, int], int] = {}
    for out in outputs:
        place = (out.partition, out.offset)
        origin = source[place]
        if origin is None or (counted[place] and place in bad):
            continue
        pair = (out.partition, origin.partition)
        before = newest.get(pair, -1)
        if counted[place] and origin.offset < before:
            audit.found(
                Finding(
                    ORDER_VIOLATION,
                    out.id,
                    out.offset,
                    out.timestamp_ms,
                    f"input offset {origin.offset} of input partition {origin.partition} "
                    f"published after input offset {before}",
                    out.partition,
                )
            )
        newest[pair] = max(before, origin.offset)

    # Each checked valid occurrence: published, or accounted for by a publication.
    publications: dict[str, list[tuple[int, InputRecord | None]]] = {}
    published_from: set[tuple[int, int]] = set()
    for out in outputs:
        if out.id is None:
            continue
        origin = source[(out.partition, out.offset)]
        publications.setdefault(out.id, []).append((out.timestamp_ms, origin))
        if origin is not None:
            published_from.add((origin.partition, origin.offset))
    reach = window_ms + slack_ms
    distinct: dict[int, set[str]] = {}
    for rec in inputs:
        if rec.id is None or (rec.partition, rec.offset) not in checked:
            continue
        audit.add(rec.partition, "valid")
        distinct.setdefault(rec.partition, set()).add(rec.id)
        if (rec.partition, rec.offset) in published_from:
            continue
        accounted = False
        for ts, origin in publications.get(rec.id, []):
            if origin is not None and origin.partition == rec.partition:
                accounted |= origin.offset < rec.offset and ts >= rec.timestamp_ms - reach
            else:
                accounted |= abs(ts - rec.timestamp_ms) <= reach
        if accounted:
            continue
        horizons = [
            kept.output_horizon_ms()
            for p, kept in retention.items()
            if workers is None or p == owner(rec.id)
        ]
        horizon = max((h for h in horizons if h is not None), default=None)
        if horizon is not None and rec.timestamp_ms - reach < horizon:
            audit.add(rec.partition, "unverifiable")
            audit.found(
                Finding(
                    UNVERIFIABLE,
                    rec.id,
                    rec.offset,
                    rec.timestamp_ms,
                    "not published, and output it could be accounted for by is deleted "
                    f"(oldest retained output record: {horizon})",
                    rec.partition,
                )
            )
        else:
            audit.found(
                Finding(
                    MISSING,
                    rec.id,
                    rec.offset,
                    rec.timestamp_ms,
                    "not published within the window" if rec.id in last_time else "not published",
                    rec.partition,
                )
            )
    for p, ids in distinct.items():
        audit.add(p, "distinct", len(ids))
    audit.distinct_ids = len(set().union(*distinct.values())) if distinct else 0

    # Invalid input and dead letters, per input partition.
    for rec in inputs:
        if rec.id is not None or (rec.partition, rec.offset) not in checked:
            continue
        if not any(
            d.origin_partition == rec.partition and d.origin_offset == rec.offset
            for d in dead_letters
        ):
            audit.found(
                Finding(
                    MISSING_DEAD_LETTER,
                    None,
                    rec.offset,
                    rec.timestamp_ms,
                    f"invalid ({rec.reason}) but no dead letter",
                    rec.partition,
                )
            )
    invalid_checked = {
        (r.partition, r.offset)
        for r in inputs
        if r.id is None and (r.partition, r.offset) in checked
    }
    for dead in dead_letters:
        of_checked = (
            dead.origin_offset is not None
            and (dead.origin_partition, dead.origin_offset) in invalid_checked
        )
        dated = audit_range.offsets is None and _in_range(
            audit_range, dead.origin_partition, -1, dead.timestamp_ms
        )
        if of_checked or dated:
            audit.add(dead.origin_partition, "deadLettered")
            audit.by_reason.setdefault(dead.origin_partition, Counter())[
                dead.reason or "unknown"
            ] += 1

    # Input deleted by retention before the audit could read it.
    for p, kept in sorted(retention.items()):
        if kept.input_start <= 0:
            continue
        if audit_range.offsets is not None:
            bounds = audit_range.offsets.get(p)
            deleted = (
                [o for o in range(bounds[0], bounds[1]) if o < kept.input_start]
                if bounds is not None
                else []
            )
            suffix = ""
        else:
            reaches_back = (
                audit_range.from_ms is not None
                and kept.input_first_ms is not None
                and kept.input_first_ms <= audit_range.from_ms
            )
            deleted = [] if reaches_back else list(range(kept.input_start))
            suffix = ": the range starts before the oldest retained record"
        if deleted:
            audit.add(p, "unverifiable", len(deleted))
            audit.found(
                Finding(
                    UNVERIFIABLE,
                    None,
                    deleted[0],
                    kept.input_first_ms or 0,
                    f"input offsets {deleted[0]}-{deleted[-1]} deleted by retention{suffix}",
                    p,
                )
            )
    return audit


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
) -> AuditResult:
    """`reference_records` for one partition whose ids are all published to the output
    partition of the same number (as `audit.audit_partition`)."""
    return reference_records(
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
