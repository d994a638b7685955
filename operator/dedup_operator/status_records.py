"""The records a pipeline's status is made of (plain data): a condition, a partition's
entry, a worker's counters. `status.py` builds the status from them; the modules that
decide a condition (`ownership_generation`, `audit_status`) or remember counters
(`memory`) import them from here, below the builder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class WorkerCounters:
    """One partition's counters from its worker's /metrics."""

    duplicates: int
    records_in: int
    records_out: int
    lag: int


ScrapedCounters = tuple[float, Mapping[int, WorkerCounters]]
"""(monotonic time of the scrape, each scraped partition's counters)."""
