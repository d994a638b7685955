"""The pipeline's status from what one reconcile pass saw and decided (pure): the one
module that builds it. `partition_statuses` gives the plan (`plan.py`) each partition's
entry; `pipeline_status` composes the status the report writes at the end of the pass
(`reconcile.py`), with the workers' counters (`kept_counters` between scrapes).

Conditions: `Ready` (every partition's worker Running and Ready), `Progressing`
(partitions starting or rolling), `Degraded` (a partition cannot run, a volume will not
detach, the spec or the input topic is wrong), `FailingOver` (a handover in progress),
`TopicReady` (the input topic exists with spec.partitions partitions). A condition's
lastTransitionTime changes only when its status does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from dedup_contract.ownership_status import STATUS_KEY as OWNERSHIP_KEY
from dedup_contract.release import VERSION
from dedup_contract.store_format import STORE_TOO_NEW
from dedup_contract.timefmt import format_time
from dedup_operator import ownership_generation as ownership_mod
from dedup_operator.actions import PassAction, RememberObjectsEnsured
from dedup_operator.desired import partition as desired_partition
from dedup_operator.failover import CompleteHandover, Decision, PodView, Steady
from dedup_operator.status_records import (
    Condition,
    PartitionStatus,
    ScrapedCounters,
    WorkerCounters,
)

if TYPE_CHECKING:  # read here, never built: the observation imports this module
    from dedup_operator.observe import PipelineObservation


class PlannedPass(Protocol):
    """What the status reads of a pass's plan (`plan.Plan`, which imports this module)."""

    @property
    def partitions(self) -> Mapping[int, PartitionStatus]: ...
    @property
    def failovers(self) -> int: ...
    @property
    def ownership(self) -> Mapping[str, Any] | None: ...
    @property
    def actions(self) -> tuple[PassAction, ...]: ...
    def decisions(self) -> dict[int, Decision]: ...


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    current: Sequence[Condition],
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    out = []
    for c in current:
        status = "True" if c.status else "False"
        old = before.get(c.type)
        since = (
            old.get("lastTransitionTime")
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else format_time(now)
        )
        out.append(
            {
                "type": c.type,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return out


def phase_of(
    partitions: Sequence[PartitionStatus], degraded: bool, previous_phase: str | None
) -> str:
    """Running when every partition is ready; Degraded when something is wrong or a
    pipeline that ran has a partition down; Pending while it starts for the first time."""
    if degraded:
        return "Degraded"
    if partitions and all(p.ready for p in partitions):
        return "Running"
    return "Degraded" if previous_phase in ("Running", "Degraded") else "Pending"


def _handover_summary(p: PartitionStatus) -> str:
    h = p.handover or {}
    why = h.get("releaseWhy")
    return f"p{p.partition} ({h.get('reason')})" + (f": {why}" if why else "")


def summary_conditions(
    partitions: Sequence[PartitionStatus],
    expected: int,
    topic: Condition,
    degraded_reasons: Sequence[str],
    spec_current: bool,
) -> list[Condition]:
    ready = [p for p in partitions if p.ready]
    failing_over = [p for p in partitions if p.handover]
    not_running = expected - len(ready)
    conditions = [
        Condition(
            "Ready",
            not_running == 0 and topic.status,
            "AllPartitionsReady" if not_running == 0 else "PartitionsNotReady",
            f"{len(ready)}/{expected} partitions ready",
        ),
        Condition(
            "Progressing",
            not_running > 0 or not spec_current,
            "Rolling" if not spec_current else ("Starting" if not_running else "Stable"),
            ""
            if not_running == 0 and spec_current
            else ", ".join(f"p{p.partition}: {p.waiting_for}" for p in partitions if p.waiting_for)[
                :1000
            ],
        ),
        Condition(
            "Degraded",
            bool(degraded_reasons),
            "Degraded" if degraded_reasons else "AsExpected",
            "; ".join(degraded_reasons)[:4000],
        ),
        Condition(
            "FailingOver",
            bool(failing_over),
            "HandoverInProgress" if failing_over else "NoHandover",
            "; ".join(_handover_summary(p) for p in failing_over)[:4000],
        ),
        topic,
    ]
    return conditions


def kept_counters(
    scraped: ScrapedCounters | None, ready: set[int], now: float, every_s: float
) -> dict[int, WorkerCounters] | None:
    """The workers' counters a pass writes into the status without scraping them: those
    scraped less than `every_s` ago, of the partitions still Ready; None when a scrape
    is due (none yet, or `every_s` passed). So a pipeline's status changes for its
    counters at most once per `every_s`, and its workers are scraped as rarely."""
    if scraped is None or now - scraped[0] >= every_s:
        return None
    return {p: c for p, c in scraped[1].items() if p in ready}


# ------------------------------------------------- the status a pass writes
def partition_statuses(
    obs: PipelineObservation, decisions: Mapping[int, Decision], now: datetime
) -> dict[int, PartitionStatus]:
    parts = {
        p: partition_status(p, list(obs.pods.get(p, ())), d, obs.previous_partition(p))
        for p, d in decisions.items()
    }
    for p, d in decisions.items():
        if isinstance(d.action, CompleteHandover):  # recorded with the handover's end
            parts[p] = replace(
                parts[p],
                last_handover=_completed(d.action.handover.to_status(), d.action.pod),
                last_failover=format_time(now),
            )
    return parts


def _completed(handover: Mapping[str, Any], pod: str) -> dict[str, Any]:
    """status.partitions[].lastHandover as the record persisted before acting: `told`
    False until the status written after the pass's Events says True (`pipeline_status`).
    A pass that stopped in between (killed, deposed, a conflict) leaves it False, and the
    next pass tells the completion then: the Event is posted at least once."""
    return {**handover, "toPod": pod, "told": False}


def handover_status(decision: Decision) -> dict[str, Any] | None:
    return decision.handover.to_status() if decision.handover else None


def store_too_new_condition(pods: Mapping[int, Sequence[PodView]]) -> Condition | None:
    """StoreTooNew while a partition's worker refused its store as written by a newer
    release (a rollback past a finalized upgrade): the workers cannot run until that
    release (or a later one) runs them. Absent otherwise."""
    refused = [
        f"p{p}: {view.store_too_new}"
        for p, views in sorted(pods.items())
        for view in views
        if view.store_too_new and not view.deleting
    ]
    if not refused:
        return None
    return Condition(STORE_TOO_NEW, True, STORE_TOO_NEW, "; ".join(refused)[:4000])


def partition_status(
    p: int, pods: list[PodView], decision: Decision, previous: Mapping[str, Any]
) -> PartitionStatus:
    current = max((v for v in pods if not v.deleting), key=lambda v: v.epoch, default=None)
    if current is None:
        current = max(pods, key=lambda v: v.epoch, default=None)
    action = decision.action
    waiting = None
    if isinstance(action, Steady):
        waiting = action.waiting_for
    if decision.degraded:
        waiting = f"DEGRADED: {decision.degraded}"
    ready = bool(
        current is not None
        and current.ready
        and current.phase == "Running"
        and not current.deleting
        and decision.handover is None
    )
    return PartitionStatus(
        partition=p,
        pod=current.name if current else None,
        node=current.node if current else None,
        epoch=current.epoch if current else 0,
        phase=("FailingOver" if decision.handover else (current.phase if current else "Missing")),
        ready=ready,
        waiting_for=waiting,
        handover=handover_status(decision),
        last_handover=previous.get("lastHandover"),
        last_failover=previous.get("lastFailover"),
    )


def pipeline_status(
    obs: PipelineObservation,
    plan: PlannedPass,
    counters: Mapping[int, WorkerCounters],
    tainted: Sequence[str],
    last_audit: Mapping[str, Any] | None,
    audit_condition: Condition | None,
    now: datetime,
) -> dict[str, Any]:
    """The status this pass writes: the plan's partitions with their workers' counters,
    the summary conditions and phase, and the audit's last result."""
    entries = _status_entries(obs, plan, counters)
    degraded = [d.degraded for d in plan.decisions().values() if d.degraded]
    topic = obs.topic_ready
    if not topic.ok and topic.reason != "KafkaUnreachable":
        degraded.append(topic.message)
    spec_current = all(
        v.spec_hash == desired_partition.template_hash(obs.spec, p)
        for p in range(obs.spec.partitions)
        for v in obs.pods.get(p, ())
        if not v.deleting
    )
    topic_condition = Condition("TopicReady", topic.ok, topic.reason, topic.message)
    too_new = store_too_new_condition(obs.pods)
    if too_new is not None:
        degraded.append(too_new.message)
    conditions = summary_conditions(
        entries, obs.spec.partitions, topic_condition, degraded, spec_current
    )
    if obs.ownership is not None and obs.ownership.condition is not None:
        conditions.append(obs.ownership.condition)  # ReshardPending, OwnershipOff
    if plan.ownership is not None and plan.ownership.get("enabled") is not False:
        # recorded in this pass: no longer off
        conditions = [c for c in conditions if c.type != ownership_mod.OWNERSHIP_OFF]
    workers_ready = all(e.ready and not e.handover for e in entries) and spec_current
    switching = ownership_mod.switching_condition(obs.ownership, workers_ready)
    if switching is not None:
        conditions.append(switching)
    if audit_condition is not None:
        conditions.append(audit_condition)
    if too_new is not None:
        conditions.append(too_new)
    status: dict[str, Any] = {
        "phase": phase_of(entries, bool(degraded), obs.previous.get("phase")),
        "observedGeneration": obs.generation,
        "operatorVersion": VERSION,
        "readyPartitions": sum(1 for e in entries if e.ready),
        "duplicatesDropped": sum(c.duplicates for c in counters.values()),
        "recordsIn": sum(c.records_in for c in counters.values()),
        "recordsOut": sum(c.records_out for c in counters.values()),
        "consumerLag": sum(c.lag for c in counters.values()),
        "failovers": plan.failovers,
        "taintedNodes": list(tainted),
        "conditions": merge_conditions(
            obs.previous.get("conditions") or [], conditions, obs.generation, now
        ),
        "partitions": [e.to_status() for e in entries],
    }
    applied = _objects_applied_status(obs, plan)
    if applied:
        status["objectsApplied"] = applied
    if plan.ownership is not None:
        status[OWNERSHIP_KEY] = dict(plan.ownership)
    if last_audit:
        status["lastReconciliation"] = dict(last_audit)
    return status


def _objects_applied_status(obs: PipelineObservation, plan: PlannedPass) -> str | None:
    """status.objectsApplied: the digest this pass wrote its objects with, else the one
    this process did, else as recorded."""
    written = (a.applied for a in plan.actions if isinstance(a, RememberObjectsEnsured))
    return (
        next((d for d in written if d), None)
        or obs.recalled.applied
        or obs.previous.get("objectsApplied")
    )


def _status_entries(
    obs: PipelineObservation, plan: PlannedPass, counters: Mapping[int, WorkerCounters]
) -> list[PartitionStatus]:
    """The plan's partitions with their workers' counters, every completion told (this
    pass has told them: plan.steps)."""
    parts = dict(plan.partitions)
    for p, c in counters.items():
        parts[p] = replace(parts[p], lag=c.lag, duplicates=c.duplicates)
    for p, entry in parts.items():
        if entry.last_handover and entry.last_handover.get("told") is False:
            parts[p] = replace(entry, last_handover={**entry.last_handover, "told": True})
    return [parts[p] for p in range(obs.spec.partitions)]


def invalid_spec_status(
    previous: Mapping[str, Any], generation: int, message: str, now: datetime
) -> dict[str, Any]:
    """The status of a pipeline whose spec does not parse: Failed, Ready False and
    Degraded True with the parser's message (written whatever the status was)."""
    conditions = [
        Condition("Ready", False, "InvalidSpec", message),
        Condition("Degraded", True, "InvalidSpec", message),
    ]
    return {
        "phase": "Failed",
        "observedGeneration": generation,
        "operatorVersion": VERSION,
        "conditions": merge_conditions(
            previous.get("conditions") or [], conditions, generation, now
        ),
    }
