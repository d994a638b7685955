"""What the reconciliation audit reads and what it finds, one by one: the input, output,
dead-letter and forwarded records, the range that is checked (`AuditRange`), what
retention left (`Retention`) and the findings with their kinds (`Finding`). The rules
over them are in `audit_rules.py` (its docstring states the contract they check)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from dedup_spark.audit_arrays import within

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
                mask |= (partitions == partition) & within(offsets, *bounds)
            return mask
        return within(timestamps_ms, self.from_ms, self.to_ms)


_NEVER: Final = np.iinfo(np.int64).max
"""No output retained: every publication may have been deleted."""


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
