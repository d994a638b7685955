"""The one Lease expiry rule (dedup_worker.lease_clock): run out only after a full
duration seen unchanged on the reader's own monotonic clock; released by its holder when
renewTime is a duration before acquireTime (one clock); never a comparison of two
machines' wall clocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dedup_worker import lease_clock
from dedup_worker.lease_clock import LeaseClock, LeaseStamp

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
