"""The per-partition decision (dedup_operator.failover): every step of a handover from
observed state alone, idempotent, and resumable by an operator that restarted."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from dedup_operator.failover import (
    AttachmentView,
    BeginHandover,
    CancelHandover,
    CompleteHandover,
    CreateLease,
    CreatePod,
    DeletePods,
    FailoverPolicy,
    Handover,
    HandoverReason,
    LeaseView,
    NodeView,
    PartitionObservation,
    PodView,
    ReleaseVolume,
    Steady,
    TaintOutOfService,
    partition_action,
    remove_out_of_service_taint,
)

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
POLICY = FailoverPolicy(node_lost_after=timedelta(seconds=10))


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(name: str, ready: str = "True", since: float = -1000, oos: bool = False) -> NodeView:
    return NodeView(name=name, ready=ready, ready_since=s(since), out_of_service=oos)


NODES = {n.name: n for n in (node("a"), node("b"))}


def pod(epoch: int, node_name: str | None = "a", **kw: object) -> PodView:
    fields: dict[str, object] = {"phase": "Running", "ready": True, **kw}
    return PodView(name=f"events-p0-e{epoch}", epoch=epoch, node=node_name, **fields)  # type: ignore[arg-type]


def lease(
    epoch: int, holder: str | None = None, renewed: float = 0, duration: float = 5
) -> LeaseView:
    return LeaseView(
        holder=holder,
        epoch=epoch,
        renew_time=s(renewed) if holder else None,
        duration=timedelta(seconds=duration),
    )


def obs(**kw: object) -> PartitionObservation:
    base: dict[str, object] = {
        "partition": 0,
        "pods": (pod(1),),
        "nodes": NODES,
        "lease": lease(1, "events-p0-e1"),
        "attachments": (),
        "handover": None,
    }
    base.update(kw)
    return PartitionObservation(**base)  # type: ignore[arg-type]


def test_no_lease_is_created_first() -> None:
    assert partition_action(obs(lease=None, pods=()), POLICY, T0).action == CreateLease()


def test_first_start_creates_epoch_one() -> None:
    d = partition_action(obs(pods=(), lease=lease(0)), POLICY, T0)
    assert d.action == CreatePod(epoch=1)
    assert d.handover is None


def test_healthy_partition_is_steady() -> None:
    d = partition_action(obs(), POLICY, s(1))
    assert d.action == Steady() and d.handover is None


def test_node_not_ready_shorter_than_node_lost_after_waits() -> None:
    nodes = {**NODES, "a": node("a", "Unknown", since=0)}
    d = partition_action(obs(nodes=nodes), POLICY, s(9))
    assert isinstance(d.action, Steady) and d.action.until == s(10)


def node_lost_handover() -> Handover:
    return Handover(HandoverReason.NODE_LOST, s(10), 1, "events-p0-e1", "a")


def test_node_lost_begins_a_handover() -> None:
    nodes = {**NODES, "a": node("a", "Unknown", since=0)}
    d = partition_action(obs(nodes=nodes), POLICY, s(10))
    assert d.action == BeginHandover(node_lost_handover())
    assert d.handover == node_lost_handover()


def test_node_deleted_counts_as_lost() -> None:
    d = partition_action(obs(nodes={"b": node("b")}), POLICY, s(0))
    assert isinstance(d.action, BeginHandover)
    assert d.action.handover.reason == HandoverReason.NODE_LOST


def test_full_node_loss_handover_with_out_of_service_taint() -> None:
    lost = {**NODES, "a": node("a", "Unknown", since=0)}
    h = node_lost_handover()
    # 1. the old worker's Lease (renewed at 8s, 5s long) has not run out: wait
    held = lease(1, "events-p0-e1", 8)
    d = partition_action(obs(nodes=lost, handover=h, lease=held), POLICY, s(12))
    assert isinstance(d.action, Steady) and d.action.until == s(13)
    assert "fenced" not in (d.handover or h).steps
    # 2. expired: taint the lost node
    expired = held
    d = partition_action(obs(nodes=lost, handover=h, lease=expired), POLICY, s(13))
    assert d.action == TaintOutOfService("a")
    assert d.handover is not None and d.handover.steps == {"fenced": 3.0}
    h = d.handover
    # 3. tainted: force-delete the pod (as pod GC would)
    tainted = {**lost, "a": node("a", "Unknown", since=0, oos=True)}
    d = partition_action(obs(nodes=tainted, handover=h, lease=expired), POLICY, s(14))
    assert d.action == DeletePods(("events-p0-e1",), force=True, why="its node is out of service")
    # 4. pod gone, VolumeAttachment still there: wait
    va = AttachmentView("csi-x", "a", True)
    d = partition_action(
        obs(nodes=tainted, handover=h, lease=expired, pods=(), attachments=(va,)), POLICY, s(15)
    )
    assert isinstance(d.action, Steady) and "detach" in (d.action.waiting_for or "")
    assert d.handover is not None and "released" in d.handover.steps
    h = d.handover
    # 5. detached: replacement at the next epoch, away from the lost node
    d = partition_action(obs(nodes=tainted, handover=h, lease=expired, pods=()), POLICY, s(16))
    assert d.action == CreatePod(epoch=2, avoid_node="a")
    assert d.handover is not None and set(d.handover.steps) == {
        "fenced",
        "released",
        "detached",
        "started",
    }
    h = d.handover
    # 6. the replacement is running but not ready yet, then ready: complete
    new = pod(2, "b", ready=False)
    d = partition_action(obs(nodes=tainted, handover=h, lease=expired, pods=(new,)), POLICY, s(17))
    assert isinstance(d.action, Steady)
    ready = replace(new, ready=True)
    d = partition_action(
        obs(nodes=tainted, handover=h, lease=lease(2, new.name, 18), pods=(ready,)), POLICY, s(19)
    )
    assert isinstance(d.action, CompleteHandover) and d.action.pod == "events-p0-e2"
    assert d.action.handover.steps["ready"] == 9.0
    assert d.handover is None


def test_replacement_is_never_created_twice_after_operator_restart() -> None:
    """An operator killed after creating the pod but before recording it sees the pod."""
    h = replace(node_lost_handover(), steps={"fenced": 0, "released": 1, "detached": 2})
    d = partition_action(
        obs(handover=h, lease=lease(1), pods=(pod(2, "b", phase="Pending", ready=False),)),
        POLICY,
        s(20),
    )
    assert isinstance(d.action, Steady)


def test_replacement_waits_while_any_volume_attachment_exists() -> None:
    h = replace(node_lost_handover(), steps={"fenced": 0, "released": 1})
    va = AttachmentView("csi-x", "a", False)  # even a detaching one
    for t in (12, 100):
        d = partition_action(
            obs(handover=h, lease=lease(1), pods=(), attachments=(va,)), POLICY, s(t)
        )
        assert not isinstance(d.action, CreatePod)


def test_volume_that_will_not_detach_degrades_after_the_timeout() -> None:
    policy = replace(POLICY, detach_timeout=timedelta(seconds=60))
    h = replace(node_lost_handover(), steps={"fenced": 0, "released": 1})  # released at 11s
    va = AttachmentView("csi-x", "a", True)
    d = partition_action(obs(handover=h, lease=lease(1), pods=(), attachments=(va,)), policy, s(70))
    assert d.degraded is None
    d = partition_action(obs(handover=h, lease=lease(1), pods=(), attachments=(va,)), policy, s(71))
    assert d.degraded is not None and "csi-x on a" in d.degraded
    assert isinstance(d.action, Steady)


def test_wait_for_detach_force_deletes_only_the_pod() -> None:
    policy = replace(POLICY, release_volume=ReleaseVolume.WAIT_FOR_DETACH)
    lost = {**NODES, "a": node("a", "Unknown", since=0)}
    d = partition_action(
        obs(nodes=lost, handover=node_lost_handover(), lease=lease(1)), policy, s(20)
    )
    assert d.action == DeletePods(
        ("events-p0-e1",), force=True, why="its node is lost (WaitForDetach)"
    )


def test_node_back_before_fencing_cancels_the_handover() -> None:
    d = partition_action(
        obs(handover=node_lost_handover(), lease=lease(1, "events-p0-e1", 11)), POLICY, s(12)
    )
    assert isinstance(d.action, CancelHandover) and d.handover is None


def test_node_back_after_fencing_does_not_cancel() -> None:
    h = node_lost_handover().mark("fenced", s(12))
    d = partition_action(obs(handover=h, lease=lease(1, "events-p0-e1", 0)), POLICY, s(13))
    assert not isinstance(d.action, CancelHandover)


def test_failed_pod_is_deleted_gracefully_then_replaced() -> None:
    failed = pod(1, phase="Failed", ready=False)
    d = partition_action(obs(pods=(failed,), lease=lease(1)), POLICY, s(0))
    assert isinstance(d.action, BeginHandover)
    h = d.action.handover
    assert h.reason == HandoverReason.POD_FAILED
    d = partition_action(obs(pods=(failed,), lease=lease(1), handover=h), POLICY, s(1))
    assert d.action == DeletePods(("events-p0-e1",), force=False, why="handover (PodFailed)")
    d = partition_action(obs(pods=(), lease=lease(1), handover=d.handover), POLICY, s(2))
    assert d.action == CreatePod(epoch=2, avoid_node=None)


def test_spec_change_stops_the_old_worker_before_waiting_for_its_lease() -> None:
    held = lease(1, "events-p0-e1", renewed=0, duration=5)
    h = Handover(HandoverReason.SPEC_CHANGED, s(0), 1, "events-p0-e1", "a")
    d = partition_action(obs(lease=held, handover=h), POLICY, s(1))
    assert d.action == DeletePods(("events-p0-e1",), force=False, why="handover (SpecChanged)")
    d = partition_action(obs(lease=held, handover=h, pods=()), POLICY, s(2))
    assert isinstance(d.action, Steady) and d.action.until == s(5)
    released = lease(1, "events-p0-e1", renewed=-5, duration=5)  # given up on SIGTERM
    d = partition_action(obs(lease=released, handover=h, pods=()), POLICY, s(2))
    assert d.action == CreatePod(epoch=2, avoid_node=None)


def test_vanished_pod_is_replaced_after_its_lease_expires() -> None:
    held = lease(3, "events-p0-e3", renewed=0)
    d = partition_action(obs(pods=(), lease=held), POLICY, s(1))
    assert isinstance(d.action, BeginHandover)
    h = d.action.handover
    assert (h.reason, h.from_epoch, h.from_pod) == (HandoverReason.POD_GONE, 3, "events-p0-e3")
    d = partition_action(obs(pods=(), lease=held, handover=h), POLICY, s(2))
    assert isinstance(d.action, Steady) and d.action.until == s(5)
    d = partition_action(obs(pods=(), lease=held, handover=h), POLICY, s(5))
    assert d.action == CreatePod(epoch=4)


def test_terminating_pod_on_a_healthy_node_is_waited_for() -> None:
    d = partition_action(obs(pods=(pod(1, deleting=True),)), POLICY, s(0))
    assert isinstance(d.action, Steady) and "terminate" in (d.action.waiting_for or "")


@pytest.mark.parametrize(
    ("may_roll", "ready", "rolls"), [(True, True, True), (False, True, False), (True, False, False)]
)
def test_spec_change_rolls_only_when_allowed(may_roll: bool, ready: bool, rolls: bool) -> None:
    o = obs(pods=(pod(1, spec_hash="old", ready=ready),), desired_hash="new", may_roll=may_roll)
    d = partition_action(o, POLICY, s(0))
    assert isinstance(d.action, BeginHandover) == rolls


def test_superseded_pods_are_deleted() -> None:
    d = partition_action(obs(pods=(pod(1, "a"), pod(2, "b"))), POLICY, s(0))
    assert d.action == DeletePods(("events-p0-e1",), force=False, why="superseded by a newer epoch")


def test_next_epoch_is_above_everything_seen() -> None:
    """A pod that never took its Lease (epoch 1 stuck on a lost node, Lease still at 0)
    is replaced by epoch 2, never by a second pod of the same name."""
    h = replace(node_lost_handover(), steps={"fenced": 0, "released": 1})
    d = partition_action(obs(handover=h, pods=(), lease=lease(0)), POLICY, s(20))
    assert d.action == CreatePod(epoch=2, avoid_node="a")


def test_handover_round_trips_through_status() -> None:
    h = node_lost_handover().mark("fenced", s(12))
    assert Handover.from_status(h.to_status()) == h
    assert h.to_status()["started"] == "2026-11-22T12:00:10Z"


def test_out_of_service_taint_removal() -> None:
    assert remove_out_of_service_taint(node("a", oos=True), 0)
    assert not remove_out_of_service_taint(node("a", oos=True), 1)
    assert not remove_out_of_service_taint(node("a", "Unknown", oos=True), 0)
    assert not remove_out_of_service_taint(node("a"), 0)
