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
* **missing**: ids with a valid input occurrence that no output record covers: none of
  the id is published at or after the occurrence's timestamp minus the window (plus
  `slack`, for the worker's window being kept a little longer than its duration: by
  up to `1/generations`, see `dedup_worker.window`);
* **missing dead letters**: invalid input records with no dead letter from their offset;
* **unexpected**: output records whose id has no input occurrence at all;
* **order violations**: output records whose input occurrence comes before that of an
  earlier output record (the output must keep the input order of first occurrences);
* counts: input, valid, distinct, published, dead-lettered (by reason), pending, and
  the input's duplicate rate.

The audit passes when duplicates, missing, missing dead letters, unexpected and order
violations are all zero. Nothing here does I/O; `reconcile.py` runs it per partition
inside Spark and `bench/reconcile.py` runs it in a plain Python reader.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

DUPLICATE: Final = "duplicate"
MISSING: Final = "missing"
MISSING_DEAD_LETTER: Final = "missing_dead_letter"
UNEXPECTED: Final = "unexpected"
ORDER_VIOLATION: Final = "order_violation"
FINDING_KINDS: Final = (DUPLICATE, MISSING, MISSING_DEAD_LETTER, UNEXPECTED, ORDER_VIOLATION)


class InputRecord(NamedTuple):
    offset: int
    timestamp_ms: int
    id: str | None  # None: invalid, see reason
    reason: str | None = None


class OutputRecord(NamedTuple):
    offset: int
    timestamp_ms: int
    id: str | None  # None: the output record has no valid id (itself unexpected)


class DeadLetter(NamedTuple):
    origin_offset: int | None
    timestamp_ms: int
    reason: str | None


class Finding(NamedTuple):
    """One thing wrong, with where to look: the output offset (duplicates, unexpected,
    order violations) or the input offset (missing, missing dead letters)."""

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

    def has_input(self, partition: int, offset: int, timestamp_ms: int) -> bool:
        if self.offsets is not None:
            bounds = self.offsets.get(partition)
            return bounds is not None and bounds[0] <= offset < bounds[1]
        return (self.from_ms is None or timestamp_ms >= self.from_ms) and (
            self.to_ms is None or timestamp_ms < self.to_ms
        )


@dataclass
class PartitionAudit:
    partition: int
    input: int = 0
    valid: int = 0
    distinct: int = 0
    published: int = 0
    dead_lettered: int = 0
    pending: int = 0
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
)
FAILING: Final = ("duplicates", "missing", "missingDeadLetters", "unexpected", "orderViolations")


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


def passed(totals: Mapping[str, Any]) -> bool:
    return all(int(totals.get(name, 0)) == 0 for name in FAILING)


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
) -> PartitionAudit:
    """Audit one partition (module docstring). `inputs` and `outputs` in offset order."""
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
        if not audit_range.has_input(partition, rec.offset, rec.timestamp_ms):
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
