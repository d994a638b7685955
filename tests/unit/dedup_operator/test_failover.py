"""The per-partition decision (dedup_operator.failover): every step of a handover from
observed state alone, idempotent, and resumable by an operator that restarted.

`lease(..., renewed=X)` is a Lease the operator saw renewed (changed) at s(X) on its own
clock; `partition_action` below turns it into what the shell passes: how long it has
been seen unchanged at the decision's `now` (no renewTime: never a wall clock)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from dedup_contract.handover import HandoverReason, Release, taint_blocked_by, taint_blocked_why
from dedup_operator import failover
from dedup_operator.failover import (
    AttachmentView,
    BeginHandover,
    CancelHandover,
    CompleteHandover,
    CreateLease,
    CreatePod,
    Decision,
    DeletePods,
    FailoverPolicy,
    FenceLease,
    Handover,
    LeaseView,
    NodePod,
    NodeView,
    PartitionObservation,
    PodView,
    ReleaseVolume,
    Steady,
    TaintOutOfService,
    full_disruption,
    join_out_of_service_taint,
    remove_out_of_service_taint,
)

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
POLICY = FailoverPolicy(node_lost_after=timedelta(seconds=10))


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


US = "ns/events"


def node(
    name: str,
    ready: str = "True",
    since: float = -1000,
    oos: bool = False,
    pods: tuple[NodePod, ...] | None = None,
    by: tuple[str, ...] = (),
) -> NodeView:
    return NodeView(
        name=name, ready=ready, ready_since=s(since), out_of_service=oos, pods=pods, tainted_by=by
    )


NODES = {n.name: n for n in (node("a"), node("b"))}


def pod(epoch: int, node_name: str | None = "a", **kw: object) -> PodView:
    fields: dict[str, object] = {"phase": "Running", "ready": True, **kw}
    return PodView(name=f"events-p0-e{epoch}", epoch=epoch, node=node_name, **fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SeenLease(LeaseView):
    """A Lease the operator saw change at s(seen_at)."""

    seen_at: float = 0


def lease(
    epoch: int,
    holder: str | None = None,
    renewed: float = 0,
    duration: float = 5,
    free: bool = False,  # released by its holder (or cleared by the operator's FenceLease)
) -> LeaseView:
    return SeenLease(holder=holder, epoch=epoch, duration=timedelta(seconds=duration),
                     free=free, resource_version=f"rv{renewed}", seen_at=renewed)  # fmt: skip


def _at(view: LeaseView | None, now: datetime) -> LeaseView | None:
    if not isinstance(view, SeenLease):
        return view
    unchanged = max(now - s(view.seen_at), timedelta(0))
    return LeaseView(
        view.holder, view.epoch, view.duration, unchanged, view.free, view.resource_version
    )


def partition_action(o: PartitionObservation, policy: FailoverPolicy, now: datetime) -> Decision:
    """failover.partition_action on the observation as the shell makes it at `now`."""
    nodes = {
        k: n
        if n.pods is None
        else replace(n, pods=tuple(replace(p, worker_lease=_at(p.worker_lease, now)) for p in n.pods))
        for k, n in o.nodes.items()
    }  # fmt: skip
    return failover.partition_action(replace(o, lease=_at(o.lease, now), nodes=nodes), policy, now)


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


def our_worker(renewed: float = 8) -> NodePod:
    """The old worker on node a as the shell sees it on the node: with its Lease."""
    return NodePod(
        "ns", "events-p0-e1", worker=True, worker_lease=lease(1, "events-p0-e1", renewed)
    )


def test_full_node_loss_handover_with_out_of_service_taint() -> None:
    lost = {**NODES, "a": node("a", "Unknown", since=0, pods=(our_worker(),))}
    h = node_lost_handover()
    # 1. the old worker's Lease (renewed at 8s, 5s long) has not run out: wait
    held = lease(1, "events-p0-e1", 8)
    d = partition_action(obs(nodes=lost, handover=h, lease=held), POLICY, s(12))
    assert isinstance(d.action, Steady) and d.action.until == s(13)
    assert "fenced" not in (d.handover or h).steps
    # 2. run out on the operator's clock: clear its holder (compare-and-set on the version
    # seen unchanged) before anything else; not fenced until that is seen
    d = partition_action(obs(nodes=lost, handover=h, lease=held), POLICY, s(13))
    assert d.action == FenceLease("events-p0-e1", "rv8")
    assert "fenced" not in (d.handover or h).steps
    # 3. cleared (holder gone, epoch kept): fenced; taint the lost node
    expired = lease(1)
    d = partition_action(obs(nodes=lost, handover=h, lease=expired), POLICY, s(13))
    assert d.action == TaintOutOfService("a")
    assert d.handover is not None and d.handover.steps == {"fenced": 3.0}
    assert d.handover.release == Release.OUT_OF_SERVICE_TAINT
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
    released = lease(1, "events-p0-e1", renewed=0, free=True)  # given up on SIGTERM
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
    assert d.action == FenceLease("events-p0-e3", "rv0")
    cleared = lease(3)
    d = partition_action(obs(pods=(), lease=cleared, handover=h), POLICY, s(5))
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


def test_out_of_service_taint_removal_only_of_our_own_mark() -> None:
    assert remove_out_of_service_taint(node("a", oos=True, by=(US,)), 0, US)
    assert remove_out_of_service_taint(node("a", oos=True, by=("other/p", US)), 0, US)
    assert not remove_out_of_service_taint(node("a", oos=True, by=(US,)), 1, US)
    assert not remove_out_of_service_taint(node("a", "Unknown", oos=True, by=(US,)), 0, US)
    assert not remove_out_of_service_taint(node("a", by=(US,)), 0, US)
    # an administrator's taint (no mark), or another pipeline's: never ours to lift
    assert not remove_out_of_service_taint(node("a", oos=True), 0, US)
    assert not remove_out_of_service_taint(node("a", oos=True, by=("other/p",)), 0, US)


def test_a_pipeline_relying_on_another_pipelines_taint_joins_its_mark() -> None:
    h = node_lost_handover()
    theirs = node("a", "Unknown", oos=True, by=("other/p",))
    assert join_out_of_service_taint(theirs, US, h)
    assert not join_out_of_service_taint(replace(theirs, tainted_by=("other/p", US)), US, h)
    assert not join_out_of_service_taint(node("a", "Unknown", oos=True), US, h)  # an admin's
    assert not join_out_of_service_taint(replace(theirs, ready="True"), US, h)
    assert not join_out_of_service_taint(theirs, US, None)


# ------------------------------------------------ never harm a neighbour (issue 15)
LOST = {"a": node("a", "Unknown", since=0, pods=(our_worker(0),)), "b": node("b")}


def fenced_handover() -> Handover:
    return node_lost_handover().mark("fenced", s(12))


def test_node_ready_again_after_fencing_is_released_gracefully_never_tainted() -> None:
    h = fenced_handover()
    d = partition_action(obs(handover=h, lease=lease(1)), POLICY, s(13))
    assert d.action == DeletePods(("events-p0-e1",), force=False, why="handover (NodeLost)")
    assert d.handover is not None and d.handover.release == Release.GRACEFUL
    assert "node a is Ready again" in (d.handover.release_why or "")
    h = d.handover
    # terminating: wait; gone: wait for the volume, then the replacement
    d = partition_action(
        obs(handover=h, lease=lease(1), pods=(pod(1, deleting=True),)), POLICY, s(14)
    )
    assert isinstance(d.action, Steady) and "terminate" in (d.action.waiting_for or "")
    va = AttachmentView("csi-x", "a", True)
    d = partition_action(obs(handover=h, lease=lease(1), pods=(), attachments=(va,)), POLICY, s(15))
    assert isinstance(d.action, Steady) and "detach" in (d.action.waiting_for or "")
    d = partition_action(obs(handover=h, lease=lease(1), pods=()), POLICY, s(16))
    assert d.action == CreatePod(epoch=2, avoid_node="a")
    assert d.handover is not None and d.handover.to_status()["release"] == "Graceful"


def test_healed_node_whose_old_worker_took_its_lease_again_is_waited_for() -> None:
    """The old pod restarted on the healed node and renewed its Lease before it was
    deleted: the replacement waits until that Lease is free or run out."""
    h = fenced_handover().released_by(Release.GRACEFUL, "node a is Ready again")
    held = lease(1, "events-p0-e1", renewed=14)
    d = partition_action(obs(handover=h, lease=held, pods=()), POLICY, s(15))
    assert isinstance(d.action, Steady) and d.action.until == s(19)


def test_all_policies_release_a_ready_node_gracefully() -> None:
    for how in ReleaseVolume:
        d = partition_action(
            obs(handover=fenced_handover(), lease=lease(1)),
            replace(POLICY, release_volume=how),
            s(13),
        )
        assert isinstance(d.action, DeletePods) and not d.action.force, how


def test_node_with_a_foreign_pod_is_not_tainted_the_fallback_names_it() -> None:
    db = NodePod("shop", "postgres-0")
    nodes = {**LOST, "a": replace(LOST["a"], pods=(our_worker(0), db))}
    d = partition_action(
        obs(nodes=nodes, handover=fenced_handover(), lease=lease(1)), POLICY, s(13)
    )
    assert isinstance(d.action, DeletePods)
    assert d.action.names == ("events-p0-e1",) and d.action.force  # only our own pod
    assert d.handover is not None and d.handover.release == Release.TAINT_BLOCKED
    why = d.handover.release_why or ""
    assert "node a" in why and "shop/postgres-0" in why and "force-detach" in why
    # then it waits for the controller's force-detach, never tainting
    h = d.handover
    va = AttachmentView("csi-x", "a", True)
    for t in (14, 300):
        d = partition_action(
            obs(nodes=nodes, handover=h, lease=lease(1), pods=(), attachments=(va,)), POLICY, s(t)
        )
        assert isinstance(d.action, Steady) and d.handover is not None
        assert d.handover.release == Release.TAINT_BLOCKED
    d = partition_action(obs(nodes=nodes, handover=h, lease=lease(1), pods=()), POLICY, s(400))
    assert d.action == CreatePod(epoch=2, avoid_node="a")


def test_node_whose_pods_are_unknown_is_not_tainted() -> None:
    nodes = {**LOST, "a": replace(LOST["a"], pods=None)}
    d = partition_action(
        obs(nodes=nodes, handover=fenced_handover(), lease=lease(1)), POLICY, s(13)
    )
    assert isinstance(d.action, DeletePods) and d.action.force
    assert d.handover is not None and d.handover.release == Release.TAINT_BLOCKED
    assert "could not be listed" in (d.handover.release_why or "")


@pytest.mark.parametrize(
    "neighbour",
    [
        NodePod("kube-system", "fluentd-x", daemon_set=True),
        NodePod("kube-system", "kube-proxy-a", mirror=True),
        NodePod("ops", "tolerant", tolerates_out_of_service=True),
        NodePod("batch", "job-done", finished=True),
        NodePod("other", "events-p3-e2", worker=True, worker_lease=lease(2, "events-p3-e2", 0)),
        NodePod("other", "events-p4-e1", worker=True, worker_lease=lease(2, "events-p4-e2", 12)),
        NodePod("other", "events-p5-e1", worker=True, worker_lease=None),
    ],
    ids=lambda p: p.name,
)
def test_pods_the_taint_leaves_alone_or_fenced_workers_allow_it(neighbour: NodePod) -> None:
    nodes = {**LOST, "a": replace(LOST["a"], pods=(our_worker(0), neighbour))}
    d = partition_action(
        obs(nodes=nodes, handover=fenced_handover(), lease=lease(1)), POLICY, s(13)
    )
    assert d.action == TaintOutOfService("a")


def test_taint_waits_for_other_workers_on_the_node_to_be_fenced() -> None:
    other = NodePod("ns", "events-p1-e1", worker=True, worker_lease=lease(1, "events-p1-e1", 10))
    nodes = {**LOST, "a": replace(LOST["a"], pods=(our_worker(0), other))}
    h = fenced_handover()
    d = partition_action(obs(nodes=nodes, handover=h, lease=lease(1)), POLICY, s(13))
    assert isinstance(d.action, Steady) and d.action.until == s(15)
    assert "ns/events-p1-e1" in (d.action.waiting_for or "")
    d = partition_action(obs(nodes=nodes, handover=h, lease=lease(1)), POLICY, s(15))
    assert d.action == TaintOutOfService("a")


def test_external_waits_for_someone_elses_taint_and_never_taints() -> None:
    policy = replace(
        POLICY, release_volume=ReleaseVolume.EXTERNAL, detach_timeout=timedelta(seconds=60)
    )
    h = fenced_handover()
    for t in (13, 71):
        d = partition_action(obs(nodes=LOST, handover=h, lease=lease(1)), policy, s(t))
        assert isinstance(d.action, Steady), d
        assert "out-of-service taint on node a" in (d.action.waiting_for or "")
        assert d.handover is not None and d.handover.release == Release.EXTERNAL
        assert d.degraded is None
    d = partition_action(obs(nodes=LOST, handover=h, lease=lease(1)), policy, s(72))
    assert isinstance(d.action, Steady) and d.degraded is not None
    assert d.degraded_reason == "NoOutOfServiceTaint" and "node a" in d.degraded
    # someone (a node remediation controller, a person) taints it: force-delete our pod
    tainted = {**LOST, "a": replace(LOST["a"], out_of_service=True)}
    d = partition_action(obs(nodes=tainted, handover=h, lease=lease(1)), policy, s(73))
    assert d.action == DeletePods(("events-p0-e1",), force=True, why="its node is out of service")
    assert d.handover is not None and d.handover.release == Release.EXTERNAL


def test_release_round_trips_through_status() -> None:
    h = fenced_handover().released_by(Release.TAINT_BLOCKED, "not tainting node a: shop/db-0")
    assert Handover.from_status(h.to_status()) == h
    assert h.to_status()["release"] == "TaintBlocked"


def test_unschedulable_replacement_degrades_after_the_wait() -> None:
    policy = replace(POLICY, schedule_timeout=timedelta(seconds=120))
    h = replace(
        node_lost_handover(), steps={"fenced": 0, "released": 1, "detached": 2, "started": 2}
    )
    why = "0/3 nodes are available: 1 node(s) had volume node affinity conflict"
    stuck = pod(2, None, phase="Pending", ready=False, unschedulable=why)
    d = partition_action(obs(handover=h, lease=lease(1), pods=(stuck,)), policy, s(12 + 119))
    assert isinstance(d.action, Steady) and d.degraded is None
    assert d.action.until == s(12 + 120) and why in (d.action.waiting_for or "")
    d = partition_action(obs(handover=h, lease=lease(1), pods=(stuck,)), policy, s(12 + 120))
    assert isinstance(d.action, Steady) and d.handover is not None
    assert d.degraded_reason == "Unschedulable"
    assert d.degraded is not None and why in d.degraded and "events-p0-e2" in d.degraded
    # scheduled after all: no longer degraded
    placed = replace(stuck, node="b", unschedulable=None)
    d = partition_action(obs(handover=h, lease=lease(1), pods=(placed,)), policy, s(200))
    assert d.degraded is None


def test_unschedulable_first_pod_degrades_after_the_wait() -> None:
    stuck = pod(
        1, None, phase="Pending", ready=False, unschedulable="no nodes", unschedulable_since=s(0)
    )
    d = partition_action(obs(pods=(stuck,)), POLICY, s(119))
    assert d.degraded is None
    d = partition_action(obs(pods=(stuck,)), POLICY, s(120))
    assert d.degraded is not None and "no nodes" in d.degraded


# ------------------------------------------- heartbeats, clocks and full disruption
def beating(name: str, age: float, ready: str = "True", stale_after: float = 10) -> NodeView:
    """A node whose Lease (kube-node-lease) the operator has seen unchanged for `age` s;
    its Ready condition as the node lifecycle controller last set it."""
    return replace(
        node(name, ready),
        heartbeat_age=timedelta(seconds=age),
        heartbeat_stale=age >= stale_after,
    )


def test_node_lost_from_its_stale_lease_while_ready_still_says_true() -> None:
    """The controller flips Ready only after its grace period (40-50 s); the node's Lease
    seen unchanged for node_lost_after decides first."""
    late = {"a": beating("a", 9.5), "b": beating("b", 1)}
    assert partition_action(obs(nodes=late), POLICY, s(10)).action == Steady()
    lost = {"a": beating("a", 10), "b": beating("b", 1)}
    d = partition_action(obs(nodes=lost), POLICY, s(10))
    assert d.action == BeginHandover(node_lost_handover())


def test_a_heartbeating_node_is_not_lost_whatever_its_ready_condition() -> None:
    nodes = {"a": beating("a", 2, ready="Unknown"), "b": beating("b", 1)}
    d = partition_action(obs(nodes=nodes), POLICY, s(100))
    assert isinstance(d.action, Steady)
    assert not isinstance(d.action, BeginHandover)


def test_stale_heartbeat_with_ready_true_after_fencing_is_not_a_healed_node() -> None:
    """Ready still True (the controller's grace period) is not 'back': the lost node is
    released as lost (tainted), never gracefully."""
    nodes = {"a": replace(beating("a", 13), pods=(our_worker(renewed=0),)), "b": beating("b", 1)}
    d = partition_action(obs(nodes=nodes, handover=node_lost_handover(), lease=lease(1)), POLICY, s(13))  # fmt: skip
    assert d.action == TaintOutOfService("a")
    fenced = replace(node_lost_handover(), steps={"fenced": 3.0})
    # heartbeating again and Ready: released gracefully, never tainted
    nodes = {"a": beating("a", 1), "b": beating("b", 1)}
    d = partition_action(obs(nodes=nodes, handover=fenced, lease=lease(1)), POLICY, s(13))  # fmt: skip
    assert d.action == DeletePods(("events-p0-e1",), force=False, why="handover (NodeLost)")
    assert d.handover is not None and d.handover.release == Release.GRACEFUL


def test_full_disruption_starts_no_node_loss_handover() -> None:
    """Every node's heartbeat stale together: the control plane (or the operator's view
    of it), not the nodes. No handover, no taint, until some node heartbeats again."""
    all_stale = {"a": beating("a", 30), "b": beating("b", 30)}
    assert full_disruption(all_stale, POLICY.node_lost_after, s(30))
    d = partition_action(obs(nodes=all_stale), POLICY, s(30))
    assert isinstance(d.action, Steady) and d.handover is None
    assert "full disruption" in (d.action.waiting_for or "")
    # a handover already fenced does not taint during one either
    nodes = {"a": replace(beating("a", 30), pods=(our_worker(renewed=0),)), "b": beating("b", 30)}
    d = partition_action(obs(nodes=nodes, handover=node_lost_handover(), lease=lease(1)), POLICY, s(30))  # fmt: skip
    assert isinstance(d.action, Steady) and "full disruption" in (d.action.waiting_for or "")
    # one node heartbeating: the lost one is lost
    one_alive = {"a": beating("a", 30), "b": beating("b", 1)}
    assert not full_disruption(one_alive, POLICY.node_lost_after, s(30))
    assert isinstance(partition_action(obs(nodes=one_alive), POLICY, s(30)).action, BeginHandover)
    # without node Leases the Ready condition says the same
    not_ready = {"a": node("a", "Unknown", since=0), "b": node("b", "False", since=0)}
    assert isinstance(partition_action(obs(nodes=not_ready), POLICY, s(30)).action, Steady)


def test_a_restarted_operator_waits_a_full_duration_before_fencing() -> None:
    """No history after a restart: every held Lease is fresh at first sight."""
    from dedup_contract.lease_clock import LeaseClock
    from dedup_operator.observed import lease_view

    raw = {
        "metadata": {"namespace": "ns", "name": "events-p0", "resourceVersion": "7"},
        "spec": {"holderIdentity": "events-p0-e1", "leaseTransitions": 1,
                 "leaseDurationSeconds": 5, "renewTime": "2020-01-01T00:00:00.000000Z"},
    }  # fmt: skip
    t = [0.0]
    restarted = LeaseClock(monotonic=lambda: t[0])
    lost = {**NODES, "a": node("a", "Unknown", since=0, pods=(our_worker(renewed=0),))}
    for at, fenced in ((0.0, False), (4.9, False), (5.0, True)):
        t[0] = at
        view = lease_view(raw, restarted)
        d = failover.partition_action(
            obs(nodes=lost, handover=node_lost_handover(), lease=view), POLICY, s(100 + at)
        )
        assert isinstance(d.action, FenceLease) is fenced, (at, d.action)


@pytest.mark.parametrize("skew_s", [-30, 30])
def test_skewed_renew_time_makes_no_difference(skew_s: int) -> None:
    """A healthy worker whose clock is 30 s behind (renewTime looks old) or ahead is never
    taken for fenced while it renews: only changes seen on the operator's clock count."""
    from dedup_contract.lease_clock import LeaseClock
    from dedup_contract.timefmt import format_micro_time
    from dedup_operator.observed import lease_view

    t = [0.0]
    clock = LeaseClock(monotonic=lambda: t[0])
    wall = datetime(2026, 11, 22, 12, 0, tzinfo=UTC) + timedelta(seconds=skew_s)
    for i in range(20):  # renewed every 2 s (duration 5 s) for 40 s
        t[0] = 2.0 * i
        raw = {
            "metadata": {"namespace": "ns", "name": "events-p0", "resourceVersion": str(i)},
            "spec": {"holderIdentity": "events-p0-e1", "leaseTransitions": 1,
                     "leaseDurationSeconds": 5,
                     "renewTime": format_micro_time(wall + timedelta(seconds=2 * i)),
                     "acquireTime": format_micro_time(wall)},
        }  # fmt: skip
        view = lease_view(raw, clock)
        assert not view.expired() and view.remaining() == timedelta(seconds=5)
        d = failover.partition_action(obs(lease=view), POLICY, s(t[0]))
        assert d.action == Steady()


# ------------------------------------- shared nodes: the cloud's shutdown signal (issue 27)
SHOP_DB = NodePod("shop", "postgres-0")  # another team's workload on the lost node


def shared(shut_down: bool, *others: NodePod, worker_renewed: float = 0) -> dict[str, NodeView]:
    """Node a lost, running our old worker, the shop's database and `others`; shut down
    (the cloud node lifecycle controller's taint) or not."""
    a = replace(
        node("a", "Unknown", since=0, pods=(our_worker(worker_renewed), SHOP_DB, *others)),
        shut_down=shut_down,
    )
    return {"a": a, "b": node("b")}


def test_shut_down_node_with_a_foreign_pod_is_tainted_once_its_worker_is_fenced() -> None:
    """The shutdown taint says nothing runs on the node any more: the foreign pod no
    longer blocks the out-of-service taint. The old worker's Lease must still run out
    first (renewed at 8 s, 5 s long), and be cleared, before anything touches the node."""
    nodes = shared(True, worker_renewed=8)
    h = node_lost_handover()
    held = lease(1, "events-p0-e1", 8)
    d = partition_action(obs(nodes=nodes, handover=h, lease=held), POLICY, s(12))
    assert isinstance(d.action, Steady) and d.action.until == s(13)
    d = partition_action(obs(nodes=nodes, handover=h, lease=held), POLICY, s(13))
    assert d.action == FenceLease("events-p0-e1", "rv8")
    d = partition_action(obs(nodes=nodes, handover=h, lease=lease(1)), POLICY, s(13))
    assert d.action == TaintOutOfService("a")
    assert d.handover is not None and d.handover.release == Release.OUT_OF_SERVICE_TAINT
    why = d.handover.release_why or ""
    assert "node a is shut down (node.cloudprovider.kubernetes.io/shutdown)" in why, why
    assert "shop/postgres-0" in why  # what the taint evicts is named
    # tainted: our own pod force-deleted, as on a node of fenced workers only
    tainted = {**nodes, "a": replace(nodes["a"], out_of_service=True, tainted_by=(US,))}
    d = partition_action(obs(nodes=tainted, handover=d.handover, lease=lease(1)), POLICY, s(14))
    assert d.action == DeletePods(("events-p0-e1",), force=True, why="its node is out of service")


def test_foreign_pod_without_the_shutdown_signal_still_blocks_the_taint() -> None:
    """The default stays neighbour-safe: a lost node (NotReady, heartbeat stale) is not
    known to be down; the foreign pod blocks the taint as before (TaintBlocked)."""
    d = partition_action(
        obs(nodes=shared(False), handover=fenced_handover(), lease=lease(1)), POLICY, s(13)
    )
    assert d.action == DeletePods(
        ("events-p0-e1",),
        force=True,
        why="its node is lost; the out-of-service taint on a is blocked",
    )
    assert d.handover is not None and d.handover.release == Release.TAINT_BLOCKED
    assert taint_blocked_by(d.handover.release_why) == ("shop/postgres-0",)


def test_shut_down_node_still_waits_for_other_workers_leases() -> None:
    """The double fence is unchanged by the signal: another pipeline's worker on the shut
    down node that still holds its Lease (renewed at 10 s, 5 s long) is waited for."""
    other = NodePod("ns", "events-p1-e1", worker=True, worker_lease=lease(1, "events-p1-e1", 10))
    nodes = shared(True, other)
    h = fenced_handover()
    d = partition_action(obs(nodes=nodes, handover=h, lease=lease(1)), POLICY, s(13))
    assert isinstance(d.action, Steady) and d.action.until == s(15)
    assert "ns/events-p1-e1" in (d.action.waiting_for or "")
    assert d.handover is not None and d.handover.release is None
    d = partition_action(obs(nodes=nodes, handover=h, lease=lease(1)), POLICY, s(15))
    assert d.action == TaintOutOfService("a")


def test_shut_down_node_whose_pods_are_unknown_is_not_tainted() -> None:
    """Without the node's pods no worker Lease can be checked: the signal alone is not
    enough."""
    nodes = {**LOST, "a": replace(LOST["a"], pods=None, shut_down=True)}
    d = partition_action(obs(nodes=nodes, handover=fenced_handover(), lease=lease(1)), POLICY, s(13))  # fmt: skip
    assert d.handover is not None and d.handover.release == Release.TAINT_BLOCKED
    assert taint_blocked_by(d.handover.release_why) is None


def test_shutdown_signal_after_the_taint_was_blocked_taints_the_node_after_all() -> None:
    """The cloud controller taints a node only once it is NotReady (40-50 s), often after
    the operator decided from the stale heartbeat. A handover waiting for the 6-minute
    force-detach because the taint was blocked taints the node when the signal comes
    (once every worker there is fenced), instead of waiting the 6 minutes out."""
    d = partition_action(
        obs(nodes=shared(False), handover=fenced_handover(), lease=lease(1)), POLICY, s(13)
    )
    h = d.handover
    assert h is not None and h.release == Release.TAINT_BLOCKED
    va = AttachmentView("csi-x", "a", True)
    waiting = {"handover": h, "lease": lease(1), "pods": (), "attachments": (va,)}
    # pod gone, no signal: wait for the volume (the controller's own force-detach)
    d = partition_action(obs(nodes=shared(False), **waiting), POLICY, s(20))
    assert isinstance(d.action, Steady) and "detach" in (d.action.waiting_for or "")
    h = d.handover
    assert h is not None and "released" in h.steps
    waiting["handover"] = h
    # the signal, while another worker there still holds its Lease: wait for it
    other = NodePod("ns", "events-p1-e1", worker=True, worker_lease=lease(1, "events-p1-e1", 20))
    d = partition_action(obs(nodes=shared(True, other), **waiting), POLICY, s(22))
    assert isinstance(d.action, Steady) and d.action.until == s(25)
    assert d.handover is not None and d.handover.release == Release.TAINT_BLOCKED
    # ... then taint: released by the taint after all, the signal named
    d = partition_action(obs(nodes=shared(True, other), **waiting), POLICY, s(25))
    assert d.action == TaintOutOfService("a")
    assert d.handover is not None and d.handover.release == Release.OUT_OF_SERVICE_TAINT
    assert "is shut down (node.cloudprovider.kubernetes.io/shutdown)" in (
        d.handover.release_why or ""
    )
    assert d.handover.steps == h.steps  # the steps already seen stay as they were
    # tainted: wait for the (now immediate) detach, then the replacement
    h = d.handover
    tainted = {**shared(True), "a": replace(shared(True)["a"], out_of_service=True, tainted_by=(US,))}  # fmt: skip
    d = partition_action(obs(nodes=tainted, **{**waiting, "handover": h}), POLICY, s(26))
    assert isinstance(d.action, Steady) and "detach" in (d.action.waiting_for or "")
    d = partition_action(obs(nodes=tainted, handover=h, lease=lease(1), pods=()), POLICY, s(27))
    assert d.action == CreatePod(epoch=2, avoid_node="a")


@pytest.mark.parametrize("how", [ReleaseVolume.WAIT_FOR_DETACH, ReleaseVolume.EXTERNAL])
def test_policies_that_never_taint_ignore_the_shutdown_signal(how: ReleaseVolume) -> None:
    policy = replace(POLICY, release_volume=how)
    h = fenced_handover()
    d = partition_action(obs(nodes=shared(True), handover=h, lease=lease(1)), policy, s(13))
    assert not isinstance(d.action, TaintOutOfService)
    va = AttachmentView("csi-x", "a", True)
    gone = replace(h, steps={**h.steps, "released": 3.0})
    d = partition_action(
        obs(nodes=shared(True), handover=gone, lease=lease(1), pods=(), attachments=(va,)),
        policy,
        s(20),
    )
    assert isinstance(d.action, Steady)


def test_node_view_reads_the_cloud_shutdown_taint() -> None:
    from dedup_operator.observed import node_view

    raw: dict[str, object] = {
        "metadata": {"name": "node-a"},
        "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/shutdown",
                             "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }  # fmt: skip
    view = node_view(raw)
    assert view.shut_down and not view.out_of_service
    assert not node_view({"metadata": {"name": "node-b"}}).shut_down


def test_taint_blocked_by_reads_the_blocking_pods_back() -> None:
    why = taint_blocked_why("a", "it would evict shop/db-0, ops/cache-1")
    assert taint_blocked_by(why) == ("shop/db-0", "ops/cache-1")
    assert taint_blocked_by("node a was deleted") is None
    assert taint_blocked_by(None) is None


def test_a_pod_gone_from_a_cordoned_node_is_a_planned_drain_handover() -> None:
    """`kubectl drain` cordons the node, then evicts the worker, which stops cleanly and
    releases its Lease: the handover is NodeDrained (planned), from that node, and starts
    the replacement at once; a pod gone from a node that is not cordoned stays PodGone."""
    released = lease(1, "events-p0-e1", renewed=0, free=True)
    cordoned = {**NODES, "a": replace(node("a"), cordoned=True)}
    d = partition_action(obs(pods=(), lease=released, nodes=cordoned, last_node="a"), POLICY, s(1))
    assert isinstance(d.action, BeginHandover)
    h = d.action.handover
    assert (h.reason, h.from_node, h.from_pod) == (HandoverReason.NODE_DRAINED, "a", "events-p0-e1")
    # the released Lease needs no fencing wait: the replacement is created next
    d = partition_action(
        obs(pods=(), lease=released, nodes=cordoned, last_node="a", handover=h), POLICY, s(1)
    )
    assert d.action == CreatePod(epoch=2, avoid_node=None)
    # not cordoned (or no node known): PodGone, as before
    for nodes, last in ((NODES, "a"), (cordoned, None), (cordoned, "gone-node")):
        d = partition_action(
            obs(pods=(), lease=released, nodes=nodes, last_node=last), POLICY, s(1)
        )
        assert isinstance(d.action, BeginHandover)
        assert d.action.handover.reason == HandoverReason.POD_GONE
