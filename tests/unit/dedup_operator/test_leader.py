"""Which replica may take the operator's leader Lease (pure rule)."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

import pytest

from dedup_contract.lease_clock import LeaseTiming
from dedup_operator.leader import (
    POD_NAME_ENV,
    LeaderElection,
    LeaseState,
    leader_identity,
    may_take,
)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_free_own_or_expired_leases_may_be_taken() -> None:
    """Expired: seen unchanged for its duration on the replica's own clock; the holder's
    renewTime (an hour off here) is never compared with ours."""
    assert may_take(LeaseState(None, None, 15), "me", 0, written_by_me=False)
    assert may_take(LeaseState("me", T0, 15), "me", 0, written_by_me=True)
    for renewed in (T0, T0 - timedelta(hours=1), T0 + timedelta(hours=1)):
        held = LeaseState("other", renewed, 15, acquire_time=T0 - timedelta(hours=2))
        assert not may_take(held, "me", 0, False)  # at first sight (a replica just started)
        assert not may_take(held, "me", 14.9, False)
        assert may_take(held, "me", 15, False)


def test_a_lease_under_our_name_that_we_did_not_write_is_someone_elses() -> None:
    """Another process under the same identity (the bug of `host-pid` identities, where
    two containers had the same host name and PID) wrote the Lease: it is not ours until
    it has run out, like anyone else's."""
    held = LeaseState("me", T0, 15, acquire_time=T0)
    assert not may_take(held, "me", 0, written_by_me=False)
    assert not may_take(held, "me", 14.9, written_by_me=False)
    assert may_take(held, "me", 15, written_by_me=False)


def test_identities_differ_for_the_same_host_name_and_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes with the same host name and PID (containers, hostNetwork replicas on
    one node) get different identities; the pod's name comes first when it is known."""
    monkeypatch.delenv(POD_NAME_ENV, raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "vm-6")
    monkeypatch.setattr(os, "getpid", lambda: 7)
    a, b = leader_identity(), leader_identity()
    assert a != b and a.startswith("vm-6-") and b.startswith("vm-6-")
    monkeypatch.setenv(POD_NAME_ENV, "dedup-operator-5f7c9-abcde")
    c = leader_identity()
    assert c.startswith("dedup-operator-5f7c9-abcde-") and c not in (a, b)
    assert leader_identity("given").startswith("given-")


def test_the_leader_renews_and_holds_by_the_holders_one_timing() -> None:
    """Renew every third of the duration, lead until two thirds after the last good renew
    was sent: the workers' timing (`lease_clock.LeaseTiming`), not a copy of it."""
    from kubernetes import client

    election = LeaderElection(client.ApiClient(), "ns", "me", duration_s=15)
    assert election.timing == LeaseTiming.for_duration(15)
    assert (election.timing.renew_every_s, election.timing.held_until(100.0)) == (5.0, 110.0)
