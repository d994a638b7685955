"""What to do next for one partition, decided from what the cluster holds.

Pure: no API calls, no clock reads. The operator's reconcile loop observes a partition
(its pods, their nodes, with every pod bound to a lost node it may taint, its Lease, the
VolumeAttachments of its volume and the handover in progress recorded in the pipeline's
status), calls `partition_action`, persists the returned handover record *before*
acting, and then carries out the one action. Calling it again with the same observation
returns the same answer, so an operator killed at any point resumes from what the
cluster holds.

A *handover* moves a partition from one worker pod to its successor (epoch + 1), started
by node loss, a failed or vanished pod, or a spec change. After node loss it goes:
**fenced** (the old Lease run out on the operator's own monotonic clock,
`dedup_contract.lease_clock`, then its holder cleared by a compare-and-set: `FenceLease`),
**released** (the old pod gone; how, as the handover's `release`: `Graceful`,
`OutOfServiceTaint`, `TaintBlocked`, `WaitForDetach` or `External`), **detached** (no
VolumeAttachment of its volume left: ReadWriteOnce), **started** (the next epoch's pod,
away from the lost node; Degraded after `schedule_timeout` unscheduled) and **ready**. On
a healthy node (a failed pod, a spec change) the first two swap: the pod is deleted
gracefully, then its Lease must be free or have run out. Node loss is the node's
heartbeat Lease unchanged for `node_lost_after` (`NodeView.heartbeat_age`; the Ready
condition only where that Lease cannot be read); when every node is lost at once (full
disruption) no node-loss handover starts and no node is tainted. Every step, rule and
reason: docs/design.md, "A handover, step by step".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from dedup_contract import lease_clock
from dedup_contract.handover import (
    DETACHED,
    EVICTS,
    FENCED,
    FORCE_DETACH,
    READY,
    RELEASED,
    STARTED,
    HandoverReason,
    Release,
    taint_blocked_why,
)
from dedup_contract.timefmt import format_time_exact, parse_rfc3339

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
# Set by the cloud node lifecycle controller on a NotReady node whose instance the cloud
# provider reports shut down (removed when the instance runs again).
SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"


class ReleaseVolume(StrEnum):
    """How a lost node's volume is released (`spec.failover.releaseVolume`)."""

    OUT_OF_SERVICE_TAINT = "OutOfServiceTaint"
    WAIT_FOR_DETACH = "WaitForDetach"
    EXTERNAL = "External"


@dataclass(frozen=True)
class FailoverPolicy:
    node_lost_after: timedelta = timedelta(seconds=20)
    release_volume: ReleaseVolume = ReleaseVolume.OUT_OF_SERVICE_TAINT
    # A volume not detached this long after the old pod is gone makes the pipeline
    # Degraded (the operator keeps waiting: it never attaches a volume twice).
    detach_timeout: timedelta = timedelta(minutes=10)
    # A replacement the scheduler cannot place this long makes the pipeline Degraded.
    schedule_timeout: timedelta = timedelta(minutes=2)


# ----------------------------------------------------------------------- observation
@dataclass(frozen=True)
class LeaseView:
    """A Lease as the operator sees it: what it says, and for how long the operator has
    seen it unchanged on its own monotonic clock (`dedup_contract.lease_clock.LeaseClock`;
    zero at first sight, e.g. after an operator restart)."""

    holder: str | None
    epoch: int  # spec.leaseTransitions
    duration: timedelta
    unchanged_for: timedelta = timedelta(0)
    # nobody holds it: never renewed, or released by its holder (`lease_clock.is_free`)
    free: bool = False
    resource_version: str | None = None  # as seen: `FenceLease` writes on it

    def expired(self) -> bool:
        """Free, or seen unchanged for a full duration (`lease_clock.expired`)."""
        return lease_clock.expired(
            self.free or not self.holder,
            self.unchanged_for.total_seconds(),
            self.duration.total_seconds(),
        )

    def remaining(self) -> timedelta:
        """How long until it has run out, if nothing changes (zero once it has)."""
        if self.expired():
            return timedelta(0)
        return max(self.duration - self.unchanged_for, timedelta(0))


@dataclass(frozen=True)
class NodePod:
    """A pod bound to a node, as far as the out-of-service taint on that node concerns it."""

    namespace: str
    name: str
    daemon_set: bool = False  # owned by a DaemonSet (its controller recreates it anyway)
    mirror: bool = False  # a static pod's mirror (the kubelet owns it)
    tolerates_out_of_service: bool = False  # for ever (no tolerationSeconds)
    finished: bool = False  # phase Succeeded or Failed: nothing of it runs
    worker: bool = False  # a dedup worker (any pipeline's), with
    worker_lease: LeaseView | None = None  # its partition's Lease (None: there is none)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def evicted_by_taint(self) -> bool:
        return not (
            self.daemon_set or self.mirror or self.tolerates_out_of_service or self.finished
        )

    def fenced(self) -> bool:
        """A dedup worker that can no longer commit: its Lease is gone, held by someone
        else, or run out."""
        lease = self.worker_lease
        return self.worker and (lease is None or lease.holder != self.name or lease.expired())


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: str  # the Ready condition's status: "True", "False" or "Unknown"
    ready_since: datetime | None  # its lastTransitionTime
    out_of_service: bool = False
    # The cloud provider's shutdown taint (`SHUTDOWN_TAINT`) is on the node: its instance
    # is stopped, nothing of it runs.
    shut_down: bool = False
    # Cordoned (spec.unschedulable): being drained, or about to be.
    cordoned: bool = False
    # The pipelines ("namespace/name") relying on an out-of-service taint the operator
    # added (the node's annotation); empty: no taint, or someone else's.
    tainted_by: tuple[str, ...] = ()
    # Every pod bound to the node; None where the shell did not (or could not) list them:
    # it does for the lost node of a handover that may taint it.
    pods: tuple[NodePod, ...] | None = None
    # How long the operator has seen the node's Lease (kube-node-lease) unchanged, on its
    # own monotonic clock; None: no node Lease read (the Ready condition decides). And
    # whether that is `node_lost_after` or more (the shell compares, with the policy).
    heartbeat_age: timedelta | None = None
    heartbeat_stale: bool = False
    # Without a node Lease: how long the operator has seen the Ready condition unchanged
    # (its status and lastTransitionTime), on its own clock; None: not observed (then
    # `ready_since`, the controller's wall clock, is all there is).
    condition_age: timedelta | None = None

    def lost_for(self, now: datetime) -> timedelta:
        """How long the node has not heartbeated: its Lease seen unchanged that long; or,
        without a node Lease, how long it has not been Ready (zero while it is), as seen
        on the operator's clock where it could observe it."""
        if self.heartbeat_age is not None:
            return self.heartbeat_age
        if self.ready == "True":
            return timedelta(0)
        if self.condition_age is not None:
            return self.condition_age
        if self.ready_since is None:
            return timedelta(0)
        return max(now - self.ready_since, timedelta(0))

    @property
    def up(self) -> bool:
        """Ready and heartbeating: a node that healed (never tainted, never given up)."""
        return self.ready == "True" and not self.heartbeat_stale


def full_disruption(nodes: Mapping[str, NodeView], lost_after: timedelta, now: datetime) -> bool:
    """Every node of the cluster lost at once (at least one node known): the control
    plane or the operator's view of it failed, not the nodes; no node-loss handover."""
    return bool(nodes) and all(n.lost_for(now) >= lost_after for n in nodes.values())


@dataclass(frozen=True)
class PodView:
    name: str
    epoch: int
    node: str | None  # None while unscheduled
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    ready: bool = False
    deleting: bool = False
    spec_hash: str | None = None
    # The scheduler's reason while it cannot place the pod (PodScheduled=False,
    # Unschedulable: its message) and since when (the condition's lastTransitionTime).
    unschedulable: str | None = None
    unschedulable_since: datetime | None = None
    ip: str | None = None  # where its /metrics are scraped
    uid: str | None = None  # a delete is conditional on it (never a same-named successor)
    # The worker's refusal of a store a newer release wrote, from its container's last
    # termination (observed.store_too_new): the pipeline's StoreTooNew condition.
    store_too_new: str | None = None


@dataclass(frozen=True)
class AttachmentView:
    """A VolumeAttachment of the partition's volume."""

    name: str
    node: str
    attached: bool


@dataclass(frozen=True)
class Handover:
    """A handover in progress, persisted in the partition's status entry so that a
    restarted operator carries on where its predecessor stopped."""

    reason: HandoverReason
    started: datetime
    from_epoch: int
    from_pod: str | None = None
    from_node: str | None = None
    # step name -> seconds after `started` at which the step was first seen complete
    steps: Mapping[str, float] = field(default_factory=dict)
    # How the old pod is released (decided again on each pass while it exists) and why.
    release: Release | None = None
    release_why: str | None = None

    def mark(self, step: str, now: datetime) -> Handover:
        if step in self.steps:
            return self
        return replace(
            self, steps={**self.steps, step: round((now - self.started).total_seconds(), 3)}
        )

    def released_by(self, how: Release, why: str) -> Handover:
        return replace(self, release=how, release_why=why)

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "reason": self.reason.value,
            "started": format_time_exact(self.started),
            "fromEpoch": self.from_epoch,
            "fromPod": self.from_pod,
            "fromNode": self.from_node,
            "steps": dict(self.steps),
        }
        if self.release is not None:
            out["release"] = self.release.value
            out["releaseWhy"] = self.release_why
        return out

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> Handover:
        return cls(
            reason=HandoverReason(data["reason"]),
            started=parse_rfc3339(str(data["started"])),
            from_epoch=int(data["fromEpoch"]),
            from_pod=data.get("fromPod"),
            from_node=data.get("fromNode"),
            steps={str(k): float(v) for k, v in (data.get("steps") or {}).items()},
            release=Release(data["release"]) if data.get("release") else None,
            release_why=data.get("releaseWhy"),
        )


@dataclass(frozen=True)
class PartitionObservation:
    partition: int
    pods: Sequence[PodView]  # every pod of this partition, terminating ones included
    nodes: Mapping[str, NodeView]  # the cluster's nodes by name
    lease: LeaseView | None
    attachments: Sequence[AttachmentView]  # VolumeAttachments of this partition's volume
    handover: Handover | None
    desired_hash: str | None = None  # the pod template's hash the spec asks for
    may_roll: bool = False  # every other partition is Ready: a spec change may roll here
    last_node: str | None = None  # the node the status last saw its worker on


# --------------------------------------------------------------------------- actions
@dataclass(frozen=True)
class Steady:
    """Nothing to do; `waiting_for` says what, if anything, resolves by itself."""

    waiting_for: str | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class CreateLease:
    pass


@dataclass(frozen=True)
class CreatePod:
    epoch: int
    avoid_node: str | None = None


@dataclass(frozen=True)
class DeletePods:
    names: tuple[str, ...]
    force: bool  # grace period 0 (only for a pod whose node is gone)
    why: str


@dataclass(frozen=True)
class FenceLease:
    """The old holder's Lease has run out on the operator's clock: clear its holder
    (epoch kept) with a compare-and-set on `resource_version`, the version seen unchanged.
    A 409 means it was renewed meanwhile: the next pass waits again."""

    holder: str
    resource_version: str | None


@dataclass(frozen=True)
class TaintOutOfService:
    node: str


@dataclass(frozen=True)
class BeginHandover:
    """Record the decision (status, Event, metric); the next call carries it out."""

    handover: Handover


@dataclass(frozen=True)
class CompleteHandover:
    """The replacement is Ready: record the handover's step durations, clear it."""

    handover: Handover
    pod: str


@dataclass(frozen=True)
class CancelHandover:
    """The reason for the handover went away before the old worker was fenced."""

    why: str


# One partition's next move as decided here; `plan.py` turns each into the API steps of
# the pass (`actions.PassAction`, what `executor.py` applies): e.g. a `FenceLease` becomes
# a `FenceWorkerLease` carrying its Event.
PartitionAction = (
    Steady | CreateLease | CreatePod | DeletePods | FenceLease | TaintOutOfService
    | BeginHandover | CompleteHandover | CancelHandover
)  # fmt: skip


@dataclass(frozen=True)
class Decision:
    action: PartitionAction
    # The handover record to persist before acting: unchanged, updated with step times,
    # or None (no handover in progress, or `CompleteHandover` clears it).
    handover: Handover | None
    # Set when the partition is stuck in a way a person must look at (the pipeline is
    # then Degraded); the operator keeps acting as `action` says. `degraded_reason` is
    # the Event's reason: VolumeNotDetached, Unschedulable or NoOutOfServiceTaint.
    degraded: str | None = None
    degraded_reason: str | None = None


# -------------------------------------------------------------------------- decision
def partition_action(obs: PartitionObservation, policy: FailoverPolicy, now: datetime) -> Decision:
    """The next thing to do for one partition. See the module docstring."""
    if obs.lease is None:
        return Decision(CreateLease(), obs.handover)
    if obs.handover is not None:
        return _continue_handover(obs, obs.handover, policy, now)

    current = max(obs.pods, key=lambda p: p.epoch, default=None)
    if current is None:
        if obs.lease.epoch == 0 and not obs.lease.holder:
            return Decision(CreatePod(epoch=1), None)  # first start
        last = obs.nodes.get(obs.last_node) if obs.last_node else None
        if last is not None and last.cordoned:  # a drain evicted it: a planned handover
            return _begin(HandoverReason.NODE_DRAINED, None, obs, now)
        return _begin(HandoverReason.POD_GONE, None, obs, now)
    node = obs.nodes.get(current.node) if current.node else None
    if current.node and (node is None or node.lost_for(now) >= policy.node_lost_after):
        if full_disruption(obs.nodes, policy.node_lost_after, now):
            return Decision(Steady(waiting_for=FULL_DISRUPTION), None)
        return _begin(HandoverReason.NODE_LOST, current, obs, now)
    if current.phase == "Failed":
        return _begin(HandoverReason.POD_FAILED, current, obs, now)
    if current.deleting:
        return Decision(Steady(waiting_for=f"pod {current.name} to terminate"), None)
    if (
        obs.desired_hash is not None
        and current.spec_hash != obs.desired_hash
        and obs.may_roll
        and current.ready
    ):
        return _begin(HandoverReason.SPEC_CHANGED, current, obs, now)
    stale = tuple(p.name for p in obs.pods if p.epoch < current.epoch and not p.deleting)
    if stale:
        return Decision(DeletePods(stale, force=False, why="superseded by a newer epoch"), None)
    if node is not None and not node.up:
        lost_at = now + max(policy.node_lost_after - node.lost_for(now), timedelta(0))
        return Decision(Steady(waiting_for=f"node {node.name} to be Ready", until=lost_at), None)
    if current.node is None and current.unschedulable is not None:
        return _unschedulable(obs, current, current.unschedulable_since or now, None, policy, now)
    return Decision(Steady(), None)


def next_epoch(obs: PartitionObservation, handover: Handover) -> int:
    """One above every epoch the partition has seen: in its Lease, its pods, the handover."""
    seen = [handover.from_epoch, *(p.epoch for p in obs.pods)]
    if obs.lease is not None:
        seen.append(obs.lease.epoch)
    return max(seen) + 1


def begin_handover(
    reason: HandoverReason, pod: PodView | None, obs: PartitionObservation, now: datetime
) -> Decision:
    """Begin a handover of `reason` from `pod` (None: the partition has no pod; from its
    Lease's holder and epoch)."""
    return _begin(reason, pod, obs, now)


def _begin(
    reason: HandoverReason, pod: PodView | None, obs: PartitionObservation, now: datetime
) -> Decision:
    lease_epoch = obs.lease.epoch if obs.lease else 0
    handover = Handover(
        reason=reason,
        started=now,
        from_epoch=max(pod.epoch if pod else 0, lease_epoch),
        from_pod=pod.name if pod else (obs.lease.holder if obs.lease else None),
        from_node=pod.node
        if pod
        else (obs.last_node if reason == HandoverReason.NODE_DRAINED else None),
    )
    return Decision(BeginHandover(handover), handover)


def _continue_handover(
    obs: PartitionObservation, h: Handover, policy: FailoverPolicy, now: datetime
) -> Decision:
    successors = [p for p in obs.pods if p.epoch > h.from_epoch]
    if successors:
        new = max(successors, key=lambda p: p.epoch)
        h = h.mark(STARTED, now)
        if new.phase == "Running" and new.ready and not new.deleting:
            return Decision(CompleteHandover(h.mark(READY, now), new.name), None)
        if new.node is None and new.unschedulable is not None:
            created = h.started + timedelta(seconds=h.steps[STARTED])
            return _unschedulable(obs, new, created, h, policy, now)
        return Decision(Steady(waiting_for=f"replacement {new.name} to be Ready"), h)

    # A node that comes back before its worker was fenced keeps its partition.
    back = obs.nodes.get(h.from_node) if h.from_node else None
    if (
        h.reason == HandoverReason.NODE_LOST
        and FENCED not in h.steps
        and back is not None
        and back.up
    ):
        return Decision(CancelHandover(f"node {back.name} is Ready again"), None)

    old = [p for p in obs.pods if p.epoch <= h.from_epoch]
    if h.reason == HandoverReason.NODE_LOST:
        # 1. fenced: never touch the lost node while its worker may still hold the Lease
        # (it may be cut off from us but not from Kafka).
        unfenced = _until_fenced(obs, now)
        if unfenced is not None:
            return Decision(unfenced, h)
        h = h.mark(FENCED, now)
        # 2. released: the old pods are gone.
        if old:
            if back is not None and back.up:
                # Healed after its worker fenced: the normal way, never a taint.
                h = h.released_by(
                    Release.GRACEFUL,
                    f"node {back.name} is Ready again: old pod deleted gracefully, "
                    "the node unmounts the volume",
                )
                return Decision(_graceful(old, h), h)
            if full_disruption(obs.nodes, policy.node_lost_after, now):
                return Decision(Steady(waiting_for=FULL_DISRUPTION), h)
            return _release_lost(obs, old, h, back, policy, now)
        h = h.mark(RELEASED, now)
        if h.release == Release.GRACEFUL:
            # the pod may have run again on the healed node: as on a healthy node
            unfenced = _until_fenced(obs, now)
            if unfenced is not None:
                return Decision(unfenced, h)
    else:
        # On a healthy node the old worker is stopped first (SIGTERM: it finishes its
        # batch and gives up its Lease), then its Lease must be free or run out.
        if old:
            return Decision(_graceful(old, h), h)
        h = h.mark(RELEASED, now)
        unfenced = _until_fenced(obs, now)
        if unfenced is not None:
            return Decision(unfenced, h)
        h = h.mark(FENCED, now)

    # 3. detached: no VolumeAttachment of the volume is left.
    if obs.attachments:
        after_all = _taint_after_all(obs, h, back, policy, now)
        if after_all is not None:
            return after_all
        names = ", ".join(f"{a.name} on {a.node}" for a in obs.attachments)
        waited = now - (h.started + timedelta(seconds=h.steps[RELEASED]))
        degraded = None
        if waited >= policy.detach_timeout:
            degraded = (
                f"partition {obs.partition}: volume still attached ({names}) "
                f"{waited.total_seconds():.0f}s after its pod was removed"
            )
        return Decision(
            Steady(waiting_for=f"volume to detach ({names})"),
            h,
            degraded,
            "VolumeNotDetached" if degraded else None,
        )
    h = h.mark(DETACHED, now)

    # 4. started: the replacement, away from the lost node.
    avoid = h.from_node if h.reason == HandoverReason.NODE_LOST else None
    return Decision(CreatePod(epoch=next_epoch(obs, h), avoid_node=avoid), h.mark(STARTED, now))


def _until_fenced(obs: PartitionObservation, now: datetime) -> PartitionAction | None:
    """What stands before the old worker counts as fenced: its Lease still held (wait),
    or run out but not yet cleared (clear it); None once fenced."""
    waiting = _lease_wait(obs, now)
    return waiting if waiting is not None else _fence_lease(obs)


def _lease_wait(obs: PartitionObservation, now: datetime) -> Steady | None:
    """What to wait for while the partition's Lease may still be held (None: fenced)."""
    lease = obs.lease
    if lease is None or lease.expired():
        return None
    return Steady(
        waiting_for=f"Lease held by {lease.holder} to expire", until=now + lease.remaining()
    )


def _fence_lease(obs: PartitionObservation) -> FenceLease | None:
    """A Lease run out but still naming its holder: clear it (None: free already)."""
    lease = obs.lease
    if lease is None or lease.free or not lease.holder:
        return None
    return FenceLease(lease.holder, lease.resource_version)


def _graceful(old: Sequence[PodView], h: Handover) -> PartitionAction:
    alive = tuple(p.name for p in old if not p.deleting)
    if alive:
        return DeletePods(alive, force=False, why=f"handover ({h.reason.value})")
    return Steady(waiting_for=f"pods {', '.join(p.name for p in old)} to terminate")


FULL_DISRUPTION = (
    "some node to heartbeat again: every node's Lease is stale (full disruption: the "
    "control plane or the operator's view of it, not the nodes), so no node-loss handover"
)


def _release_lost(
    obs: PartitionObservation,
    old: Sequence[PodView],
    h: Handover,
    node: NodeView | None,
    policy: FailoverPolicy,
    now: datetime,
) -> Decision:
    """Release the volume of fenced worker pods on a node that is still lost."""
    names = tuple(p.name for p in old)
    if node is None:  # the Node object is gone: the controller detaches its volumes
        why = f"node {h.from_node} was deleted"
        return Decision(
            DeletePods(names, force=True, why=why), h.released_by(Release.WAIT_FOR_DETACH, why)
        )
    if policy.release_volume == ReleaseVolume.WAIT_FOR_DETACH:
        h = h.released_by(Release.WAIT_FOR_DETACH, f"pod force-deleted; waiting for {FORCE_DETACH}")
        return Decision(DeletePods(names, force=True, why="its node is lost (WaitForDetach)"), h)
    if node.out_of_service:
        # The node is out of service (ours or someone else's taint) and the worker fenced:
        # force-delete the pod now, as pod GC would on its next pass (every 20 s); with
        # the taint on the node the attach/detach controller then detaches at once.
        if h.release not in (Release.OUT_OF_SERVICE_TAINT, Release.EXTERNAL):
            whose = "the operator's" if node.tainted_by else "not the operator's"
            h = h.released_by(
                Release.EXTERNAL
                if policy.release_volume == ReleaseVolume.EXTERNAL
                else Release.OUT_OF_SERVICE_TAINT,
                f"node {node.name} is tainted out-of-service ({whose})",
            )
        return Decision(DeletePods(names, force=True, why="its node is out of service"), h)
    if policy.release_volume == ReleaseVolume.EXTERNAL:
        h = h.released_by(
            Release.EXTERNAL,
            f"waiting for an out-of-service taint on node {node.name} (releaseVolume External: "
            "the operator never taints)",
        )
        waited = now - (h.started + timedelta(seconds=h.steps[FENCED]))
        degraded = None
        if waited >= policy.detach_timeout:
            degraded = (
                f"partition {obs.partition}: node {node.name} lost and not tainted "
                f"out-of-service {waited.total_seconds():.0f}s after its worker was fenced "
                "(releaseVolume External)"
            )
        waiting = Steady(waiting_for=f"an out-of-service taint on node {node.name} (External)")
        return Decision(waiting, h, degraded, "NoOutOfServiceTaint" if degraded else None)
    # OutOfServiceTaint: only a node whose every pod the taint evicts is a fenced worker,
    # or a node shut down whose dedup workers are fenced.
    verdict = taint_verdict(node, now)
    if verdict.blocked is not None:
        h = h.released_by(Release.TAINT_BLOCKED, taint_blocked_why(node.name, verdict.blocked))
        why = f"its node is lost; the out-of-service taint on {node.name} is blocked"
        return Decision(DeletePods(names, force=True, why=why), h)
    if verdict.waiting is not None:
        return Decision(verdict.waiting, h)
    assert verdict.safe is not None
    h = h.released_by(Release.OUT_OF_SERVICE_TAINT, verdict.safe)
    return Decision(TaintOutOfService(node.name), h)


def _taint_after_all(
    obs: PartitionObservation,
    h: Handover,
    node: NodeView | None,
    policy: FailoverPolicy,
    now: datetime,
) -> Decision | None:
    """A handover whose out-of-service taint was blocked, waiting for the attach/detach
    controller's force-detach, on a node that has since been shut down (the cloud's taint
    comes only once the node is NotReady, often after the operator decided): taint it
    after all once its dedup workers are fenced. None: keep waiting for the detach."""
    if (
        h.reason != HandoverReason.NODE_LOST
        or h.release != Release.TAINT_BLOCKED
        or policy.release_volume != ReleaseVolume.OUT_OF_SERVICE_TAINT
        or node is None
        or node.up
        or node.out_of_service
        or not node.shut_down
        or full_disruption(obs.nodes, policy.node_lost_after, now)
    ):
        return None
    verdict = taint_verdict(node, now)
    if verdict.waiting is not None:
        return Decision(verdict.waiting, h)
    if verdict.safe is None:
        return None
    h = h.released_by(Release.OUT_OF_SERVICE_TAINT, verdict.safe)
    return Decision(TaintOutOfService(node.name), h)


@dataclass(frozen=True)
class TaintVerdict:
    """May a lost node be tainted out-of-service now? Exactly one field is set: `safe`,
    the release reason naming the signal that made it safe; `blocked`, why not (the pods
    it would evict, or that they are unknown); `waiting`, for the dedup workers there
    that still hold their Leases."""

    safe: str | None = None
    blocked: str | None = None
    waiting: Steady | None = None


def taint_verdict(node: NodeView, now: datetime) -> TaintVerdict:
    """The out-of-service taint on a lost node (policy OutOfServiceTaint): safe when every
    pod it evicts is a fenced dedup worker, or when the node is shut down (the cloud's
    `SHUTDOWN_TAINT`: nothing runs there, so other workloads do not block it) and its
    dedup workers are fenced. Dedup workers still holding their Leases are waited for
    whatever the signal (the double fence); unknown pods always block."""
    blockers = taint_blockers(node, now)
    if blockers is None:
        return TaintVerdict(blocked=f"its pods could not be listed ({node.name})")
    foreign, holding = blockers
    if foreign and not node.shut_down:
        return TaintVerdict(blocked=f"{EVICTS}{', '.join(foreign)}")
    if holding:
        waiting = Steady(
            waiting_for=(
                f"dedup workers {', '.join(sorted(holding))} on node {node.name} "
                "to be fenced before tainting it"
            ),
            until=min(holding.values()),
        )
        return TaintVerdict(waiting=waiting)
    tainted = f"node {node.name} tainted out-of-service"
    shut = f"node {node.name} is shut down ({SHUTDOWN_TAINT})"
    if foreign:
        return TaintVerdict(
            safe=f"{tainted}: {shut}, so the pods it evicts ({', '.join(foreign)}) no longer "
            "run; its dedup workers are fenced"
        )
    if node.shut_down:
        return TaintVerdict(safe=f"{tainted}: {shut}; it runs only fenced dedup workers")
    return TaintVerdict(safe=f"{tainted}: it runs only fenced dedup workers")


def taint_blockers(
    node: NodeView, now: datetime
) -> tuple[tuple[str, ...], dict[str, datetime]] | None:
    """What stands between a lost node and the out-of-service taint: the pods it would
    evict that are not dedup workers ("namespace/name"; they block it unless the node is
    shut down, `taint_verdict`), and the dedup workers whose Lease has not run out yet
    (with when it will; they always do). None: the node's pods are unknown."""
    if node.pods is None:
        return None
    evicted = [p for p in node.pods if p.evicted_by_taint()]
    foreign = tuple(sorted(p.ref for p in evicted if not p.worker))
    holding: dict[str, datetime] = {}
    for p in evicted:
        if p.worker and not p.fenced():
            assert p.worker_lease is not None
            holding[p.ref] = now + p.worker_lease.remaining()
    return foreign, holding


def _unschedulable(
    obs: PartitionObservation,
    pod: PodView,
    since: datetime,
    h: Handover | None,
    policy: FailoverPolicy,
    now: datetime,
) -> Decision:
    """A pod the scheduler cannot place: wait, Degraded after `schedule_timeout`."""
    waited = now - since
    degraded = None
    if waited >= policy.schedule_timeout:
        degraded = (
            f"partition {obs.partition}: {pod.name} not scheduled after "
            f"{waited.total_seconds():.0f}s: {pod.unschedulable}"
        )
    waiting = Steady(
        waiting_for=f"{pod.name} to be scheduled ({pod.unschedulable})",
        until=None if degraded else since + policy.schedule_timeout,
    )
    return Decision(waiting, h, degraded, "Unschedulable" if degraded else None)


def remove_out_of_service_taint(node: NodeView, volumes_attached_here: int, pipeline: str) -> bool:
    """Pipeline "namespace/name" lifts its mark from an out-of-service taint the operator
    added for it once the node is Ready again and holds none of the pipeline's volumes
    (the taint goes with the last mark). Never a taint someone else set."""
    return (
        node.out_of_service
        and pipeline in node.tainted_by
        and node.up
        and volumes_attached_here == 0
    )


def join_out_of_service_taint(node: NodeView | None, pipeline: str, h: Handover | None) -> bool:
    """A handover off a lost node that another pipeline tainted out-of-service relies on
    that taint too: the pipeline adds its mark, so the taint stays until it is done."""
    return (
        h is not None
        and h.reason == HandoverReason.NODE_LOST
        and node is not None
        and node.name == h.from_node
        and not node.up
        and node.out_of_service
        and bool(node.tainted_by)
        and pipeline not in node.tainted_by
    )
