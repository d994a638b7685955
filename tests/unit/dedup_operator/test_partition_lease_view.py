"""A partition Lease read from a watch counts as unchanged only since the watch's unbroken
start (dedup_operator.observe, `lease_clock.ContinuousView`'s rule): across a gap (the
API server down, the watch broken) nobody may have been able to renew it. Read by a
list (no watch in sync), the Lease clock alone decides, as before."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from dedup_contract.lease_clock import LeaseClock
from dedup_operator.memory import LeaseWatch
from dedup_operator.observe import _partition_leases

LEASE = {
    "metadata": {"namespace": "ns", "name": "events-p0", "resourceVersion": "7"},
    "spec": {
        "holderIdentity": "events-p0-e1",
        "renewTime": datetime(2026, 11, 26, tzinfo=UTC).isoformat(),
        "leaseDurationSeconds": 15,
        "leaseTransitions": 1,
    },
}


class Watched:
    """The part of Kube the helper asks: since when the Leases' watch is unbroken."""

    def __init__(self, since: float | None) -> None:
        self.since = since

    def leases_watched_since(self, namespace: str) -> float | None:
        return self.since


def seen_for(seconds: float) -> LeaseWatch:
    """A Lease clock that saw LEASE unchanged for `seconds`."""
    now = [0.0]
    watch = LeaseWatch()
    watch.lease_clock = LeaseClock(monotonic=lambda: now[0])
    watch.observe_lease(LEASE)
    now[0] = seconds
    return watch


def test_a_watched_lease_ages_from_the_watchs_unbroken_start_at_most() -> None:
    kube: Any = Watched(since=time.monotonic() - 3.0)  # re-synced 3 s ago
    view = _partition_leases(kube, "ns", {"events-p0": LEASE}, seen_for(100.0))["events-p0"]
    assert timedelta(seconds=3) <= view.unchanged_for < timedelta(seconds=4)
    assert not view.expired()  # 100 s on the clock, but only 3 s of them were watched


def test_a_listed_lease_ages_by_the_lease_clock_alone() -> None:
    kube: Any = Watched(since=None)  # no watch in sync: the pass listed
    view = _partition_leases(kube, "ns", {"events-p0": LEASE}, seen_for(100.0))["events-p0"]
    assert view.unchanged_for == timedelta(seconds=100)
    assert view.expired()


def test_nodes_are_judged_again_after_the_operators_own_node_write() -> None:
    # A pass that tainted a node must not be followed by one judging the node as read
    # before the taint (it would take the mark for someone else's and forget the taint).
    watch = LeaseWatch()
    judged: list[int] = []

    def judge() -> dict[str, Any]:
        judged.append(len(judged))
        return {"n1": len(judged)}

    lost_after = timedelta(seconds=20)
    assert watch.node_views(lost_after, judge, now=0.0, written=0) == {"n1": 1}
    assert watch.node_views(lost_after, judge, now=0.1, written=0) == {"n1": 1}, "held 0.25 s"
    assert watch.node_views(lost_after, judge, now=0.2, written=1) == {"n1": 2}, "a write since"
    assert watch.node_views(lost_after, judge, now=0.3, written=1) == {"n1": 2}
    assert watch.node_views(lost_after, judge, now=0.5, written=1) == {"n1": 3}, "0.25 s on"
