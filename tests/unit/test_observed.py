"""API objects (as the API server serves them) read into the failover decision's views."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dedup_operator.observed import (
    attachments_of,
    format_micro_time,
    lease_view,
    node_view,
    parse_time,
    pod_view,
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
    assert view.expires_at() == datetime(2026, 11, 22, 10, 0, 15, 250000, tzinfo=UTC)
    free = lease_view({"spec": {"leaseDurationSeconds": 15}})
    assert free.holder is None and free.epoch == 0 and free.expired(datetime.now(UTC))


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
