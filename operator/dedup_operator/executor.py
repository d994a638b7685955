"""The act step of a reconcile pass: each action of the plan applied, in order, by the one
function its type has (`APPLIERS`, a table keyed by type: `actions.PassAction` lists
every type, the unit tests check that each has exactly one).

The executor composes no Event and decides nothing: it posts the Events the actions
carry (an action's own only when its write did something: a pod created, a Lease
fenced, a node tainted) and keeps track of what acting changed that the status says:
the pipeline's resourceVersion after the pass's own writes (every guarded write
carries it: a pipeline changed meanwhile is a Conflict) and status.taintedNodes (a
lost node someone else's taint got to first is not ours). One action can stop the rest
(`DeleteOwnedTopic` refused: its finalizer stays); `execute` then says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dedup_contract import faults, names
from dedup_contract.handover import READY
from dedup_operator import operator_metrics
from dedup_operator.actions import (
    AdoptAuditResult,
    ApplyAuditSchedule,
    CountAuditResult,
    CountHandoverBegun,
    CountHandoverCompleted,
    CreateOwnedTopic,
    CreateVolumeClaim,
    CreateWorker,
    DeleteAuditObject,
    DeleteOwnedTopic,
    DeleteWorkers,
    EnsureObject,
    FenceWorkerLease,
    LiftOutOfService,
    MarkOutOfService,
    Note,
    PassAction,
    ReleaseTaintFinalizer,
    RememberAuditUnreadable,
    RememberObjectsEnsured,
    RememberSwitchIgnoredTold,
    RememberTopicCheck,
    RememberTopicTold,
    ReplaceDisruptionBudget,
    ReplaceRoleRules,
    ResizeVolumeClaim,
    SetFinalizer,
    Tell,
    WriteHandoverRecord,
)
from dedup_operator.cluster_api import ClusterWrites
from dedup_operator.events import Event
from dedup_operator.kafka_admin import create_topic, delete_topic
from dedup_operator.memory import PipelineMemory
from dedup_operator.observe import read_topic_facts, topic_check
from dedup_operator.topics import TopicFacts

log = logging.getLogger("dedup_operator.reconcile")


class Recorder(Protocol):
    """(type, reason, message) -> an Event on the pipeline and a log
    line; `error`: the pipeline cannot keep its promise (its log line is ERROR)."""

    def __call__(self, type_: str, reason: str, message: str, error: bool = False) -> None: ...


@dataclass
class Acting:
    """What the appliers of one pass share."""

    kube: ClusterWrites
    record: Recorder
    memory: PipelineMemory
    namespace: str
    name: str
    version: str | None  # the pipeline's resourceVersion after the pass's own writes
    tainted: list[str] = field(default_factory=list)  # status.taintedNodes as acting left it
    applied: list[str] = field(default_factory=list)  # the kinds applied, in order
    stopped: bool = False  # an action stopped the rest
    # when the next pass is due, as the pass's last plan said (kept if it is abandoned)
    requeue_after: float | None = None
    # Since `next_step_known()` last asked: a handover step was taken whose effect the
    # watches hold at once (a handover begun, a Lease fenced, a node marked: the
    # operator's own writes), and none whose effect only a watch event brings (a pod
    # created or deleted, that the next look would find as it was).
    step_held: bool = False
    step_awaits_watch: bool = False

    def tell(self, event: Event, error: bool = False) -> None:
        if error:
            self.record(*event, error=True)
        else:
            self.record(*event)

    def next_step_known(self) -> bool:
        """May the pass decide its next step at once, on the watches as they are? (A
        handover's fence, taint and release follow each other without waiting for
        anyone else; each waited behind every other pipeline's pass in the queue.)"""
        known = self.step_held and not self.step_awaits_watch
        self.step_held = self.step_awaits_watch = False
        return known


def execute(actions: Sequence[PassAction], acting: Acting) -> bool:
    """Apply the actions in order; False when one of them stopped the rest."""
    for action in actions:
        if acting.stopped:
            break
        APPLIERS[type(action)](action, acting)
        acting.applied.append(type(action).__name__)
    return not acting.stopped


# ------------------------------------------------------------------ told
def _tell(action: Tell, acting: Acting) -> None:
    acting.tell(action.event, action.error)


def _note(action: Note, acting: Acting) -> None:
    log.log(action.level, "%s", action.message)


# ------------------------------------------------- the pipeline's own objects
def _ensure_object(action: EnsureObject, acting: Acting) -> None:
    acting.kube.ensure(action.body)


def _replace_role_rules(action: ReplaceRoleRules, acting: Acting) -> None:
    acting.kube.replace_role_rules(action.body)


def _replace_disruption_budget(action: ReplaceDisruptionBudget, acting: Acting) -> None:
    acting.kube.replace_disruption_budget_spec(action.body)


def _apply_audit_schedule(action: ApplyAuditSchedule, acting: Acting) -> None:
    acting.kube.apply_by_hash(action.body)


def _delete_audit_object(action: DeleteAuditObject, acting: Acting) -> None:
    acting.kube.delete_if_present(action.kind, action.namespace, action.name)


def _remember_objects_ensured(action: RememberObjectsEnsured, acting: Acting) -> None:
    acting.memory.ensured = (action.generation, time.monotonic())
    if action.applied is not None:
        acting.memory.applied = action.applied


def _create_volume_claim(action: CreateVolumeClaim, acting: Acting) -> None:
    acting.kube.ensure(action.body)
    acting.tell(action.created)


def _resize_volume_claim(action: ResizeVolumeClaim, acting: Acting) -> None:
    acting.kube.resize_volume_claim(action.namespace, action.name, action.size)
    acting.tell(action.resized)


def _adopt_audit_result(action: AdoptAuditResult, acting: Acting) -> None:
    acting.kube.add_owner_reference(action.namespace, action.config_map, action.owner_reference)


def _count_audit_result(action: CountAuditResult, acting: Acting) -> None:
    ns, name = action.namespace, action.name
    operator_metrics.RECONCILIATIONS.labels(ns, name, "passed" if action.passed else "failed").inc()
    operator_metrics.RECONCILIATION_DUPLICATES.labels(ns, name).set(action.duplicates)
    operator_metrics.RECONCILIATION_MISSING.labels(ns, name).set(action.missing)


def _remember_audit_unreadable(action: RememberAuditUnreadable, acting: Acting) -> None:
    acting.memory.audit_unreadable = action.why


def _remember_switch_ignored_told(action: RememberSwitchIgnoredTold, acting: Acting) -> None:
    acting.memory.switch_ignored_told = True


def _remember_topic_told(action: RememberTopicTold, acting: Acting) -> None:
    acting.memory.topic_told = action.reason


# ---------------------------------------------------------------- the topics
def _remember_topic_check(action: RememberTopicCheck, acting: Acting) -> None:
    acting.memory.topic = (action.memory_key, time.monotonic(), action.check)


def _create_owned_topic(action: CreateOwnedTopic, acting: Acting) -> None:
    """Create the internal topic and read the topics again (until its metadata shows,
    a few seconds at most); the check of what is there is remembered."""
    query = action.query
    error = create_topic(query.bootstrap, query.kafka_settings, action.wanted)
    facts = read_topic_facts(query)
    if error is not None:
        if isinstance(facts, TopicFacts) and facts.owned_partitions is None:
            facts = replace(facts, owned_why=f"creating it failed: {error}")
    else:
        acting.tell(action.created)
        for _ in range(10):
            if not isinstance(facts, TopicFacts) or facts.owned_partitions is not None:
                break
            time.sleep(0.5)
            facts = read_topic_facts(query)
    acting.memory.topic = (query.memory_key, time.monotonic(), topic_check(query, facts))


def _delete_owned_topic(action: DeleteOwnedTopic, acting: Acting) -> None:
    error = delete_topic(action.bootstrap, action.kafka_settings, action.topic)
    if error is not None:
        log.error("%s: %s", action.refused, error)
        acting.stopped = True  # the finalizer stays: the next pass tries again
        return
    acting.tell(action.deleted)


# ------------------------------------------------------- the pipeline object
def _set_finalizer(action: SetFinalizer, acting: Acting) -> None:
    kube, ns, name = acting.kube, acting.namespace, acting.name
    if not action.guarded:
        kube.set_finalizer(ns, name, action.finalizer, present=action.present)
        return
    acting.version = kube.set_finalizer(
        ns, name, action.finalizer, present=action.present, resource_version=acting.version
    )


def _release_taint_finalizer(action: ReleaseTaintFinalizer, acting: Acting) -> None:
    if not acting.tainted:
        _set_finalizer(SetFinalizer(names.FINALIZER_TAINTS, present=False), acting)


def _write_handover_record(action: WriteHandoverRecord, acting: Acting) -> None:
    if action.fault_point:
        faults.maybe_stop("operator-before-handover-record")
    acting.version = acting.kube.patch_status(
        acting.namespace, acting.name, action.record, resource_version=acting.version
    )


# -------------------------------------------------------------- workers
def _create_worker(action: CreateWorker, acting: Acting) -> None:
    acting.step_awaits_watch = True
    if acting.kube.create_pod(action.pod):
        acting.tell(action.created)


def _delete_workers(action: DeleteWorkers, acting: Acting) -> None:
    acting.step_awaits_watch = True
    for pod, uid in action.pods:
        acting.kube.delete_pod(action.namespace, pod, action.force, uid)
    if action.deleted is not None:
        acting.tell(action.deleted)


def _fence_worker_lease(action: FenceWorkerLease, acting: Acting) -> None:
    if acting.kube.fence_lease(action.namespace, action.lease, action.resource_version):
        acting.step_held = True
        acting.tell(action.fenced)


def _count_handover_begun(action: CountHandoverBegun, acting: Acting) -> None:
    operator_metrics.FAILOVERS_STARTED.labels(action.namespace, action.name, action.reason).inc()
    acting.step_held = True  # its record is written: the next step may follow at once


def _count_handover_completed(action: CountHandoverCompleted, acting: Acting) -> None:
    ns, name, p = action.namespace, action.name, str(action.partition)
    operator_metrics.FAILOVERS.labels(ns, name, action.reason).inc()
    operator_metrics.FAILOVER_SECONDS.labels(action.reason).observe(action.steps.get(READY, 0.0))
    for step_name, at in action.steps.items():
        operator_metrics.FAILOVER_STEP_SECONDS.labels(ns, name, p, step_name).set(at)


# ---------------------------------------------------------------- nodes
def _mark_out_of_service(action: MarkOutOfService, acting: Acting) -> None:
    if acting.kube.taint_out_of_service(action.node, action.mark):
        acting.step_held = True
        acting.tell(action.marked)
    elif action.node in acting.tainted:  # someone else's taint got there first
        acting.tainted.remove(action.node)


def _lift_out_of_service(action: LiftOutOfService, acting: Acting) -> None:
    if acting.kube.release_out_of_service(action.node, action.mark):
        acting.tell(action.lifted)


APPLIERS: dict[type[Any], Callable[[Any, Acting], None]] = {
    Tell: _tell,
    Note: _note,
    EnsureObject: _ensure_object,
    ReplaceRoleRules: _replace_role_rules,
    ReplaceDisruptionBudget: _replace_disruption_budget,
    ApplyAuditSchedule: _apply_audit_schedule,
    DeleteAuditObject: _delete_audit_object,
    RememberObjectsEnsured: _remember_objects_ensured,
    CreateVolumeClaim: _create_volume_claim,
    ResizeVolumeClaim: _resize_volume_claim,
    AdoptAuditResult: _adopt_audit_result,
    CountAuditResult: _count_audit_result,
    RememberAuditUnreadable: _remember_audit_unreadable,
    RememberSwitchIgnoredTold: _remember_switch_ignored_told,
    RememberTopicTold: _remember_topic_told,
    RememberTopicCheck: _remember_topic_check,
    CreateOwnedTopic: _create_owned_topic,
    DeleteOwnedTopic: _delete_owned_topic,
    SetFinalizer: _set_finalizer,
    ReleaseTaintFinalizer: _release_taint_finalizer,
    WriteHandoverRecord: _write_handover_record,
    CreateWorker: _create_worker,
    DeleteWorkers: _delete_workers,
    FenceWorkerLease: _fence_worker_lease,
    CountHandoverBegun: _count_handover_begun,
    CountHandoverCompleted: _count_handover_completed,
    MarkOutOfService: _mark_out_of_service,
    LiftOutOfService: _lift_out_of_service,
}
