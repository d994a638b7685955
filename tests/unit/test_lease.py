"""The partition Lease's rules (dedup_worker.lease): who may take it, when the holder
still holds it, and what it writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dedup_worker.lease import (
    Acquire,
    Claim,
    LeaseRecord,
    LeaseTiming,
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
    ("observed", "expected"),
    [
        # free (as the operator creates it), older epoch
        (lease(), Acquire()),
        (lease(transitions=1), Acquire()),
        # expired hold of an older epoch: taken at once, however long ago it expired
        (lease("events-p0-e1", 1, renewed_ago_s=15), Acquire()),
        (lease("events-p0-e1", 1, renewed_ago_s=3600), Acquire()),
        # already ours (this pod's worker restarted): taken back, expired or not
        (lease("events-p0-e2", 2, renewed_ago_s=1), Acquire()),
        (lease("events-p0-e2", 2, renewed_ago_s=100), Acquire()),
    ],
)
def test_worker_takes_a_free_expired_or_own_lease(observed: LeaseRecord, expected: Acquire) -> None:
    assert decide(observed, ME, NOW) == expected


def test_worker_waits_for_an_older_epochs_live_hold_to_expire() -> None:
    decision = decide(lease("events-p0-e1", 1, renewed_ago_s=5), ME, NOW)
    assert decision == Wait(holder="events-p0-e1", until=NOW + timedelta(seconds=10))
    # expiry is renewTime + leaseDurationSeconds, exactly (the operator's rule)
    assert decide(lease("events-p0-e1", 1, renewed_ago_s=14.999), ME, NOW) != Acquire()
    assert decide(lease("events-p0-e1", 1, renewed_ago_s=15), ME, NOW) == Acquire()


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
    decision = decide(observed, ME, NOW)
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
    assert out.expired(NOW + timedelta(seconds=7))
    assert not mine.expired(NOW + timedelta(seconds=7))
    # the next epoch takes it at once; this pod's restarted worker takes it back
    assert decide(out, Claim("events-p0-e3", 3, 15), NOW + timedelta(seconds=7)) == Acquire()
    assert decide(out, ME, NOW + timedelta(seconds=7)) == Acquire()


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
