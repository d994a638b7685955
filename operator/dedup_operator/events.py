"""Every Event a reconcile pass posts, and its log lines, composed from its decisions (pure).

The one place an Event's type, reason and message are written: the decide step
(`plan.py`) calls these and puts the result into the plan's actions; the executor posts
what an action carries and composes nothing. The reasons and message texts are what
people, alerts and the integration tests read: change them here or nowhere.

A handover's begin and completion Events are named by `handover.handover_events` (a
failover's, or a planned roll's, drain's or switch's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dedup_contract.handover import Release, handover_events
from dedup_operator import audit_status
from dedup_operator.failover import (
    BeginHandover,
    CancelHandover,
    CompleteHandover,
    Decision,
)
from dedup_operator.status_records import Condition
from dedup_operator.topics import OwnedTopicSettings, TopicCheck

Event = tuple[str, str, str]  # (type "Normal"|"Warning", reason, message)

RELEASE_EVENTS = {
    Release.GRACEFUL: ("Normal", "ReleasedGracefully"),
    Release.OUT_OF_SERVICE_TAINT: ("Normal", "ReleaseByOutOfServiceTaint"),
    Release.TAINT_BLOCKED: ("Warning", "OutOfServiceTaintBlocked"),
    Release.WAIT_FOR_DETACH: ("Normal", "WaitingForDetach"),
    Release.EXTERNAL: ("Normal", "WaitingForOutOfServiceTaint"),
}


# ------------------------------------------------------------------ partitions
def handover_completed(p: int, last: Mapping[str, Any]) -> Event:
    """A handover's completion, from its record (status.partitions[].lastHandover)."""
    steps = last.get("steps") or {}
    _, _, completed = handover_events(last.get("reason"))
    return (
        "Normal",
        completed,
        f"partition {p}: {last.get('toPod')} is Ready after "
        f"{float(steps.get('ready', 0.0)):.1f}s "
        f"({', '.join(f'{k} {float(v):.1f}s' for k, v in steps.items())})",
    )


def partition_events(p: int, d: Decision, previous: Mapping[str, Any]) -> tuple[Event, ...]:
    """The Events a decision is told by, whatever its action's outcome: a handover
    begun, completed or cancelled, newly Degraded, or released a new way; and a
    completion an earlier pass recorded but did not get to tell."""
    events: list[Event] = []
    action = d.action
    untold = previous.get("lastHandover") or {}
    if untold.get("told") is False and not isinstance(action, CompleteHandover):
        events.append(handover_completed(p, untold))
    if isinstance(action, BeginHandover):
        h = action.handover
        type_, started, _ = handover_events(h.reason)
        events.append(
            (
                type_,
                started,
                f"partition {p}: {h.reason.value}: moving from {h.from_pod or '-'} on "
                f"{h.from_node or '-'} (epoch {h.from_epoch})",
            )
        )
    elif isinstance(action, CompleteHandover):
        done = {**action.handover.to_status(), "toPod": action.pod}
        events.append(handover_completed(p, done))
    elif isinstance(action, CancelHandover):
        events.append(("Normal", "FailoverCancelled", f"partition {p}: {action.why}"))
    if d.degraded and not (previous.get("waitingFor") or "").startswith("DEGRADED"):
        events.append(("Warning", d.degraded_reason or "Degraded", d.degraded))
    h_now = d.handover
    h_was = previous.get("handover") or {}
    if (
        h_now is not None
        and h_now.release is not None
        and (h_was.get("release"), h_was.get("releaseWhy"))
        != (h_now.release.value, h_now.release_why)
    ):
        type_, reason = RELEASE_EVENTS[h_now.release]
        events.append((type_, reason, f"partition {p}: {h_now.release_why}"))
    return tuple(events)


def worker_created(p: int, pod: str, epoch: int, avoid_node: str | None) -> Event:
    away = f", away from {avoid_node}" if avoid_node else ""
    return ("Normal", "WorkerCreated", f"partition {p}: created {pod} (epoch {epoch}{away})")


def workers_deleted(p: int, pods: Sequence[str], force: bool, why: str) -> Event:
    return (
        "Normal",
        "WorkerDeleted",
        f"partition {p}: deleted {', '.join(pods)}{' (force)' if force else ''}: {why}",
    )


def lease_fenced(p: int, lease: str, holder: str) -> Event:
    return (
        "Normal",
        "WorkerFenced",
        f"partition {p}: Lease {lease} of {holder} not renewed for its "
        "duration (on the operator's clock): holder cleared",
    )


def volume_created(p: int, claim: str) -> Event:
    return ("Normal", "VolumeCreated", f"partition {p}: created PVC {claim}")


def volume_resized(claim: str, asked: str, size: str) -> Event:
    return ("Normal", "VolumeResized", f"{claim}: {asked} -> {size}")


# ----------------------------------------------------------------------- nodes
def node_tainted(p: int, node: str, release_why: str | None) -> Event:
    """This pipeline tainted a lost node; the handover's release reason says which
    signal made it safe."""
    why = (release_why or "").split(": ", 1)[-1]
    return (
        "Warning",
        "NodeOutOfService",
        f"partition {p}: tainted lost node {node} out-of-service to "
        f"release its volume ({why or 'its dedup workers are fenced'})",
    )


def taint_joined(node: str) -> Event:
    return (
        "Normal",
        "NodeOutOfService",
        f"relying on the out-of-service taint on lost node {node} too",
    )


def taint_lifted(node: str, pipeline_deleted: bool = False) -> Event:
    deleted = " (pipeline deleted)" if pipeline_deleted else ""
    return ("Normal", "NodeBackInService", f"removed the out-of-service taint from {node}{deleted}")


# -------------------------------------------------------------------- pipeline
def invalid_spec(message: str) -> Event:
    return ("Warning", "InvalidSpec", message)


def ownership_condition(condition: Condition) -> Event:
    """ReshardPending or OwnershipOff appearing (or its reason changing)."""
    return ("Warning", condition.type, condition.message)


def switch_ignored(annotation: str) -> Event:
    return (
        "Normal",
        "OwnershipSwitchIgnored",
        f"annotation {annotation} ignored: the pipeline already runs under ownership",
    )


def switch_started(partitions: int, owned_topic: str) -> Event:
    return (
        "Normal",
        "OwnershipSwitchStarted",
        f"switching to ownership: all {partitions} workers stop and are fenced, "
        f"then start under ownership with the internal topic {owned_topic}; "
        "the output pauses meanwhile (one way)",
    )


def switch_workers_stopped(partitions: int) -> Event:
    return (
        "Normal",
        "OwnershipSwitchWorkersStopped",
        f"all {partitions} workers stopped and fenced: starting them under ownership",
    )


def switch_completed(partitions: int) -> Event:
    return (
        "Normal",
        "OwnershipSwitchCompleted",
        f"switched to ownership: all {partitions} workers are Ready under ownership",
    )


def pipeline_ready(partitions: int) -> Event:
    return ("Normal", "PipelineReady", f"all {partitions} partitions are running")


def topic_failing(topic: TopicCheck) -> Event:
    """TopicReady failing: no promise can be kept until it is fixed (posted as an error)."""
    return ("Warning", topic.reason, topic.message)


def owned_topic_created(wanted: OwnedTopicSettings) -> Event:
    configs = ", ".join(f"{k}={v}" for k, v in wanted.config.items())
    return (
        "Normal",
        "OwnedTopicCreated",
        f"created internal topic {wanted.name}: {wanted.partitions} partitions (one per "
        f"worker), replication factor {wanted.replication}, {configs}",
    )


def owned_topic_deleted(topic: str) -> Event:
    return ("Normal", "OwnedTopicDeleted", f"deleted internal topic {topic} (pipeline deleted)")


def reconciliation_unreadable(why: str) -> Event:
    return ("Warning", "ReconciliationUnreadable", why)


# ------------------------------------------------------------------- log lines
def audit_unreadable_line(namespace: str, name: str, why: str) -> str:
    return f"cannot read the audit result of {namespace}/{name}: {why}"


def leases_held_line(namespace: str, name: str, held: Sequence[str]) -> str:
    return (
        f"{namespace}/{name} deleted: waiting for the Leases {', '.join(sorted(held))} to run "
        "out before deleting its internal topic"
    )


def spec_unreadable_line(namespace: str, name: str, error: str) -> str:
    """A deleted pipeline whose spec no longer parses keeps its internal topic."""
    return f"{namespace}/{name}: cannot delete its internal topic: {error}"


def topic_not_deleted(namespace: str, name: str, topic: str) -> str:
    """The start of the line when Kafka refuses to delete the internal topic."""
    return f"{namespace}/{name}: cannot delete internal topic {topic}"


# ----------------------------------------------------------------------- audit
def audit_result(last: Mapping[str, Any]) -> Event:
    """A new audit result (status.lastReconciliation): passed or failed, with its findings."""
    if last.get("passed"):
        return ("Normal", "ReconciliationPassed", audit_status.message(last))
    return ("Warning", "ReconciliationFailed", audit_status.message(last))


# ------------------------------------------------------------------- deletion
def volumes_retained(kept: Sequence[str]) -> Event:
    """A deleted pipeline's volume claims kept (storage.retainOnDelete)."""
    return ("Normal", "VolumesRetained", f"kept {', '.join(sorted(kept))} (storage.retainOnDelete)")
