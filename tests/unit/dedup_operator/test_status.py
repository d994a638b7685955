"""The pipeline's status from one pass (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from dedup_operator.status import kept_counters, merge_conditions, phase_of
from dedup_operator.status_records import Condition, PartitionStatus, WorkerCounters

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 22, 12, 5, tzinfo=UTC)


def part(p: int, ready: bool) -> PartitionStatus:
    return PartitionStatus(p, f"e-p{p}-e1", "node-a", 1, "Running", ready)


def test_transition_time_changes_only_with_status() -> None:
    first = merge_conditions([], [Condition("Ready", False, "Starting")], 1, T0)
    same = merge_conditions(first, [Condition("Ready", False, "StillStarting")], 2, T1)
    assert same[0]["lastTransitionTime"] == "2026-11-22T12:00:00Z"
    assert same[0]["reason"] == "StillStarting" and same[0]["observedGeneration"] == 2
    flipped = merge_conditions(same, [Condition("Ready", True, "AllPartitionsReady")], 2, T1)
    assert flipped[0]["lastTransitionTime"] == "2026-11-22T12:05:00Z"
    assert flipped[0]["status"] == "True"


def test_phase() -> None:
    assert phase_of([part(0, True), part(1, True)], False, None) == "Running"
    assert phase_of([part(0, True), part(1, False)], False, None) == "Pending"
    assert phase_of([part(0, True), part(1, False)], False, "Running") == "Degraded"
    assert phase_of([part(0, True)], True, None) == "Degraded"


def test_partition_entry_leaves_out_unknowns() -> None:
    assert part(0, True).to_status() == {
        "partition": 0,
        "epoch": 1,
        "phase": "Running",
        "ready": True,
        "pod": "e-p0-e1",
        "node": "node-a",
    }


def test_failing_over_condition_says_how_the_volume_is_released() -> None:
    from dataclasses import replace

    from dedup_operator.status import summary_conditions

    why = "not tainting node node-a out-of-service: it would evict shop/db-0"
    moving = replace(
        part(0, False),
        handover={"reason": "NodeLost", "release": "TaintBlocked", "releaseWhy": why},
    )
    conditions = summary_conditions(
        [moving, part(1, True)], 2, Condition("TopicReady", True, "TopicFound"), [], True
    )
    failing = next(c for c in conditions if c.type == "FailingOver")
    assert failing.status and failing.message == f"p0 (NodeLost): {why}"


def test_counters_are_scraped_at_most_once_per_interval() -> None:
    c = WorkerCounters(duplicates=1, records_in=10, records_out=9, lag=0)
    assert kept_counters(None, {0}, 100.0, 60.0) is None  # never scraped: due
    scraped = (100.0, {0: c, 1: c})
    assert kept_counters(scraped, {0, 1}, 159.9, 60.0) == {0: c, 1: c}  # kept: no write
    assert kept_counters(scraped, {1}, 130.0, 60.0) == {1: c}  # of the Ready ones only
    assert kept_counters(scraped, {0, 1}, 160.0, 60.0) is None  # due again
