"""Which replica may take the operator's leader Lease (pure rule)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dedup_operator.leader import LeaseState, may_take

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_free_own_or_expired_leases_may_be_taken() -> None:
    assert may_take(LeaseState(None, None, 15), "me", T0)
    assert may_take(LeaseState("me", T0, 15), "me", T0)
    held = LeaseState("other", T0, 15)
    assert not may_take(held, "me", T0 + timedelta(seconds=14.9))
    assert may_take(held, "me", T0 + timedelta(seconds=15))
