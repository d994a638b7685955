"""What one reconcile pass does, decided from what it observed (pure).

A pass over a pipeline is observe → decide → act → report (`reconcile.py` is the
shell). This module is the decide step:

- `plan_pass(observation, now, settings)` decides every partition with
  `failover.partition_action`, and from those decisions: the status record to persist
  *before* acting (the handover records, and the nodes about to be tainted so that a
  restarted operator knows which taints are its own to lift), whether the taint
  finalizer must be set first, and which of our out-of-service taints to lift or
  forget. Then every action of the pass in order (`actions.py`, their Events composed
  by `events.py`): the pipeline's own objects and volume claims, the record, each
  partition's action, the taints, the audit's result, what the status tells.
  A plan that creates the internal topic holds nothing after it: the workers are
  decided on the topic as made (`Plan.observe_again`).
- `plan_invalid` / `plan_finalize`: a spec that does not parse, a deleted pipeline.
- the status is composed by `status.py` (the entries of the partitions, and the
  status written at the end of the pass); the pipeline's own objects and the audit's
  result are planned by `plan_objects.py`; the observations come from `observe.py`.

Nothing here reads the cluster or a clock; the executor applies the actions and, where
an action's outcome matters (a taint someone else's got there first), keeps track.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import singledispatch
from typing import Any

from dedup_contract import names
from dedup_contract.ownership_status import OWNERSHIP_SWITCHING
from dedup_contract.ownership_status import STATUS_KEY as OWNERSHIP_KEY
from dedup_operator import events
from dedup_operator import ownership_generation as ownership_mod
from dedup_operator.actions import (
    CountHandoverBegun,
    CountHandoverCompleted,
    CreateOwnedTopic,
    CreateWorker,
    DeleteOwnedTopic,
    DeleteWorkers,
    EnsureObject,
    FenceWorkerLease,
    LiftOutOfService,
    MarkOutOfService,
    Note,
    PassAction,
    ReleaseTaintFinalizer,
    RememberSwitchIgnoredTold,
    RememberTopicCheck,
    RememberTopicTold,
    SetFinalizer,
    Tell,
    WriteHandoverRecord,
)
from dedup_operator.desired import partition as desired_partition
from dedup_operator.events import Event
from dedup_operator.failover import (
    BeginHandover,
    CompleteHandover,
    CreateLease,
    CreatePod,
    Decision,
    DeletePods,
    FailoverPolicy,
    FenceLease,
    Handover,
    PartitionAction,
    PartitionObservation,
    Steady,
    TaintOutOfService,
    join_out_of_service_taint,
    partition_action,
    remove_out_of_service_taint,
)
from dedup_operator.node_marks import taint_mark
from dedup_operator.observe import DeletedPipeline, InvalidSpec, PipelineObservation
from dedup_operator.observed import attachments_of
from dedup_operator.ownership_generation import SwitchPhase
from dedup_operator.pass_outcome import Rest
from dedup_operator.plan_objects import plan_audit, setup_actions
from dedup_operator.settings import ReconcileSettings
from dedup_operator.shared_kafka import SHARED_REASONS
from dedup_operator.status import (
    handover_status,
    invalid_spec_status,
    partition_statuses,
    pipeline_status,
)
from dedup_operator.status_records import Condition, PartitionStatus
from dedup_operator.topics import TopicCheck


# ----------------------------------------------------------------------- plans
@dataclass(frozen=True)
class PartitionStep:
    """One partition's part of the plan: its action (None: nothing to carry out, e.g. a
    pod that cannot start before the input topic exists) and the Events that go with the
    decision whatever the action's outcome."""

    partition: int
    decision: Decision
    action: PartitionAction | None
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Plan:
    steps: tuple[PartitionStep, ...] = ()
    partitions: Mapping[int, PartitionStatus] = field(default_factory=dict)
    # persisted before any action, when not None
    record: Mapping[str, Any] | None = None
    set_finalizer: bool = False  # the taint finalizer goes on before anything is tainted
    tainted: tuple[str, ...] = ()  # status.taintedNodes once the record is written
    to_taint: frozenset[str] = frozenset()  # lost nodes this pipeline taints
    to_join: frozenset[str] = frozenset()  # lost nodes tainted by others that we mark too
    lift: tuple[str, ...] = ()  # our taints to remove (the node is back, none of our volumes)
    forget: tuple[str, ...] = ()  # tainted nodes gone or untainted by someone: off our list
    failovers: int = 0  # status.failovers after the completions in this plan
    # each observed pod's uid: deletes are conditional
    pod_uids: Mapping[str, str | None] = field(default_factory=dict)
    # status.ownership after this plan: as recorded, or recorded by this plan's record
    # before it creates the first worker; None: not yet (no worker started) or off
    ownership: Mapping[str, Any] | None = None
    # the pipeline's own Events, told once the record is written (the switch's steps)
    events: tuple[Event, ...] = ()
    # status.taintedNodes after the lifts and forgets (a taint of ours that someone
    # else's got to first comes off it when acting)
    relying_on: tuple[str, ...] = ()
    actions: tuple[PassAction, ...] = ()  # everything the act step applies, in order
    observe_again: bool = False  # the internal topic is created first: decide on it
    last_audit: Mapping[str, Any] | None = None  # status.lastReconciliation after it
    audit_condition: Condition | None = None

    def decisions(self) -> dict[int, Decision]:
        return {s.partition: s.decision for s in self.steps}

    def at_rest(self) -> bool:
        """Nothing pending that time alone resolves: every partition steady with nothing
        awaited and no handover, no record to write, no taint relied on or to lift. Its
        next pass is due when something it reads changes (`dedup_operator.wakeups`) or
        at the resync; a partition waiting for something (a replacement to be Ready, a
        volume to detach, a Lease to run out) keeps the pipeline passing at its interval."""
        return (
            self.record is None
            and not self.observe_again
            and not (self.relying_on or self.to_taint or self.to_join or self.lift)
            and all(
                isinstance(s.action, Steady)
                and s.action.waiting_for is None
                and s.action.until is None
                and s.decision.handover is None
                and s.decision.degraded is None
                for s in self.steps
            )
        )

    def rest(self, obs: PipelineObservation) -> Rest | None:
        """What can wake the pipeline before its resync when this plan leaves it at rest:
        its workers' nodes going silent (None: not at rest)."""
        if not self.at_rest():
            return None
        on = {p.node for pods in obs.pods.values() for p in pods if p.node}
        ages = {n: obs.nodes[n].heartbeat_age if n in obs.nodes else None for n in on}
        return Rest(
            nodes={n: None if a is None else a.total_seconds() for n, a in ages.items()},
            lost_after_s=obs.spec.failover.policy().node_lost_after.total_seconds(),
        )

    def requeue_after(self, now: datetime) -> float | None:
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


@dataclass(frozen=True)
class InvalidSpecPlan:
    actions: tuple[PassAction, ...]
    status: dict[str, Any]  # written whatever the status was


@dataclass(frozen=True)
class FinalizePlan:
    actions: tuple[PassAction, ...]
    complete: bool  # every finalizer of ours goes once the actions are applied


# ------------------------------------------------------------------ the pass
def plan_pass(
    obs: PipelineObservation, now: datetime, settings: ReconcileSettings | None = None
) -> Plan:
    """The pass's plan, in the order its actions are applied: the topics' check read
    in this pass remembered, what is told of the ownership generation, the pipeline's
    own objects and volume claims (the internal topic, when it is to be created, ends
    the plan there), the TopicReady failure, the workers' plan (`_plan_workers`), the
    audit's result, and what the new status tells."""
    setup = setup_actions(obs, settings or ReconcileSettings())
    if obs.owned_topic is not None:
        return _topic_first(obs, setup)
    workers = _plan_workers(obs, now)
    audit = plan_audit(obs)
    workers = replace(workers, last_audit=audit.last, audit_condition=audit.condition)
    actions = (
        *_topic_remembered(obs),
        *_told_first(obs),
        *setup,
        *_topic_told(obs),
        *_worker_actions(obs, workers),
        *audit.actions,
        *_told_by_status(obs, workers, now),
    )
    return replace(workers, actions=actions)


def _plan_workers(obs: PipelineObservation, now: datetime) -> Plan:
    """Every partition's decision and what follows from them: the record persisted
    before acting, each partition's step, the taints to mark, lift or forget."""
    spec = obs.spec
    us = taint_mark(spec.namespace, spec.name)
    decisions = _decide_partitions(obs, spec.failover.policy(), now)
    parts = partition_statuses(obs, decisions, now)
    to_taint, to_join = _taints_relied_on(obs, decisions, us)
    tainted = list(obs.previous.get("taintedNodes") or [])
    marking = sorted(n for n in to_taint | to_join if n not in tainted)
    tainted += marking
    failovers = _failovers(obs, decisions)
    record: Mapping[str, Any] | None = None
    if marking or _handovers_changed(obs, decisions):
        record = {
            "partitions": [s.to_status() for s in parts.values()],
            "taintedNodes": tainted,
            "failovers": failovers,
        }
    steps, parts = _steps(obs, decisions, parts)
    record, ownership, told = _with_ownership(obs, decisions, steps, record, now)
    lift, forget = _lift_or_forget(obs, tainted, to_taint | to_join, us)
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
        events=told,
        relying_on=tuple(n for n in tainted if n not in lift and n not in forget),
    )


def _handovers_changed(obs: PipelineObservation, decisions: Mapping[int, Decision]) -> bool:
    return any(
        handover_status(d) != (obs.previous_partition(p).get("handover") or None)
        for p, d in decisions.items()
    )


def _taints_relied_on(
    obs: PipelineObservation, decisions: Mapping[int, Decision], us: str
) -> tuple[frozenset[str], frozenset[str]]:
    """(lost nodes this pipeline taints, lost nodes others tainted that it marks too)."""
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
    return to_taint, to_join


def _failovers(obs: PipelineObservation, decisions: Mapping[int, Decision]) -> int:
    """status.failovers, counted with the completions that the record ends: a pass
    killed (or whose final status write conflicts) after the record is written never
    decides them again."""
    return int(obs.previous.get("failovers") or 0) + sum(
        1
        for d in decisions.values()
        if isinstance(d.action, CompleteHandover)
        and not d.action.handover.reason.planned  # a roll or a drain is not a failover
    )


def _steps(
    obs: PipelineObservation,
    decisions: Mapping[int, Decision],
    parts: Mapping[int, PartitionStatus],
) -> tuple[list[PartitionStep], dict[int, PartitionStatus]]:
    """Each partition's step with its Events; a pod that may not start yet is none,
    and its partition says what it waits for."""
    parts = dict(parts)
    steps = []
    for p, d in decisions.items():
        action: PartitionAction | None = d.action
        topic = obs.topic_ready
        if isinstance(action, CreatePod) and not _startable(topic, p):
            what = "internal topic" if topic.reason.startswith("Owned") else "input topic"
            if topic.reason in SHARED_REASONS:
                what = "Kafka resources of its own"
            parts[p] = replace(parts[p], waiting_for=f"{what} ({topic.reason})")
            action = None
        told = events.partition_events(p, d, obs.previous_partition(p))
        steps.append(PartitionStep(p, d, action, told))
    return steps, parts


def _with_ownership(
    obs: PipelineObservation,
    decisions: Mapping[int, Decision],
    steps: Sequence[PartitionStep],
    record: Mapping[str, Any] | None,
    now: datetime,
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None, tuple[Event, ...]]:
    """(the record with status.ownership when it goes with it, status.ownership after
    this plan, the switch's own Events)."""
    spec, state = obs.spec, obs.ownership
    ownership = state.recorded if state is not None else None
    switch = state.switch if state is not None else None
    if switch == SwitchPhase.BEGIN and state is not None and state.to_record is not None:
        # recorded with every partition's switch handover, before any worker is stopped
        started = events.switch_started(spec.partitions, spec.owned_topic)
        return {**(record or {}), OWNERSHIP_KEY: dict(state.to_record)}, state.to_record, (started,)
    if switch == SwitchPhase.STOPPING and ownership_mod.all_stopped(decisions):
        # every old worker is gone and fenced: the generation the workers start with is
        # recorded (the merge patch drops `enabled` and `switching`); they start next pass
        ownership = ownership_mod.switched_record(spec.partitions, now)
        switched = {**ownership, "enabled": None, "switching": None}
        stopped = events.switch_workers_stopped(spec.partitions)
        return {**(record or {}), OWNERSHIP_KEY: switched}, ownership, (stopped,)
    if (
        state is not None
        and state.to_record is not None
        and any(isinstance(s.action, CreatePod) for s in steps)
    ):
        # the generation the workers run is recorded before the first of them exists:
        # from then on a change of spec.partitions is ReshardPending, and a pipeline
        # with workers but no record is one that ran before ownership
        return {**(record or {}), OWNERSHIP_KEY: dict(state.to_record)}, state.to_record, ()
    if record is not None and ownership is not None:
        return {**record, OWNERSHIP_KEY: dict(ownership)}, ownership, ()  # kept with the entries
    return record, ownership, ()


def _lift_or_forget(
    obs: PipelineObservation, tainted: Sequence[str], marked: frozenset[str], us: str
) -> tuple[list[str], list[str]]:
    """(our taints to lift: the node is back and none of our volumes is attached there,
    tainted nodes to forget: gone, or untainted by someone, not ours to lift)."""
    lift, forget = [], []
    for node_name in tainted:
        if node_name in marked:
            continue  # marked in this pass, after the nodes were read
        node = obs.nodes.get(node_name)
        if node is None or us not in node.tainted_by:
            forget.append(node_name)
        elif remove_out_of_service_taint(node, _our_attachments(obs, node_name), us):
            lift.append(node_name)
    return lift, forget


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
            # no worker starts before every old one is stopped (ownership_generation.py)
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


def _has_condition(status: Mapping[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True" for c in status.get("conditions") or []
    )


# ---------------------------------------------------------- the plan's actions
def _worker_actions(obs: PipelineObservation, plan: Plan) -> tuple[PassAction, ...]:
    """The workers' plan carried out: the taint finalizer and the plan's record (with
    status.ownership before the first worker) persisted first, then each partition's
    action with its Events, the taints joined, and our taints lifted from nodes that
    are back; the taint finalizer goes once the pipeline relies on no taint."""
    us = taint_mark(obs.spec.namespace, obs.spec.name)
    actions: list[PassAction] = []
    if plan.set_finalizer:
        # the finalizer first: a pipeline deleted from now on lifts its marks
        actions.append(SetFinalizer(names.FINALIZER_TAINTS, present=True))
    if plan.record is not None:
        # entries in it: not the ownership generation's record alone
        actions.append(WriteHandoverRecord(plan.record, fault_point="partitions" in plan.record))
    actions += [Tell(e) for e in plan.events]  # the pipeline's own steps, once recorded
    for step in plan.steps:
        if step.action is not None:
            actions += _carried_out(step.action, step, obs, plan)
        actions += [Tell(e) for e in step.events]
    actions += [MarkOutOfService(n, us, events.taint_joined(n)) for n in sorted(plan.to_join)]
    actions += [LiftOutOfService(n, us, events.taint_lifted(n)) for n in plan.lift]
    if names.FINALIZER_TAINTS in obs.finalizers:
        actions.append(ReleaseTaintFinalizer())
    return tuple(actions)


@singledispatch
def _carried_out(
    action: PartitionAction, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    """A partition's action as the pass's actions. Steady and CancelHandover write
    nothing (their Events are the step's)."""
    return ()


@_carried_out.register
def _create_lease(
    action: CreateLease, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    return (EnsureObject(desired_partition.lease(obs.spec, step.partition, obs.owner)),)


@_carried_out.register
def _create_pod(
    action: CreatePod, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    p = step.partition
    pod = desired_partition.worker_pod(obs.spec, p, action.epoch, obs.owner, action.avoid_node)
    told = events.worker_created(p, pod["metadata"]["name"], action.epoch, action.avoid_node)
    return (CreateWorker(pod, told),)


@_carried_out.register
def _delete_pods(
    action: DeletePods, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    pods = tuple((n, plan.pod_uids.get(n)) for n in action.names)
    told = events.workers_deleted(step.partition, action.names, action.force, action.why)
    return (DeleteWorkers(obs.spec.namespace, pods, action.force, told),)


@_carried_out.register
def _fence_lease(
    action: FenceLease, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    lease = names.lease(obs.spec.name, step.partition)
    told = events.lease_fenced(step.partition, lease, action.holder)
    return (FenceWorkerLease(obs.spec.namespace, lease, action.resource_version, told),)


@_carried_out.register
def _taint(
    action: TaintOutOfService, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    if action.node in plan.to_join:
        return ()  # marked as joined, after the partitions
    h = step.decision.handover
    told = events.node_tainted(step.partition, action.node, h.release_why if h else None)
    return (MarkOutOfService(action.node, taint_mark(obs.spec.namespace, obs.spec.name), told),)


@_carried_out.register
def _begin(
    action: BeginHandover, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    reason = action.handover.reason.value
    return (CountHandoverBegun(obs.spec.namespace, obs.spec.name, reason),)


@_carried_out.register
def _complete(
    action: CompleteHandover, step: PartitionStep, obs: PipelineObservation, plan: Plan
) -> tuple[PassAction, ...]:
    h = action.handover
    spec = obs.spec
    return (
        CountHandoverCompleted(
            spec.namespace, spec.name, step.partition, h.reason.value, dict(h.steps)
        ),
    )


def _topic_first(obs: PipelineObservation, setup: Sequence[PassAction]) -> Plan:
    """The internal topic created (its finalizer on first: a pipeline deleted from now
    on deletes it) after the pipeline's own objects; nothing else is decided before the
    topic is checked as made."""
    missing = obs.owned_topic
    assert missing is not None
    actions = list(setup)
    if names.FINALIZER_OWNED_TOPIC not in obs.finalizers:
        actions.append(SetFinalizer(names.FINALIZER_OWNED_TOPIC, present=True))
    created = events.owned_topic_created(missing.wanted)
    actions.append(CreateOwnedTopic(missing.query, missing.wanted, created))
    return Plan(actions=tuple(actions), observe_again=True)


def _topic_remembered(obs: PipelineObservation) -> tuple[PassAction, ...]:
    if obs.topic_read is None:
        return ()
    return (RememberTopicCheck(obs.topic_read, obs.topic),)


def _told_first(obs: PipelineObservation) -> tuple[PassAction, ...]:
    """A Warning Event when ReshardPending or OwnershipOff appears (or its reason
    changes); the switch annotation ignored, told once."""
    state = obs.ownership
    if state is None:
        return ()
    actions: list[PassAction] = []
    c = state.condition
    if c is not None:
        conditions = obs.previous.get("conditions") or []
        was = next((x for x in conditions if x.get("type") == c.type), None)
        if was is None or was.get("reason") != c.reason or was.get("status") != "True":
            actions.append(Tell(events.ownership_condition(c)))
    if state.switch_ignored and not obs.recalled.switch_ignored_told:
        told = events.switch_ignored(names.ANNOTATION_SWITCH_TO_OWNERSHIP)
        actions += [Tell(told), RememberSwitchIgnoredTold()]
    return tuple(actions)


def _topic_told(obs: PipelineObservation) -> tuple[PassAction, ...]:
    """TopicReady failing, when it starts or its reason changes: no promise can be kept
    until it is fixed, an ERROR line. Once per reason: the status records it, and so
    does the memory (a pass abandoned on a Conflict does not write the status)."""
    topic, told = obs.topic_ready, obs.recalled.topic_told
    if topic.ok:
        return () if told is None else (RememberTopicTold(None),)
    conditions = obs.previous.get("conditions") or []
    was = next((c for c in conditions if c.get("type") == "TopicReady"), None)
    if (was is None or was.get("reason") != topic.reason) and told != topic.reason:
        return (Tell(events.topic_failing(topic), error=True), RememberTopicTold(topic.reason))
    return ()


def _told_by_status(obs: PipelineObservation, plan: Plan, now: datetime) -> tuple[Tell, ...]:
    """The pipeline Running for the first time (or again), and the switch to ownership
    completed, as the status this pass writes says (the workers' counters aside)."""
    status = pipeline_status(
        obs, plan, {}, plan.tainted, plan.last_audit, plan.audit_condition, now
    )
    previous = obs.previous
    told = []
    if status["phase"] == "Running" and previous.get("phase") != "Running":
        told.append(Tell(events.pipeline_ready(obs.spec.partitions)))
    if _has_condition(previous, OWNERSHIP_SWITCHING) and not _has_condition(
        status, OWNERSHIP_SWITCHING
    ):
        told.append(Tell(events.switch_completed(obs.spec.partitions)))
    return tuple(told)


# ------------------------------------------------------ other kinds of passes
def plan_invalid(seen: InvalidSpec, now: datetime) -> InvalidSpecPlan:
    """A spec that does not parse: Failed, Ready False and Degraded True with the
    parser's message (an Event when it is new for this generation)."""
    previous, generation, message = seen.previous, seen.generation, seen.message
    actions: tuple[PassAction, ...] = ()
    if previous.get("phase") != "Failed" or previous.get("observedGeneration") != generation:
        actions = (Tell(events.invalid_spec(message)),)
    return InvalidSpecPlan(actions, invalid_spec_status(previous, generation, message, now))


def plan_finalize(seen: DeletedPipeline) -> FinalizePlan:
    """A deleted pipeline lifts its marks from the out-of-service taints it relies on
    (and each taint with its last mark), and deletes the internal topic the operator
    created for it once no worker can still write to it; then lets itself go (each
    finalizer once its part is done)."""
    namespace, name = seen.namespace, seen.name
    actions: list[PassAction] = []
    if names.FINALIZER_TAINTS in seen.finalizers:
        us = taint_mark(namespace, name)
        actions += [
            LiftOutOfService(n, us, events.taint_lifted(n, pipeline_deleted=True))
            for n in seen.marked_nodes
        ]
        actions.append(SetFinalizer(names.FINALIZER_TAINTS, present=False, guarded=False))
    if names.FINALIZER_OWNED_TOPIC not in seen.finalizers:
        return FinalizePlan(tuple(actions), complete=True)
    if seen.workers:  # deleted gracefully
        actions.append(DeleteWorkers(namespace, seen.workers, force=False, deleted=None))
    kept = _topic_kept(seen)
    if kept is not None:
        return FinalizePlan((*actions, kept), complete=False)  # the next pass tries again
    actions += [
        DeleteOwnedTopic(
            seen.bootstrap,
            seen.kafka_settings or {},
            seen.topic,
            events.owned_topic_deleted(seen.topic),
            events.topic_not_deleted(namespace, name, seen.topic),
        ),
        SetFinalizer(names.FINALIZER_OWNED_TOPIC, present=False, guarded=False),
    ]
    return FinalizePlan(tuple(actions), complete=True)


def _topic_kept(seen: DeletedPipeline) -> Note | None:
    """Why the internal topic (`names.owned_topic`: the finalizer is set only for that
    name, never for a `kafka.ownedTopic` of the user's) is not deleted in this pass:
    every partition Lease must have run out on the operator's clock first (a worker
    still producing to a deleted topic could have it auto-created again with the
    broker's defaults), and its Kafka settings must be readable."""
    namespace, name = seen.namespace, seen.name
    if seen.held_leases:
        return Note(logging.INFO, events.leases_held_line(namespace, name, seen.held_leases))
    if seen.spec_error is not None:
        return Note(logging.ERROR, events.spec_unreadable_line(namespace, name, seen.spec_error))
    if seen.settings_error is not None:
        refused = events.topic_not_deleted(namespace, name, seen.topic)
        return Note(logging.ERROR, f"{refused}: {seen.settings_error}")
    return None
