"""What to do next for one partition, decided from what the cluster holds.

Pure: no API calls, no clock reads. The operator's reconcile loop observes a partition
(its pods, their nodes, its Lease, the VolumeAttachments of its volume and the handover
in progress recorded in the pipeline's status), calls `partition_action`, persists the
returned handover record *before* acting, and then carries out the one action. Calling it
again with the same observation returns the same answer, so an operator killed at any
point resumes from what the cluster holds.

A *handover* moves a partition from one worker pod to its successor (epoch + 1). It is
started by node loss, a failed or vanished pod, or a spec change. After node loss it goes:

1. **fenced**   - the old worker's Lease has run out by its own renewTime + duration, so
                  the old worker (renew deadline < duration) has stopped committing;
2. **released** - the old pod is gone. After node loss: the lost node gets the
                  `node.kubernetes.io/out-of-service` taint (Kubernetes' non-graceful
                  node shutdown) and the operator force-deletes the pod, as pod GC would
                  on its next pass; the attach/detach controller detaches at once), or with
                  `WaitForDetach` the operator force-deletes its own pod and waits for
                  the controller's own force-detach (6 minutes). Otherwise the old pod
                  is deleted gracefully;
3. **detached** - no VolumeAttachment of the partition's volume is left anywhere; the
                  replacement is never created before that (ReadWriteOnce);
4. **started**  - the replacement pod (next epoch, away from the lost node) is created;
5. **ready**    - the replacement is Running and Ready: the handover completes.

On a healthy node (a failed pod, a spec change) steps 1 and 2 swap: the old pod is
deleted gracefully first (the worker finishes its batch and gives up its Lease on
SIGTERM), then its Lease must be free or have run out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
STEPS = ("fenced", "released", "detached", "started", "ready")


class ReleaseVolume(StrEnum):
    """How a lost node's volume is released (`spec.failover.releaseVolume`)."""

    OUT_OF_SERVICE_TAINT = "OutOfServiceTaint"
    WAIT_FOR_DETACH = "WaitForDetach"


class HandoverReason(StrEnum):
    NODE_LOST = "NodeLost"
    POD_FAILED = "PodFailed"
    POD_GONE = "PodGone"
    SPEC_CHANGED = "SpecChanged"


@dataclass(frozen=True)
class FailoverPolicy:
    node_lost_after: timedelta = timedelta(seconds=60)
    release_volume: ReleaseVolume = ReleaseVolume.OUT_OF_SERVICE_TAINT
    # A volume not detached this long after the old pod is gone makes the pipeline
    # Degraded (the operator keeps waiting: it never attaches a volume twice).
    detach_timeout: timedelta = timedelta(minutes=10)


# ----------------------------------------------------------------------- observation
@dataclass(frozen=True)
class NodeView:
    name: str
    ready: str  # the Ready condition's status: "True", "False" or "Unknown"
    ready_since: datetime | None  # its lastTransitionTime
    out_of_service: bool = False

    def lost_for(self, now: datetime) -> timedelta:
        """How long the node has not been Ready (zero while it is)."""
        if self.ready == "True" or self.ready_since is None:
            return timedelta(0)
        return max(now - self.ready_since, timedelta(0))


@dataclass(frozen=True)
class PodView:
    name: str
    epoch: int
    node: str | None  # None while unscheduled
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    ready: bool = False
    deleting: bool = False
    spec_hash: str | None = None


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    epoch: int  # spec.leaseTransitions
    renew_time: datetime | None
    duration: timedelta

    def expires_at(self) -> datetime | None:
        """When others may take it: renewTime + leaseDurationSeconds; None if never held."""
        if not self.holder or self.renew_time is None:
            return None
        return self.renew_time + self.duration

    def expired(self, now: datetime) -> bool:
        expiry = self.expires_at()
        return expiry is None or now >= expiry


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

    def mark(self, step: str, now: datetime) -> Handover:
        if step in self.steps:
            return self
        return replace(
            self, steps={**self.steps, step: round((now - self.started).total_seconds(), 3)}
        )

    def to_status(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value,
            "started": _rfc3339(self.started),
            "fromEpoch": self.from_epoch,
            "fromPod": self.from_pod,
            "fromNode": self.from_node,
            "steps": dict(self.steps),
        }

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> Handover:
        return cls(
            reason=HandoverReason(data["reason"]),
            started=datetime.fromisoformat(str(data["started"]).replace("Z", "+00:00")),
            from_epoch=int(data["fromEpoch"]),
            from_pod=data.get("fromPod"),
            from_node=data.get("fromNode"),
            steps={str(k): float(v) for k, v in (data.get("steps") or {}).items()},
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


Action = (
    Steady | CreateLease | CreatePod | DeletePods | TaintOutOfService | BeginHandover
    | CompleteHandover | CancelHandover
)  # fmt: skip


@dataclass(frozen=True)
class Decision:
    action: Action
    # The handover record to persist before acting: unchanged, updated with step times,
    # or None (no handover in progress, or `CompleteHandover` clears it).
    handover: Handover | None
    # Set when the partition is stuck in a way a person must look at (the pipeline is
    # then Degraded); the operator keeps acting as `action` says.
    degraded: str | None = None


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
        return _begin(HandoverReason.POD_GONE, None, obs, now)
    node = obs.nodes.get(current.node) if current.node else None
    if current.node and (node is None or node.lost_for(now) >= policy.node_lost_after):
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
    if node is not None and node.ready != "True":
        lost_at = (node.ready_since or now) + policy.node_lost_after
        return Decision(Steady(waiting_for=f"node {node.name} to be Ready", until=lost_at), None)
    return Decision(Steady(), None)


def next_epoch(obs: PartitionObservation, handover: Handover) -> int:
    """One above every epoch the partition has seen: in its Lease, its pods, the handover."""
    seen = [handover.from_epoch, *(p.epoch for p in obs.pods)]
    if obs.lease is not None:
        seen.append(obs.lease.epoch)
    return max(seen) + 1


def _begin(
    reason: HandoverReason, pod: PodView | None, obs: PartitionObservation, now: datetime
) -> Decision:
    lease_epoch = obs.lease.epoch if obs.lease else 0
    handover = Handover(
        reason=reason,
        started=now,
        from_epoch=max(pod.epoch if pod else 0, lease_epoch),
        from_pod=pod.name if pod else (obs.lease.holder if obs.lease else None),
        from_node=pod.node if pod else None,
    )
    return Decision(BeginHandover(handover), handover)


def _continue_handover(
    obs: PartitionObservation, h: Handover, policy: FailoverPolicy, now: datetime
) -> Decision:
    successors = [p for p in obs.pods if p.epoch > h.from_epoch]
    if successors:
        new = max(successors, key=lambda p: p.epoch)
        h = h.mark("started", now)
        if new.phase == "Running" and new.ready and not new.deleting:
            return Decision(CompleteHandover(h.mark("ready", now), new.name), None)
        return Decision(Steady(waiting_for=f"replacement {new.name} to be Ready"), h)

    # A node that comes back before its worker was fenced keeps its partition.
    back = obs.nodes.get(h.from_node) if h.from_node else None
    if (
        h.reason == HandoverReason.NODE_LOST
        and "fenced" not in h.steps
        and back is not None
        and back.ready == "True"
    ):
        return Decision(CancelHandover(f"node {back.name} is Ready again"), None)

    old = [p for p in obs.pods if p.epoch <= h.from_epoch]
    if h.reason == HandoverReason.NODE_LOST:
        # 1. fenced: never touch the lost node while its worker may still hold the Lease
        # (it may be cut off from us but not from Kafka).
        waiting = _lease_wait(obs, now)
        if waiting is not None:
            return Decision(waiting, h)
        h = h.mark("fenced", now)
        # 2. released: the old pods are gone.
        if old:
            return Decision(_release(old, h, obs, policy), h)
        h = h.mark("released", now)
    else:
        # On a healthy node the old worker is stopped first (SIGTERM: it finishes its
        # batch and gives up its Lease), then its Lease must be free or run out.
        if old:
            return Decision(_release(old, h, obs, policy), h)
        h = h.mark("released", now)
        waiting = _lease_wait(obs, now)
        if waiting is not None:
            return Decision(waiting, h)
        h = h.mark("fenced", now)

    # 3. detached: no VolumeAttachment of the volume is left.
    if obs.attachments:
        names = ", ".join(f"{a.name} on {a.node}" for a in obs.attachments)
        waited = now - (h.started + timedelta(seconds=h.steps["released"]))
        degraded = None
        if waited >= policy.detach_timeout:
            degraded = (
                f"partition {obs.partition}: volume still attached ({names}) "
                f"{waited.total_seconds():.0f}s after its pod was removed"
            )
        return Decision(Steady(waiting_for=f"volume to detach ({names})"), h, degraded)
    h = h.mark("detached", now)

    # 4. started: the replacement, away from the lost node.
    avoid = h.from_node if h.reason == HandoverReason.NODE_LOST else None
    return Decision(CreatePod(epoch=next_epoch(obs, h), avoid_node=avoid), h.mark("started", now))


def _lease_wait(obs: PartitionObservation, now: datetime) -> Steady | None:
    """What to wait for while the partition's Lease may still be held (None: fenced)."""
    lease = obs.lease
    if lease is None or lease.expired(now):
        return None
    return Steady(waiting_for=f"Lease held by {lease.holder} to expire", until=lease.expires_at())


def _release(
    old: Sequence[PodView], h: Handover, obs: PartitionObservation, policy: FailoverPolicy
) -> Action:
    names = tuple(p.name for p in old)
    if h.reason != HandoverReason.NODE_LOST:
        alive = tuple(p.name for p in old if not p.deleting)
        if alive:
            return DeletePods(alive, force=False, why=f"handover ({h.reason.value})")
        return Steady(waiting_for=f"pods {', '.join(names)} to terminate")
    if policy.release_volume == ReleaseVolume.WAIT_FOR_DETACH:
        return DeletePods(names, force=True, why="its node is lost (WaitForDetach)")
    node = obs.nodes.get(h.from_node) if h.from_node else None
    if node is not None and not node.out_of_service:
        return TaintOutOfService(node.name)
    # The node is out of service (or gone) and the worker fenced: force-delete the pod
    # now, as pod GC would on its next pass (every 20 s); with the taint on the node the
    # attach/detach controller then detaches at once.
    return DeletePods(names, force=True, why="its node is out of service")


def remove_out_of_service_taint(node: NodeView, volumes_attached_here: int) -> bool:
    """A node the operator tainted out-of-service gets the taint removed once it is Ready
    again and holds none of the pipeline's volumes."""
    return node.out_of_service and node.ready == "True" and volumes_attached_here == 0


def _rfc3339(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")
