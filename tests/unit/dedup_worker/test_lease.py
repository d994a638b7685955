"""The partition Lease's rules (dedup_worker.lease): who may take it, when the holder
still holds it, and what it writes. Expiry is `dedup_contract.lease_clock`'s rule: seen
unchanged for a duration on the reader's monotonic clock (`unchanged_for_s` below);
renewTime is only ever compared with acquireTime, written by the same clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dedup_contract.lease_clock import LeaseTiming
from dedup_worker.lease import (
    Acquire,
    Claim,
    LeaseRecord,
    Superseded,
    Wait,
    decide,
    held,
    is_ours,
    released,
    renewed,
    taken,
)

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
ME = Claim("events-p0-e2", epoch=2, duration_s=15)


def lease(
    holder: str | None = None, transitions: int = 0, renewed_ago_s: float | None = None
) -> LeaseRecord:
    renew = None if renewed_ago_s is None else NOW - timedelta(seconds=renewed_ago_s)
    return LeaseRecord(holder, transitions, renew, 15, acquire_time=renew)


@pytest.mark.parametrize(
    ("observed", "unchanged_for_s"),
    [
        # free (as the operator creates it), older epoch: at first sight
        (lease(), 0),
        (lease(transitions=1), 0),
        # an older epoch's hold seen unchanged for its duration: taken at once
        (lease("events-p0-e1", 1, renewed_ago_s=0), 15),
        (lease("events-p0-e1", 1, renewed_ago_s=0), 3600),
        # already ours (this pod's worker restarted): taken back, expired or not
        (lease("events-p0-e2", 2, renewed_ago_s=1), 0),
        (lease("events-p0-e2", 2, renewed_ago_s=100), 100),
    ],
)
def test_worker_takes_a_free_expired_or_own_lease(
    observed: LeaseRecord, unchanged_for_s: float
) -> None:
    assert decide(observed, ME, unchanged_for_s) == Acquire()


def test_worker_waits_for_an_older_epochs_live_hold_to_expire() -> None:
    held_e1 = lease("events-p0-e1", 1, renewed_ago_s=0)
    assert decide(held_e1, ME, 5) == Wait(holder="events-p0-e1", remaining_s=10)
    # expiry is a full leaseDurationSeconds seen unchanged, exactly (the operator's rule)
    assert decide(held_e1, ME, 14.999) != Acquire()
    assert decide(held_e1, ME, 15) == Acquire()


@pytest.mark.parametrize("skew_s", [-3600, -30, 0, 30, 3600])
def test_the_holders_clock_makes_no_difference(skew_s: float) -> None:
    """renewTime 30 s or an hour off (old or new) looks the same: at first sight a held
    Lease has a full duration to go; after a duration unchanged it has run out."""
    skewed = lease("events-p0-e1", 1, renewed_ago_s=-skew_s)
    assert decide(skewed, ME, 0) == Wait(holder="events-p0-e1", remaining_s=15)
    assert decide(skewed, ME, 15) == Acquire()


@pytest.mark.parametrize(
    "observed",
    [
        lease("events-p0-e2b", 2, renewed_ago_s=1),  # same epoch, someone else
        lease("events-p0-e3", 3, renewed_ago_s=1000),  # newer epoch, even expired
        lease(None, 2),  # released by a worker of our epoch or newer
        lease("events-p0-e2", 3),  # names us but with a newer epoch
    ],
)
def test_worker_of_an_old_epoch_is_superseded(observed: LeaseRecord) -> None:
    decision = decide(observed, ME, 10**6)
    assert isinstance(decision, Superseded)
    assert str(observed.transitions) in decision.reason


def test_taking_writes_holder_epoch_times_and_duration() -> None:
    before = lease("events-p0-e1", 1, renewed_ago_s=60)
    after = taken(before, ME, NOW)
    assert after == LeaseRecord("events-p0-e2", 2, NOW, 15, acquire_time=NOW)
    assert is_ours(after, ME)
    # retaking its own Lease keeps the original acquireTime
    again = taken(after, ME, NOW + timedelta(seconds=30))
    assert again.acquire_time == NOW and again.renew_time == NOW + timedelta(seconds=30)


def test_renewing_moves_only_the_renew_time() -> None:
    mine = taken(lease(), ME, NOW)
    later = NOW + timedelta(seconds=5)
    assert renewed(mine, later) == LeaseRecord("events-p0-e2", 2, later, 15, acquire_time=NOW)


def test_released_lease_counts_as_expired_now_and_keeps_its_holder() -> None:
    mine = taken(lease(), ME, NOW)
    out = released(mine, NOW + timedelta(seconds=7))
    assert out.holder == ME.identity and out.transitions == ME.epoch
    assert out.free() and out.expired(unchanged_for_s=0)
    assert not mine.free() and not mine.expired(unchanged_for_s=0)
    # renewTime is one duration before acquireTime: both from the holder's clock
    assert out.acquire_time == NOW and out.renew_time == NOW - timedelta(seconds=15)
    # the next epoch takes it at once, at first sight; this pod's restarted worker too
    assert decide(out, Claim("events-p0-e3", 3, 15), 0) == Acquire()
    assert decide(out, ME, 0) == Acquire()
    # renewed again (its worker came back): held, not free
    assert not taken(out, ME, NOW + timedelta(seconds=8)).free()


def test_is_ours_needs_both_identity_and_epoch() -> None:
    assert not is_ours(lease("events-p0-e2", 3), ME)
    assert not is_ours(lease("events-p0-e3", 2), ME)
    assert is_ours(lease("events-p0-e2", 2), ME)


def test_holder_holds_until_the_renew_deadline_of_the_last_renew_sent() -> None:
    timing = LeaseTiming.for_duration(15)
    assert (timing.renew_every_s, timing.renew_deadline_s) == (5, 10)
    until = timing.held_until(last_renew_sent=100.0)
    assert held(until, 100.0)
    assert held(until, 109.999)
    assert not held(until, 110.0)  # strictly before the deadline
    assert not held(None, 0.0)  # never renewed: not held
    # the holder lets go a third of a duration before others may take it
    assert timing.duration_s - timing.renew_deadline_s == 5


@pytest.mark.parametrize(("every", "deadline"), [(5, 5), (0, 10), (10, 5), (5, 15)])
def test_timing_must_renew_before_the_deadline_and_let_go_before_expiry(
    every: float, deadline: float
) -> None:
    with pytest.raises(ValueError, match="renew interval < renew deadline < lease duration"):
        LeaseTiming(15, every, deadline)


def test_claim_is_checked() -> None:
    with pytest.raises(ValueError, match="epoch must be >= 1"):
        Claim("x", 0, 15)
    with pytest.raises(ValueError, match="identity"):
        Claim("", 1, 15)
