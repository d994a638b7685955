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
