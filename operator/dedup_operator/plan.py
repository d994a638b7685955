"""What one reconcile pass does, decided from what it observed (pure).

A pass over a pipeline is observe → decide → act → report (`reconcile.py` is the
shell). This module is the decide step and the pure half of the report:

- `plan_pass(observation, now)` decides every partition with
  `failover.partition_action`, and from those decisions: the status record to persist
  *before* acting (the handover records, and the nodes about to be tainted so that a
  restarted operator knows which taints are its own to lift), whether the taint
  finalizer must be set first, the actions to carry out in order, the Events that go
  with them, and which of our out-of-service taints to lift or forget.
- `pipeline_status(...)` composes the status written at the end of the pass.

Nothing here reads the cluster or a clock; `reconcile.py` runs the plan and, where an
action's outcome matters (a taint someone else's got there first), says so back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from dedup_operator import names
from dedup_operator import ownership as ownership_mod
from dedup_operator.desired import partition as desired_partition
from dedup_operator.failover import (
    Action,
    BeginHandover,
    CancelHandover,
    CompleteHandover,
    CreatePod,
    Decision,
    FailoverPolicy,
    Handover,
    LeaseView,
    NodeView,
    PartitionObservation,
    PodView,
    Release,
    Steady,
    TaintOutOfService,
    handover_events,
    join_out_of_service_taint,
    partition_action,
    remove_out_of_service_taint,
)
from dedup_operator.observed import Obj, attachments_of
from dedup_operator.ownership import STATUS_KEY as OWNERSHIP_KEY
from dedup_operator.ownership import OwnershipState, SwitchPhase
from dedup_operator.spec import PipelineSpec
from dedup_operator.status import (
    Condition,
    PartitionStatus,
    merge_conditions,
    phase_of,
    rfc3339,
    summary_conditions,
)
from dedup_operator.topics import TopicCheck

Event = tuple[str, str, str]  # (type "Normal"|"Warning", reason, message)

RELEASE_EVENTS = {
    Release.GRACEFUL: ("Normal", "ReleasedGracefully"),
    Release.OUT_OF_SERVICE_TAINT: ("Normal", "ReleaseByOutOfServiceTaint"),
    Release.TAINT_BLOCKED: ("Warning", "OutOfServiceTaintBlocked"),
    Release.WAIT_FOR_DETACH: ("Normal", "WaitingForDetach"),
    Release.EXTERNAL: ("Normal", "WaitingForOutOfServiceTaint"),
}


def taint_mark(namespace: str, name: str) -> str:
    """How a pipeline marks the out-of-service taints it relies on (node annotation)."""
    return f"{namespace}/{name}"


@dataclass(frozen=True)
class PipelineObservation:
    """What one pass read of a pipeline and the cluster around it."""

    spec: PipelineSpec
    generation: int
    previous: Mapping[str, Any]  # the status as read at the pass's start
    claims: Mapping[str, Obj]  # PVC name -> PVC
    pods: Mapping[int, tuple[PodView, ...]]  # partition -> its worker pods
    leases: Mapping[str, LeaseView]  # Lease name -> view
    nodes: Mapping[str, NodeView]
    attachments: Sequence[Obj]  # VolumeAttachments
    topic: TopicCheck
    # the ownership generation (dedup_operator.ownership.decide); None: as a new pipeline
    ownership: OwnershipState | None = None

    def previous_partition(self, p: int) -> Mapping[str, Any]:
        for entry in self.previous.get("partitions") or []:
            if int(entry["partition"]) == p:
                return entry  # type: ignore[no-any-return]
        return {}

    def volume_name(self, p: int) -> str | None:
        claim = self.claims.get(names.volume_claim(self.spec.name, p)) or {}
        return (claim.get("spec") or {}).get("volumeName")


@dataclass(frozen=True)
class PartitionStep:
    """One partition's part of the plan: its action (None: nothing to carry out, e.g. a
    pod that cannot start before the input topic exists) and the Events that go with the
    decision whatever the action's outcome."""

    partition: int
    decision: Decision
    action: Action | None
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Plan:
    steps: tuple[PartitionStep, ...]
    partitions: Mapping[int, PartitionStatus]
    # persisted before any action, when not None
    record: Mapping[str, Any] | None
    set_finalizer: bool  # the taint finalizer goes on before anything is tainted
    tainted: tuple[str, ...]  # status.taintedNodes once the record is written
    to_taint: frozenset[str]  # lost nodes this pipeline taints
    to_join: frozenset[str]  # lost nodes already tainted by others that we mark too
    lift: tuple[str, ...]  # our taints to remove (the node is back, none of our volumes)
    forget: tuple[str, ...]  # tainted nodes gone or untainted by someone: off our list
    failovers: int  # status.failovers after the completions in this plan
    pod_uids: Mapping[str, str | None]  # each observed pod's uid: deletes are conditional
    # status.ownership after this plan: as recorded, or recorded by this plan's record
    # before it creates the first worker; None: not yet (no worker started) or off
    ownership: Mapping[str, Any] | None = None
    # the pipeline's own Events, told once the record is written (the switch's steps)
    events: tuple[Event, ...] = ()

    def decisions(self) -> dict[int, Decision]:
        return {s.partition: s.decision for s in self.steps}

    def next_pass_in(self, now: datetime) -> float | None:
        """When the next pass is due, in seconds: at once (0) when this one acted -- a
        handover takes one step per pass (fence, release, create), and each step's
        outcome is what the next one decides on -- else when the earliest wait runs out
        (a Lease expiring, a node's nodeLostAfter); None: nothing pending, the regular
        interval."""
        if self.record is not None or any(
            s.action is not None and not isinstance(s.action, Steady) for s in self.steps
        ):
            return 0.0
        waits = [
            (s.action.until - now).total_seconds()
            for s in self.steps
            if isinstance(s.action, Steady) and s.action.until is not None
        ]
        return max(0.0, min(waits)) if waits else None


def plan_pass(obs: PipelineObservation, now: datetime) -> Plan:
    spec = obs.spec
    us = taint_mark(spec.namespace, spec.name)
    policy = spec.failover.policy()
    decisions = _decide_partitions(obs, policy, now)
    ownership_stopped = ownership_mod.all_stopped(decisions)

    parts = {
        p: _partition_status(p, list(obs.pods.get(p, ())), d, obs.previous_partition(p))
        for p, d in decisions.items()
    }
    for p, d in decisions.items():
        if isinstance(d.action, CompleteHandover):  # recorded with the handover's end
            parts[p] = replace(
                parts[p],
                last_handover=_completed(d.action.handover.to_status(), d.action.pod),
                last_failover=rfc3339(now),
            )
    changed = any(
        _handover_status(d) != (obs.previous_partition(p).get("handover") or None)
        for p, d in decisions.items()
    )

    tainted = list(obs.previous.get("taintedNodes") or [])
    to_taint = frozenset(
        d.action.node for d in decisions.values() if isinstance(d.action, TaintOutOfService)
    )
    to_join = frozenset(
        d.handover.from_node
        for d in decisions.values()
        if d.handover is not None
        and d.handover.from_node
        and join_out_of_service_taint(obs.nodes.get(d.handover.from_node), us, d.handover)
    )
    marking = sorted(n for n in to_taint | to_join if n not in tainted)
    tainted += marking
    # counted with the completions that the record ends: a pass killed (or whose final
    # status write conflicts) after the record is written never decides them again
    failovers = int(obs.previous.get("failovers") or 0) + sum(
        1
        for d in decisions.values()
        if isinstance(d.action, CompleteHandover)
        and not d.action.handover.reason.planned  # a roll or a drain is not a failover
    )
    record = None
    if changed or marking:
        record = {
            "partitions": [s.to_status() for s in parts.values()],
            "taintedNodes": tainted,
            "failovers": failovers,
        }

    steps = []
    for p, d in decisions.items():
        action: Action | None = d.action
        if isinstance(action, CreatePod) and not _startable(obs.topic, p):
            what = "internal topic" if obs.topic.reason.startswith("Owned") else "input topic"
            parts[p] = replace(parts[p], waiting_for=f"{what} ({obs.topic.reason})")
            action = None
        steps.append(PartitionStep(p, d, action, _events(p, d, obs.previous_partition(p))))

    state = obs.ownership
    ownership = state.recorded if state is not None else None
    events: list[Event] = []
    switch = state.switch if state is not None else None
    if switch == SwitchPhase.BEGIN and state is not None and state.to_record is not None:
        # recorded with every partition's switch handover, before any worker is stopped
        ownership = state.to_record
        record = {**(record or {}), OWNERSHIP_KEY: dict(ownership)}
        events.append(
            (
                "Normal",
                "OwnershipSwitchStarted",
                f"switching to ownership: all {spec.partitions} workers stop and are fenced, "
                f"then start under ownership with the internal topic {spec.owned_topic}; "
                "the output pauses meanwhile (one way)",
            )
        )
    elif switch == SwitchPhase.STOPPING and ownership_stopped:
        # every old worker is gone and fenced: the generation the workers start with is
        # recorded (the merge patch drops `enabled` and `switching`); they start next pass
        ownership = ownership_mod.switched_record(spec.partitions, now)
        switched = {**ownership, "enabled": None, "switching": None}
        record = {**(record or {}), OWNERSHIP_KEY: switched}
        events.append(
            (
                "Normal",
                "OwnershipSwitchWorkersStopped",
                f"all {spec.partitions} workers stopped and fenced: starting them under ownership",
            )
        )
    elif (
        state is not None
        and state.to_record is not None
        and any(isinstance(s.action, CreatePod) for s in steps)
    ):
        # the generation the workers run is recorded before the first of them exists:
        # from then on a change of spec.partitions is ReshardPending, and a pipeline
        # with workers but no record is one that ran before ownership
        ownership = state.to_record
        record = {**(record or {}), OWNERSHIP_KEY: dict(ownership)}
    elif record is not None and ownership is not None:
        record = {**record, OWNERSHIP_KEY: dict(ownership)}  # kept with the entries

    lift, forget = [], []
    for node_name in tainted:
        if node_name in to_taint | to_join:
            continue  # marked in this pass, after the nodes were read
        node = obs.nodes.get(node_name)
        if node is None or us not in node.tainted_by:
            forget.append(node_name)  # gone, or untainted by someone: not ours to lift
        elif remove_out_of_service_taint(node, _our_attachments(obs, node_name), us):
            lift.append(node_name)
    return Plan(
        steps=tuple(steps),
        partitions=parts,
        record=record,
        set_finalizer=bool(to_taint | to_join),
        tainted=tuple(tainted),
        to_taint=to_taint,
        to_join=to_join,
        lift=tuple(lift),
        forget=tuple(forget),
        failovers=failovers,
        pod_uids={v.name: v.uid for views in obs.pods.values() for v in views},
        ownership=ownership,
        events=tuple(events),
    )


def _decide_partitions(
    obs: PipelineObservation, policy: FailoverPolicy, now: datetime
) -> dict[int, Decision]:
    """Every partition's decision; at most one partition starts a roll per pass, and
    none while any partition is not Ready or is handing over."""
    spec = obs.spec
    any_handover = any(obs.previous_partition(p).get("handover") for p in range(spec.partitions))
    all_ready = all(
        any(v.ready and v.phase == "Running" and not v.deleting for v in obs.pods.get(p, ()))
        for p in range(spec.partitions)
    )
    may_roll = all_ready and not any_handover
    switch = obs.ownership.switch if obs.ownership is not None else None
    decisions: dict[int, Decision] = {}
    for p in range(spec.partitions):
        prev = obs.previous_partition(p)
        pv = obs.volume_name(p)
        partition_obs = PartitionObservation(
            partition=p,
            pods=obs.pods.get(p, ()),
            nodes=obs.nodes,
            lease=obs.leases.get(names.lease(spec.name, p)),
            attachments=attachments_of(obs.attachments, pv),
            handover=Handover.from_status(prev["handover"]) if prev.get("handover") else None,
            desired_hash=desired_partition.template_hash(spec, p),
            may_roll=may_roll,
            last_node=prev.get("node"),
        )
        if switch in (SwitchPhase.BEGIN, SwitchPhase.STOPPING):
            # no worker starts before every old one is stopped (ownership.py)
            decision = ownership_mod.stop_for_switch(partition_obs, policy, now)
        else:
            decision = partition_action(partition_obs, policy, now)
        decisions[p] = decision
        if isinstance(decision.action, BeginHandover):
            may_roll = False  # one partition rolls at a time
    return decisions


def _startable(topic: TopicCheck, p: int) -> bool:
    """May partition p's worker start? Not without the input topic, or under ownership
    without a usable internal topic; without ownership, only for an input partition p."""
    if topic.blocks or topic.reason == "TopicMissing":
        return False
    if topic.ownership:
        return True
    return topic.partitions is None or p < topic.partitions


def _our_attachments(obs: PipelineObservation, node_name: str) -> int:
    """How many of this pipeline's volumes are attached to the node."""
    ours = {
        (c.get("spec") or {}).get("volumeName")
        for c in obs.claims.values()
        if (c.get("spec") or {}).get("volumeName")
    }
    return sum(
        1
        for va in obs.attachments
        if (va.get("spec") or {}).get("nodeName") == node_name
        and ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName") in ours
    )


def _completed(handover: Mapping[str, Any], pod: str) -> dict[str, Any]:
    """status.partitions[].lastHandover as the record persisted before acting: `told`
    False until the status written after the pass's Events says True (`pipeline_status`).
    A pass that stopped in between (killed, deposed, a conflict) leaves it False, and the
    next pass tells the completion then: the Event is posted at least once."""
    return {**handover, "toPod": pod, "told": False}


def _completion_event(p: int, last: Mapping[str, Any]) -> Event:
    steps = last.get("steps") or {}
    _, _, completed = handover_events(last.get("reason"))
    return (
        "Normal",
        completed,
        f"partition {p}: {last.get('toPod')} is Ready after "
        f"{float(steps.get('ready', 0.0)):.1f}s "
        f"({', '.join(f'{k} {float(v):.1f}s' for k, v in steps.items())})",
    )


def _events(p: int, d: Decision, previous: Mapping[str, Any]) -> tuple[Event, ...]:
    """The Events a decision is told by, whatever its action's outcome: a handover
    begun, completed or cancelled, newly Degraded, or released a new way; and a
    completion an earlier pass recorded but did not get to tell."""
    events: list[Event] = []
    action = d.action
    untold = previous.get("lastHandover") or {}
    if untold.get("told") is False and not isinstance(action, CompleteHandover):
        events.append(_completion_event(p, untold))
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
        events.append(_completion_event(p, _completed(action.handover.to_status(), action.pod)))
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


def _handover_status(decision: Decision) -> dict[str, Any] | None:
    return decision.handover.to_status() if decision.handover else None


def _partition_status(
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
        handover=_handover_status(decision),
        last_handover=previous.get("lastHandover"),
        last_failover=previous.get("lastFailover"),
    )


@dataclass(frozen=True)
class WorkerCounters:
    """One partition's counters from its worker's /metrics."""

    duplicates: int
    records_in: int
    records_out: int
    lag: int


def pipeline_status(
    obs: PipelineObservation,
    plan: Plan,
    counters: Mapping[int, WorkerCounters],
    tainted: Sequence[str],
    last_audit: Mapping[str, Any] | None,
    audit_condition: Condition | None,
    now: datetime,
) -> dict[str, Any]:
    """The status this pass writes: the plan's partitions with their workers' counters,
    the summary conditions and phase, and the audit's last result."""
    spec = obs.spec
    parts = dict(plan.partitions)
    for p, c in counters.items():
        parts[p] = replace(parts[p], lag=c.lag, duplicates=c.duplicates)
    for p, entry in parts.items():  # this pass has told every completion (plan.steps)
        if entry.last_handover and entry.last_handover.get("told") is False:
            parts[p] = replace(entry, last_handover={**entry.last_handover, "told": True})
    entries = [parts[p] for p in range(spec.partitions)]
    degraded = [d.degraded for d in plan.decisions().values() if d.degraded]
    if not obs.topic.ok and obs.topic.reason != "KafkaUnreachable":
        degraded.append(obs.topic.message)
    spec_current = all(
        v.spec_hash == desired_partition.template_hash(spec, p)
        for p in range(spec.partitions)
        for v in obs.pods.get(p, ())
        if not v.deleting
    )
    topic_condition = Condition("TopicReady", obs.topic.ok, obs.topic.reason, obs.topic.message)
    conditions = summary_conditions(
        entries, spec.partitions, topic_condition, degraded, spec_current
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
    status: dict[str, Any] = {
        "phase": phase_of(entries, bool(degraded), obs.previous.get("phase")),
        "observedGeneration": obs.generation,
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
    if plan.ownership is not None:
        status[OWNERSHIP_KEY] = dict(plan.ownership)
    if last_audit:
        status["lastReconciliation"] = dict(last_audit)
    return status
