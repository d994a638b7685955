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
