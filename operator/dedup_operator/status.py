"""The pipeline's status from what one reconcile pass saw (pure).

Conditions: `Ready` (every partition's worker Running and Ready), `Progressing`
(partitions starting or rolling), `Degraded` (a partition cannot run, a volume will not
detach, the spec or the input topic is wrong), `FailingOver` (a handover in progress),
`TopicReady` (the input topic exists with spec.partitions partitions). A condition's
lastTransitionTime changes only when its status does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dedup_contract.timefmt import format_time


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    pod: str | None
    node: str | None
    epoch: int
    phase: str
    ready: bool
    lag: int | None = None
    duplicates: int | None = None
    waiting_for: str | None = None
    handover: Mapping[str, Any] | None = None
    last_handover: Mapping[str, Any] | None = None
    last_failover: str | None = None

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "partition": self.partition,
            "epoch": self.epoch,
            "phase": self.phase,
            "ready": self.ready,
            "pod": self.pod,
            "node": self.node,
            "lag": self.lag,
            "duplicates": self.duplicates,
            "waitingFor": self.waiting_for,
            "handover": dict(self.handover) if self.handover else None,
            "lastHandover": dict(self.last_handover) if self.last_handover else None,
            "lastFailover": self.last_failover,
        }
        return {k: v for k, v in out.items() if v is not None}


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    current: Sequence[Condition],
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    out = []
    for c in current:
        status = "True" if c.status else "False"
        old = before.get(c.type)
        since = (
            old.get("lastTransitionTime")
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else format_time(now)
        )
        out.append(
            {
                "type": c.type,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return out


def phase_of(
    partitions: Sequence[PartitionStatus], degraded: bool, previous_phase: str | None
) -> str:
    """Running when every partition is ready; Degraded when something is wrong or a
    pipeline that ran has a partition down; Pending while it starts for the first time."""
    if degraded:
        return "Degraded"
    if partitions and all(p.ready for p in partitions):
        return "Running"
    return "Degraded" if previous_phase in ("Running", "Degraded") else "Pending"


def _handover_summary(p: PartitionStatus) -> str:
    h = p.handover or {}
    why = h.get("releaseWhy")
    return f"p{p.partition} ({h.get('reason')})" + (f": {why}" if why else "")


def summary_conditions(
    partitions: Sequence[PartitionStatus],
    expected: int,
    topic: Condition,
    degraded_reasons: Sequence[str],
    spec_current: bool,
) -> list[Condition]:
    ready = [p for p in partitions if p.ready]
    failing_over = [p for p in partitions if p.handover]
    not_running = expected - len(ready)
    conditions = [
        Condition(
            "Ready",
            not_running == 0 and topic.status,
            "AllPartitionsReady" if not_running == 0 else "PartitionsNotReady",
            f"{len(ready)}/{expected} partitions ready",
        ),
        Condition(
            "Progressing",
            not_running > 0 or not spec_current,
            "Rolling" if not spec_current else ("Starting" if not_running else "Stable"),
            ""
            if not_running == 0 and spec_current
            else ", ".join(f"p{p.partition}: {p.waiting_for}" for p in partitions if p.waiting_for)[
                :1000
            ],
        ),
        Condition(
            "Degraded",
            bool(degraded_reasons),
            "Degraded" if degraded_reasons else "AsExpected",
            "; ".join(degraded_reasons)[:4000],
        ),
        Condition(
            "FailingOver",
            bool(failing_over),
            "HandoverInProgress" if failing_over else "NoHandover",
            "; ".join(_handover_summary(p) for p in failing_over)[:4000],
        ),
        topic,
    ]
    return conditions


@dataclass(frozen=True)
class WorkerCounters:
    """One partition's counters from its worker's /metrics."""

    duplicates: int
    records_in: int
    records_out: int
    lag: int


ScrapedCounters = tuple[float, Mapping[int, WorkerCounters]]
"""(monotonic time of the scrape, each scraped partition's counters)."""


def kept_counters(
    scraped: ScrapedCounters | None, ready: set[int], now: float, every_s: float
) -> dict[int, WorkerCounters] | None:
    """The workers' counters a pass writes into the status without scraping them: those
    scraped less than `every_s` ago, of the partitions still Ready; None when a scrape
    is due (none yet, or `every_s` passed). So a pipeline's status changes for its
    counters at most once per `every_s`, and its workers are scraped as rarely."""
    if scraped is None or now - scraped[0] >= every_s:
        return None
    return {p: c for p, c in scraped[1].items() if p in ready}
