"""The one Lease expiry rule (dedup_contract.lease_clock): run out only after a full
duration seen unchanged on the reader's own monotonic clock; released by its holder when
renewTime is a duration before acquireTime (one clock); never a comparison of two
machines' wall clocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dedup_contract import lease_clock
from dedup_contract.lease_clock import ContinuousView, LeaseClock, LeaseStamp

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class Mono:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_unchanged_for_counts_from_first_sight_and_restarts_on_any_change() -> None:
    mono = Mono()
    clock = LeaseClock(mono)
    stamp = LeaseStamp("w-e1", T0, "10")
    assert clock.observe("ns/p0", stamp) == 0.0  # first sight: as if renewed just now
    mono.t += 4
    assert clock.observe("ns/p0", stamp) == 4.0
    # a renewal whose renewTime goes *backwards* (a holder whose clock stepped back) is a
    # change like any other
    mono.t += 1
    older = LeaseStamp("w-e1", T0 - timedelta(seconds=30), "11")
    assert clock.observe("ns/p0", older) == 0.0
    mono.t += 2
    assert clock.observe("ns/p0", older) == 2.0
    # another key is counted on its own
    assert clock.observe("ns/p1", older) == 0.0


def test_a_restarted_reader_has_no_history_and_waits_a_full_duration() -> None:
    mono = Mono()
    stamp = LeaseStamp("w-e1", T0 - timedelta(hours=1), "10")  # renewTime an hour old
    old = LeaseClock(mono)
    old.observe("ns/p0", stamp)
    mono.t += 14
    assert old.observe("ns/p0", stamp) == 14.0
    restarted = LeaseClock(mono)  # a new operator process
    assert restarted.observe("ns/p0", stamp) == 0.0
    assert not lease_clock.expired(False, 0.0, 15)
    assert lease_clock.remaining_s(False, 0.0, 15) == 15


@pytest.mark.parametrize(("unchanged", "expired"), [(0, False), (14.999, False), (15, True)])
def test_expired_after_exactly_one_duration_unchanged(unchanged: float, expired: bool) -> None:
    assert lease_clock.expired(False, unchanged, 15) is expired
    assert lease_clock.expired(True, 0, 15)  # free: at once


def test_free_released_and_held() -> None:
    assert lease_clock.is_free(None, T0, T0, 15)
    assert lease_clock.is_free("w", None, None, 15)
    assert not lease_clock.is_free("w", T0, T0, 15)
    acquired, renew = lease_clock.release_times(T0, 15, T0 + timedelta(minutes=5))
    assert (acquired, renew) == (T0, T0 - timedelta(seconds=15))
    assert lease_clock.is_free("w", renew, acquired, 15)
    # whatever the holder's clock said: only its own two times are compared
    skewed = T0 + timedelta(days=3)
    assert lease_clock.is_free("w", *reversed(lease_clock.release_times(skewed, 15, skewed)), 15)
    # never acquired: acquireTime written with the release
    acquired, renew = lease_clock.release_times(None, 15, T0)
    assert acquired == T0 and lease_clock.released(renew, acquired, 15)


def test_forgotten_after_a_while_unobserved() -> None:
    mono = Mono()
    clock = LeaseClock(mono, forget_after_s=60)
    stamp = LeaseStamp("w-e1", T0, "1")
    clock.observe("gone", stamp)
    mono.t += 61
    clock.observe("other", stamp)  # prunes
    assert clock.observe("gone", stamp) == 0.0


def test_injected_skew_shifts_the_written_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lease_clock.SKEW_ENV, "-30")
    shifted = lease_clock.skewed_utc_now()
    assert abs((datetime.now(UTC) - shifted).total_seconds() - 30) < 1
    monkeypatch.delenv(lease_clock.SKEW_ENV)
    assert lease_clock.clock_skew_s() == 0.0


def test_a_view_unbroken_by_reads_close_enough_grows_and_a_gap_restarts_it() -> None:
    clock = Mono()
    view = ContinuousView(gap_s=15.0, monotonic=clock)
    assert view.looked() == 0.0
    for _ in range(4):
        clock.t += 10.0
        view.looked()
    assert view.looked() == 40.0
    clock.t += 30.0  # the API server down: no read for longer than the gap
    assert view.looked() == 0.0, "a heartbeat is never older than the view"
    clock.t += 5.0
    assert view.looked() == 5.0


def test_a_failed_read_breaks_the_view_and_a_watch_says_since_when_it_saw() -> None:
    clock = Mono()
    view = ContinuousView(gap_s=15.0, monotonic=clock)
    view.looked()
    clock.t += 10.0
    assert view.looked(ok=False) == 0.0
    clock.t += 1.0
    assert view.looked() == 0.0
    # a watch resynced at t=1005: reads far apart do not break it
    clock.t = 1100.0
    assert view.looked(since=1005.0) == 95.0
    clock.t += 60.0
    assert view.looked(since=1005.0) == 155.0


def test_no_node_heartbeat_is_older_than_the_operators_view_of_it() -> None:
    from dedup_operator.observed import node_view

    mono = Mono()
    clock = LeaseClock(mono)
    heartbeat = {
        "metadata": {"name": "n1", "namespace": "kube-node-lease", "resourceVersion": "7"},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40,
                 "renewTime": "2026-11-23T12:00:00.000000Z"},
    }  # fmt: skip
    node = {
        "metadata": {"name": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    node_view(node, heartbeat, clock, timedelta(seconds=20))
    mono.t += 60.0
    stale = node_view(node, heartbeat, clock, timedelta(seconds=20))
    assert stale.heartbeat_stale and stale.heartbeat_age == timedelta(seconds=60)
    fresh_view = node_view(
        node, heartbeat, clock, timedelta(seconds=20), watched_for=timedelta(seconds=3)
    )
    assert not fresh_view.heartbeat_stale and fresh_view.heartbeat_age == timedelta(seconds=3)
