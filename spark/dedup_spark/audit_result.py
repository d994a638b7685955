"""What (part of) an audit found, counted: the counts per partition under the summary's
names, their totals and the pass rule (docs/audit.md, "What it counts")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dedup_spark.audit_model import (
    CONTENT_MISMATCH,
    DUPLICATE,
    MISPLACED,
    MISSING,
    MISSING_DEAD_LETTER,
    ORDER_VIOLATION,
    UNEXPECTED,
    Finding,
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
