"""Which replica may take the operator's leader Lease (pure rule)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dedup_operator.leader import LeaseState, may_take

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_free_own_or_expired_leases_may_be_taken() -> None:
    """Expired: seen unchanged for its duration on the replica's own clock; the holder's
    renewTime (an hour off here) is never compared with ours."""
    assert may_take(LeaseState(None, None, 15), "me", 0)
    assert may_take(LeaseState("me", T0, 15), "me", 0)
    for renewed in (T0, T0 - timedelta(hours=1), T0 + timedelta(hours=1)):
        held = LeaseState("other", renewed, 15, acquire_time=T0 - timedelta(hours=2))
        assert not may_take(held, "me", 0)  # at first sight (a replica just started)
        assert not may_take(held, "me", 14.9)
        assert may_take(held, "me", 15)
