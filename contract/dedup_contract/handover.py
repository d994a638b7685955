"""How a handover is recorded and told: the words the operator writes and dedupctl reads.

A handover moves a partition from one worker pod to its successor (the operator's
`failover` module decides each step). The operator records it in the pipeline's status
(`status.partitions[].handover`, `lastHandover`: its reason, its steps in seconds after
the decision, how the old pod was released and why) and tells it in Events; dedupctl
reads both back. So the step names, the reasons, the release kinds, the Events' reasons
and the wording of a blocked out-of-service taint live here, once.

Pure: no API calls, no clock reads.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# The steps of a handover, in order (after node loss; on a healthy node the old pod is
# deleted before the Lease is fenced, and the recorded steps keep these names)
FENCED: Final = "fenced"
RELEASED: Final = "released"
DETACHED: Final = "detached"
STARTED: Final = "started"
READY: Final = "ready"
STEPS: Final = (FENCED, RELEASED, DETACHED, STARTED, READY)


class Release(StrEnum):
    """How a handover's old pod was (or is being) released (the operator's `failover`
    module says when each applies)."""

    GRACEFUL = "Graceful"
    OUT_OF_SERVICE_TAINT = "OutOfServiceTaint"
    TAINT_BLOCKED = "TaintBlocked"
    WAIT_FOR_DETACH = "WaitForDetach"
    EXTERNAL = "External"


class HandoverReason(StrEnum):
    NODE_LOST = "NodeLost"
    POD_FAILED = "PodFailed"
    POD_GONE = "PodGone"
    # Planned: the worker's pod went away (evicted by `kubectl drain`, or deleted) while
    # its node was cordoned; the worker stopped cleanly and released its Lease.
    NODE_DRAINED = "NodeDrained"
    SPEC_CHANGED = "SpecChanged"
    # Planned: every worker of an OwnershipOff pipeline is stopped and fenced, then all
    # start under ownership (`dedup_operator.ownership_generation`: no replacement starts
    # before every partition's old worker is gone).
    OWNERSHIP_SWITCH = "OwnershipSwitch"

    @property
    def planned(self) -> bool:
        """Asked for (a spec change rolled, a node drained), not a fault: not counted as
        a failover, told by Normal Events."""
        return self in PLANNED_EVENTS


# How a handover is told in Events: (type, reason when it begins, when it completes).
FAILOVER_EVENTS: Final = ("Warning", "FailoverStarted", "FailoverCompleted")
PLANNED_EVENTS: Final = {
    HandoverReason.SPEC_CHANGED: ("Normal", "RollStarted", "RollCompleted"),
    HandoverReason.NODE_DRAINED: ("Normal", "DrainStarted", "DrainCompleted"),
    HandoverReason.OWNERSHIP_SWITCH: ("Normal", "WorkerSwitchStarted", "WorkerSwitchCompleted"),
}


def handover_events(reason: HandoverReason | str | None) -> tuple[str, str, str]:
    """The Events of a handover of `reason` (a failover's when it is not a planned one)."""
    for planned, told in PLANNED_EVENTS.items():
        if reason == planned:
            return told
    return FAILOVER_EVENTS


FORCE_DETACH = "the attach/detach controller's force-detach (6 min)"
EVICTS = "it would evict "


def taint_blocked_why(node: str, who: str) -> str:
    """The release reason of `Release.TAINT_BLOCKED` (`who`: why the taint is blocked)."""
    return (
        f"not tainting node {node} out-of-service: {who}; "
        f"pod force-deleted, waiting for {FORCE_DETACH}"
    )


def taint_blocked_by(release_why: str | None) -> tuple[str, ...] | None:
    """The pods ("namespace/name") a `TaintBlocked` release reason names as blocking the
    taint (`taint_blocked_why`); None when it names none (its pods could not be listed)."""
    head, found, rest = (release_why or "").partition(EVICTS)
    if not found or not head.startswith("not tainting node "):
        return None
    pods = rest.split(";", 1)[0]
    return tuple(p.strip() for p in pods.split(",") if p.strip())
