"""How often a reconcile pass runs and how long it trusts what it remembers (set by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReconcileSettings:
    interval_s: float = 5.0
    topic_check_s: float = 30.0  # how often the input topic is re-checked
    ensure_s: float = 30.0  # how often per-pipeline objects are re-checked
    scrape_timeout_s: float = 1.0
    counters_s: float = 60.0  # the workers' counters in the status: scraped this rarely
    resync_s: float = 30.0  # a pipeline at rest is passed over this rarely, or on a change
    namespaces: tuple[str, ...] = ()  # the watched namespaces (empty: all)

    def rest_s(self) -> float:
        """Seconds between passes over a pipeline at rest: the resync, or sooner when the
        topic check or the counters are due sooner; never sooner than the interval."""
        return max(self.interval_s, min(self.resync_s, self.topic_check_s, self.counters_s))
