"""API objects (as the API server serves them) read into the failover decision's views."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dedup_contract.lease_clock import LeaseClock
from dedup_contract.timefmt import format_micro_time, parse_time
from dedup_operator.failover import LeaseView
from dedup_operator.observed import (
    attachments_of,
    lease_view,
    node_pod,
    node_view,
    pod_view,
    tolerates_out_of_service,
    worker_lease_name,
)


def test_node_view_reads_ready_condition_and_out_of_service_taint() -> None:
    node = {
        "metadata": {"name": "node-a"},
        "spec": {
            "taints": [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"},
            ]
        },
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "lastTransitionTime": "2026-11-22T10:00:00Z",
                },
            ]
        },
    }
    view = node_view(node)
    assert (view.name, view.ready, view.out_of_service) == ("node-a", "Unknown", True)
    assert view.ready_since == datetime(2026, 11, 22, 10, tzinfo=UTC)


def test_node_without_conditions_is_unknown() -> None:
    view = node_view({"metadata": {"name": "n"}})
    assert (view.ready, view.ready_since, view.out_of_service) == ("Unknown", None, False)


def test_pod_view() -> None:
    pod = {
        "metadata": {
            "name": "events-p0-e2",
            "deletionTimestamp": "2026-11-22T10:00:00Z",
            "annotations": {"dedup.io/spec-hash": "abc"},
        },
        "spec": {"nodeName": "node-b"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    view = pod_view(pod, 2, "dedup.io/spec-hash")
    assert (view.name, view.epoch, view.node, view.phase) == (
        "events-p0-e2",
        2,
        "node-b",
        "Running",
    )
    assert view.ready and view.deleting and view.spec_hash == "abc"
    pending = pod_view({"metadata": {"name": "p"}, "spec": {}}, 1)
    assert (pending.node, pending.phase, pending.ready, pending.deleting) == (
        None,
        "Pending",
        False,
        False,
    )


def test_a_worker_exited_on_a_newer_releases_store_is_read_from_its_termination() -> None:
    line = (
        '{"level": "ERROR", "logger": "dedup_worker", "message": "store refused: store at '
        "/var/lib/dedup/store has format 3, written by release 0.3.0; this worker is release "
        '0.2.0 and reads formats up to 2: a newer release wrote it (StoreTooNew; ...)"}'
    )

    def pod(state: str, exit_code: int, message: str) -> dict[str, object]:
        terminated = {"terminated": {"exitCode": exit_code, "message": message}}
        container = {"name": "worker", state: terminated}
        return {"metadata": {"name": "p"}, "status": {"containerStatuses": [container]}}

    found = pod_view(pod("lastState", 5, f'{{"message": "opening"}}\n{line}\n'), 1)
    assert found.store_too_new is not None
    assert found.store_too_new.startswith("store refused: store at /var/lib/dedup/store")
    assert "release 0.3.0" in found.store_too_new and "StoreTooNew" in found.store_too_new
    assert pod_view(pod("state", 5, line), 1).store_too_new == found.store_too_new
    assert pod_view(pod("lastState", 3, line), 1).store_too_new is None  # fenced, not this
    other = '{"message": "store refused: store at /s belongs to analytics/other/p0"}'
    assert pod_view(pod("lastState", 5, other), 1).store_too_new is None  # another refusal
    assert pod_view({"metadata": {"name": "p"}}, 1).store_too_new is None


def test_lease_view_and_expiry() -> None:
    lease = {
        "spec": {
            "holderIdentity": "events-p0-e3",
            "leaseTransitions": 3,
            "leaseDurationSeconds": 15,
            "renewTime": "2026-11-22T10:00:00.250000Z",
        }
    }
    view = lease_view(lease)
    assert (view.holder, view.epoch, view.duration) == ("events-p0-e3", 3, timedelta(seconds=15))
    # renewTime is from 2026-11-22 (long ago, or another clock): no clock, no history ->
    # renewed just now, a full duration to go
    assert not view.expired() and view.remaining() == timedelta(seconds=15)
    free = lease_view({"spec": {"leaseDurationSeconds": 15}})
    assert free.holder is None and free.epoch == 0 and free.expired()


def test_lease_view_counts_on_the_operators_clock() -> None:
    t = [100.0]
    clock = LeaseClock(monotonic=lambda: t[0])

    def seen(renew: str, version: str, holder: str = "events-p0-e3") -> LeaseView:
        meta = {"namespace": "ns", "name": "events-p0", "resourceVersion": version}
        spec = {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew,
                "acquireTime": "2026-11-22T09:00:00.000000Z"}  # fmt: skip
        return lease_view({"metadata": meta, "spec": spec}, clock)

    assert seen("2026-11-22T10:00:00.000000Z", "1").unchanged_for == timedelta(0)
    t[0] = 114.9
    assert not seen("2026-11-22T10:00:00.000000Z", "1").expired()
    t[0] = 115.0
    assert seen("2026-11-22T10:00:00.000000Z", "1").expired()
    # a renewal (any change) restarts the count, whatever time it writes (here: older)
    t[0] = 116.0
    view = seen("2026-11-22T09:59:00.000000Z", "2")
    assert view.unchanged_for == timedelta(0) and view.remaining() == timedelta(seconds=15)
    # released by its holder: renewTime a duration before acquireTime -> free at once
    assert seen("2026-11-22T08:59:45.000000Z", "3").expired()


def test_attachments_of_one_volume() -> None:
    vas = [
        {
            "metadata": {"name": "csi-1"},
            "spec": {"nodeName": "node-a", "source": {"persistentVolumeName": "pv-1"}},
            "status": {"attached": True},
        },
        {
            "metadata": {"name": "csi-2"},
            "spec": {"nodeName": "node-b", "source": {"persistentVolumeName": "pv-2"}},
        },
    ]
    assert [a.name for a in attachments_of(vas, "pv-1")] == ["csi-1"]
    assert attachments_of(vas, "pv-1")[0].attached
    assert attachments_of(vas, None) == ()


def test_micro_time_round_trip() -> None:
    t = datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=UTC)
    assert format_micro_time(t) == "2026-11-22T10:00:00.123456Z"
    assert parse_time(format_micro_time(t)) == t


def test_node_view_reads_the_operators_taint_mark() -> None:
    node = {
        "metadata": {
            "name": "n",
            "annotations": {"dedup.io/out-of-service-taint-by": "b/p2, a/p1,"},
        }
    }
    assert node_view(node).tainted_by == ("a/p1", "b/p2")
    assert node_view({"metadata": {"name": "n"}}).tainted_by == ()


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        ({"operator": "Exists"}, True),
        ({"key": "node.kubernetes.io/out-of-service", "operator": "Exists"}, True),
        ({"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown"}, True),
        (
            {
                "key": "node.kubernetes.io/out-of-service",
                "operator": "Exists",
                "effect": "NoExecute",
            },
            True,
        ),
        ({"key": "node.kubernetes.io/out-of-service", "value": "other"}, False),
        (
            {
                "key": "node.kubernetes.io/out-of-service",
                "operator": "Exists",
                "tolerationSeconds": 30,
            },
            False,
        ),
        ({"key": "node.kubernetes.io/out-of-service", "effect": "NoSchedule"}, False),
        ({"key": "node.kubernetes.io/unreachable", "operator": "Exists"}, False),
    ],
)
def test_out_of_service_toleration(toleration: dict[str, object], tolerates: bool) -> None:
    assert tolerates_out_of_service({"spec": {"tolerations": [toleration]}}) is tolerates


def test_node_pod_kinds() -> None:
    ds = {
        "metadata": {
            "name": "agent-x",
            "namespace": "kube-system",
            "ownerReferences": [{"kind": "DaemonSet", "name": "agent", "controller": True}],
        }
    }
    assert node_pod(ds).daemon_set and not node_pod(ds).evicted_by_taint()
    mirror = {"metadata": {"name": "m", "annotations": {"kubernetes.io/config.mirror": "x"}}}
    assert node_pod(mirror).mirror
    done = {"metadata": {"name": "j"}, "status": {"phase": "Succeeded"}}
    assert node_pod(done).finished
    db = {"metadata": {"name": "db-0", "namespace": "shop"}, "status": {"phase": "Running"}}
    view = node_pod(db)
    assert view.evicted_by_taint() and not view.worker and view.ref == "shop/db-0"


def test_worker_pod_on_a_node_with_its_lease() -> None:
    worker = {
        "metadata": {
            "name": "events-p1-e3",
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/component": "worker",
                "dedup.io/pipeline": "events",
                "dedup.io/partition": "1",
            },
        }
    }
    assert worker_lease_name(worker) == "events-p1"
    assert worker_lease_name({"metadata": {"name": "x", "labels": {}}}) is None
    lease = {"spec": {"holderIdentity": "events-p1-e3", "leaseTransitions": 3}}
    view = node_pod(worker, lease, worker=True)
    assert view.worker and view.worker_lease is not None and view.worker_lease.epoch == 3


def test_pod_view_reads_the_schedulers_reason() -> None:
    pod = {
        "metadata": {"name": "events-p0-e2"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient cpu.",
                    "lastTransitionTime": "2026-11-22T10:00:00Z",
                }
            ],
        },
    }
    view = pod_view(pod, 2)
    assert view.unschedulable == "0/3 nodes are available: 3 Insufficient cpu."
    assert view.unschedulable_since == datetime(2026, 11, 22, 10, tzinfo=UTC)
    assert pod_view({"metadata": {"name": "x"}}, 1).unschedulable is None


def test_node_view_heartbeat_from_its_node_lease_on_the_operators_clock() -> None:
    t = [0.0]
    clock = LeaseClock(monotonic=lambda: t[0])
    node = {"metadata": {"name": "node-a"}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T10:00:00Z"}]}}  # fmt: skip

    def beat(version: str) -> dict[str, object]:
        return {
            "metadata": {"namespace": "kube-node-lease", "name": "node-a",
                         "resourceVersion": version},
            "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40,
                     "renewTime": f"2026-11-22T10:00:0{version}.000000Z"},
        }  # fmt: skip

    lost_after = timedelta(seconds=20)
    assert node_view(node).heartbeat_age is None  # no node Lease: the Ready condition
    first = node_view(node, beat("1"), clock, lost_after)
    assert first.heartbeat_age == timedelta(0) and first.up
    t[0] = 19.9
    assert node_view(node, beat("1"), clock, lost_after).up
    t[0] = 20.0
    stale = node_view(node, beat("1"), clock, lost_after)
    # Ready still says True (the controller's grace period), the heartbeat decides
    assert stale.heartbeat_stale and not stale.up and stale.ready == "True"
    t[0] = 21.0
    assert node_view(node, beat("2"), clock, lost_after).up  # renewed: back


def test_without_a_node_lease_the_ready_condition_is_timed_on_the_operators_clock() -> None:
    """lastTransitionTime is the controller's wall clock: a day old here, yet a restarted
    operator counts the node NotReady only from when it saw that condition."""
    t = [0.0]
    clock = LeaseClock(monotonic=lambda: t[0])
    node = {"metadata": {"name": "node-a"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-11-21T10:00:00Z"}]}}  # fmt: skip
    now = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    assert node_view(node, None, clock).lost_for(now) == timedelta(0)
    t[0] = 12.5
    assert node_view(node, None, clock).lost_for(now) == timedelta(seconds=12.5)
    assert node_view(node).lost_for(now) == timedelta(days=1)  # no clock: the old way
