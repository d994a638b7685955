"""The decide step's actions (dedup_operator.plan): the pipeline's own objects, volume
claims, audit schedule and result, the internal topic, a partition's decision and the
Events each goes with, in the order the act step applies them. Pure: `now` and what the
process remembers (`memory.Recalled`) are given."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from test_plan import NOW, node, observation

from dedup_contract import names
from dedup_operator.actions import (
    AdoptAuditResult,
    ApplyAuditSchedule,
    CountHandoverBegun,
    CreateOwnedTopic,
    CreateVolumeClaim,
    DeleteAuditObject,
    DeleteOwnedTopic,
    DeleteWorkers,
    EnsureObject,
    LiftOutOfService,
    Note,
    PassAction,
    RememberAuditUnreadable,
    RememberObjectsEnsured,
    RememberTopicTold,
    ReplaceRoleRules,
    ResizeVolumeClaim,
    SetFinalizer,
    Tell,
    TopicQuery,
    WriteHandoverRecord,
)
from dedup_operator.memory import Recalled
from dedup_operator.observe import AuditSeen, DeletedPipeline, InvalidSpec, MissingOwnedTopic
from dedup_operator.plan import plan_finalize, plan_invalid, plan_pass
from dedup_operator.plan_objects import objects_applied
from dedup_operator.settings import ReconcileSettings
from dedup_operator.spec import PipelineSpec
from dedup_operator.topics import OwnedTopicSettings, TopicCheck

CLAIMS = {names.volume_claim("events", p): {"spec": {"volumeName": f"pv-{p}"}} for p in (0, 1)}
ENSURED = Recalled(ensured=(1, 5.0))  # generation 1, ensured 5 s ago


def kinds(actions: tuple[PassAction, ...] | list[PassAction]) -> list[str]:
    return [type(a).__name__ for a in actions]


def told(actions: tuple[PassAction, ...]) -> list[str]:
    return [a.event[1] for a in actions if isinstance(a, Tell)]


def audited(**reconciliation: Any) -> PipelineSpec:
    return PipelineSpec.parse(
        "events",
        "analytics",
        {
            "kafka": {"bootstrapServers": "kafka:9092", "inputTopic": "e", "outputTopic": "o"},
            "partitions": 2,
            "messageId": {"source": "jsonField", "field": "messageId"},
            "window": {"duration": "1h"},
            "storage": {"size": "1Gi"},
            "reconciliation": {"schedule": "0 3 * * *", "lookback": "36h", **reconciliation},
        },
    )


def test_the_pipelines_objects_are_ensured_on_a_spec_change_and_every_ensure_s() -> None:
    first_obs = observation(claims=CLAIMS)
    first = plan_pass(first_obs, NOW)
    assert kinds(first.actions)[:3] == ["EnsureObject"] * 3
    digest = objects_applied(first_obs)
    assert RememberObjectsEnsured(1, digest) in first.actions, "written: with their digest"
    assert not any(
        isinstance(a, EnsureObject)
        for a in plan_pass(observation(claims=CLAIMS, recalled=ENSURED), NOW).actions
    ), "ensured 5 s ago, for this generation"
    stale = observation(claims=CLAIMS, recalled=Recalled(ensured=(1, 31.0)))
    assert RememberObjectsEnsured(1) in plan_pass(stale, NOW).actions
    every_10s = ReconcileSettings(ensure_s=10.0)
    again = plan_pass(
        observation(claims=CLAIMS, recalled=Recalled(ensured=(1, 11.0))), NOW, every_10s
    )
    assert RememberObjectsEnsured(1) in again.actions
    changed = observation(claims=CLAIMS, recalled=ENSURED, generation=2)
    assert RememberObjectsEnsured(2, objects_applied(changed)) in plan_pass(changed, NOW).actions


def test_a_new_process_writes_nothing_where_the_status_records_what_it_would_write() -> None:
    """A restarted operator or a new leader (nothing remembered): the status's digest
    of the objects as last written equals its own, so no write, only the remembering;
    a digest of other objects (another operator version, another spec) writes them."""
    fresh = observation(claims=CLAIMS)
    recorded = observation(claims=CLAIMS, previous={"objectsApplied": objects_applied(fresh)})
    plan = plan_pass(recorded, NOW)
    assert not any(isinstance(a, (EnsureObject, ReplaceRoleRules)) for a in plan.actions)
    assert RememberObjectsEnsured(1) in plan.actions
    other = plan_pass(observation(claims=CLAIMS, previous={"objectsApplied": "0" * 16}), NOW)
    assert any(isinstance(a, ReplaceRoleRules) for a in other.actions)
    assert objects_applied(fresh) != objects_applied(observation(claims=CLAIMS, spec=audited())), (
        "the scheduled audit's objects count"
    )


def test_a_spec_change_without_reconciliation_deletes_the_audit_objects() -> None:
    changed = plan_pass(observation(claims=CLAIMS, recalled=Recalled(ensured=(0, 1.0))), NOW)
    deleted = [a.kind for a in changed.actions if isinstance(a, DeleteAuditObject)]
    assert deleted == [
        "CronJob",
        "ScheduledSparkApplication",
        "RoleBinding",
        "Role",
        "ServiceAccount",
    ]
    timed = plan_pass(observation(claims=CLAIMS, recalled=Recalled(ensured=(1, 60.0))), NOW)
    assert not any(isinstance(a, DeleteAuditObject) for a in timed.actions), "spec changes only"


def test_the_audit_is_scheduled_by_cron_job_or_by_the_spark_operator() -> None:
    cron = plan_pass(observation(spec=audited(), claims=CLAIMS), NOW)
    applied = [a.body["kind"] for a in cron.actions if isinstance(a, ApplyAuditSchedule)]
    assert applied == ["CronJob"]
    assert not any(isinstance(a, DeleteAuditObject) for a in cron.actions)
    on_k8s = audited(spark={"master": "k8s"})
    spark = plan_pass(observation(spec=on_k8s, claims=CLAIMS, spark_operator=True), NOW)
    applied = [a.body["kind"] for a in spark.actions if isinstance(a, ApplyAuditSchedule)]
    assert applied == ["ScheduledSparkApplication"]
    assert [a.kind for a in spark.actions if isinstance(a, DeleteAuditObject)] == ["CronJob"]


def test_volume_claims_are_created_or_grown_each_told() -> None:
    small = {"spec": {"resources": {"requests": {"storage": "500Mi"}}, "volumeName": "pv-1"}}
    plan = plan_pass(
        observation(claims={names.volume_claim("events", 1): small}, recalled=ENSURED), NOW
    )
    created = [a for a in plan.actions if isinstance(a, CreateVolumeClaim)]
    assert [a.created for a in created] == [
        ("Normal", "VolumeCreated", "partition 0: created PVC events-p0")
    ]
    grown = [a for a in plan.actions if isinstance(a, ResizeVolumeClaim)]
    assert [(a.name, a.size, a.resized) for a in grown] == [
        ("events-p1", "1Gi", ("Normal", "VolumeResized", "events-p1: 500Mi -> 1Gi"))
    ]


def test_the_internal_topic_is_created_before_anything_of_the_workers() -> None:
    query = TopicQuery("kafka:9092", {}, "events", "out", "t", False, 2, None, True, ())
    wanted = OwnedTopicSettings("analytics.events-owned", 2, 1, {"retention.ms": "-1"})
    missing = MissingOwnedTopic(query, wanted)
    plan = plan_pass(observation(claims=CLAIMS, owned_topic=missing), NOW)
    assert plan.observe_again and plan.steps == () and plan.record is None
    assert kinds(plan.actions)[-2:] == ["SetFinalizer", "CreateOwnedTopic"]
    assert plan.actions[-2] == SetFinalizer(names.FINALIZER_OWNED_TOPIC, present=True)
    create = plan.actions[-1]
    assert isinstance(create, CreateOwnedTopic) and create.created[1] == "OwnedTopicCreated"
    finalized = observation(
        claims=CLAIMS, owned_topic=missing, finalizers=frozenset({names.FINALIZER_OWNED_TOPIC})
    )
    assert kinds(plan_pass(finalized, NOW).actions)[-1:] == ["CreateOwnedTopic"]


def test_topic_ready_failing_is_told_as_an_error_when_its_reason_changes() -> None:
    missing = TopicCheck(False, "TopicMissing", "input topic events not found")
    plan = plan_pass(observation(claims=CLAIMS, recalled=ENSURED, topic=missing), NOW)
    assert [a for a in plan.actions if isinstance(a, Tell) and a.error] == [
        Tell(("Warning", "TopicMissing", "input topic events not found"), error=True)
    ]
    said = {"conditions": [{"type": "TopicReady", "status": "False", "reason": "TopicMissing"}]}
    again = plan_pass(
        observation(claims=CLAIMS, recalled=ENSURED, topic=missing, previous=said), NOW
    )
    assert not any(isinstance(a, Tell) and a.error for a in again.actions)


def test_topic_ready_failing_is_told_once_even_when_the_status_was_not_written() -> None:
    # the telling pass was abandoned on a Conflict: its status (TopicMissing) was not
    # written, the memory says it was told
    missing = TopicCheck(False, "TopicMissing", "input topic events not found")
    plan = plan_pass(observation(claims=CLAIMS, recalled=ENSURED, topic=missing), NOW)
    assert RememberTopicTold("TopicMissing") in plan.actions
    told_before = replace(ENSURED, topic_told="TopicMissing")
    again = plan_pass(observation(claims=CLAIMS, recalled=told_before, topic=missing), NOW)
    assert not any(isinstance(a, Tell) and a.error for a in again.actions)
    # ready again: the memory forgets, so the next failure is told
    ready = plan_pass(observation(claims=CLAIMS, recalled=told_before), NOW)
    assert RememberTopicTold(None) in ready.actions


def test_a_lost_node_is_recorded_before_the_handover_is_told_and_counted() -> None:
    nodes = {"n1": node("n1", up=False), "n2": node("n2"), "n3": node("n3")}
    plan = plan_pass(observation(nodes=nodes, claims=CLAIMS, recalled=ENSURED), NOW)
    assert kinds(plan.actions) == ["WriteHandoverRecord", "CountHandoverBegun", "Tell"]
    record = plan.actions[0]
    assert isinstance(record, WriteHandoverRecord) and record.fault_point
    assert plan.actions[1] == CountHandoverBegun("analytics", "events", "NodeLost")
    assert told(plan.actions) == ["FailoverStarted"]


def test_the_pipeline_running_is_told_once() -> None:
    plan = plan_pass(observation(claims=CLAIMS, recalled=ENSURED), NOW)
    assert told(plan.actions) == ["PipelineReady"]
    ran = plan_pass(
        observation(claims=CLAIMS, recalled=ENSURED, previous={"phase": "Running"}), NOW
    )
    assert told(ran.actions) == []


def test_the_audit_result_is_adopted_and_an_unreadable_one_told_once() -> None:
    config_map = {"metadata": {"name": "events-reconciliation"}, "data": {}}
    obs = observation(spec=audited(), claims=CLAIMS, recalled=ENSURED, audit=AuditSeen(config_map))
    plan = plan_pass(obs, NOW)
    adopt = next(a for a in plan.actions if isinstance(a, AdoptAuditResult))
    assert adopt.config_map == config_map and adopt.owner_reference["name"] == "events"
    key = names.RECONCILIATION_SUMMARY_KEY
    config_map = {"metadata": {"name": "events-reconciliation"}, "data": {key: "not json"}}
    obs = replace(obs, audit=AuditSeen(config_map))
    plan = plan_pass(obs, NOW)
    why = next(a.why for a in plan.actions if isinstance(a, RememberAuditUnreadable))
    assert why is not None and why.startswith("ConfigMap events-reconciliation")
    assert "ReconciliationUnreadable" in told(plan.actions)
    assert any(isinstance(a, Note) and a.level == logging.WARNING for a in plan.actions)
    remembered = replace(obs, recalled=Recalled(ensured=(1, 5.0), audit_unreadable=why))
    assert "ReconciliationUnreadable" not in told(plan_pass(remembered, NOW).actions)
    readable = replace(remembered, audit=AuditSeen(None))
    assert RememberAuditUnreadable(None) in plan_pass(readable, NOW).actions


def test_an_invalid_spec_is_told_once_per_generation() -> None:
    seen = InvalidSpec("analytics", "events", "spec.partitions: must be at least 1", 3, {})
    plan = plan_invalid(seen, NOW)
    assert told(plan.actions) == ["InvalidSpec"]
    assert plan.status["phase"] == "Failed" and plan.status["observedGeneration"] == 3
    again = plan_invalid(replace(seen, previous=plan.status), NOW)
    assert again.actions == () and again.status["phase"] == "Failed"


def test_a_deleted_pipeline_lifts_its_marks_and_deletes_its_topic_once_the_leases_ran_out() -> None:
    both = frozenset({names.FINALIZER_TAINTS, names.FINALIZER_OWNED_TOPIC})
    seen = DeletedPipeline(
        "analytics",
        "events",
        both,
        "analytics.events-owned",
        marked_nodes=("n1",),
        workers=(("events-p0-e1", "u0"),),
        held_leases=("events-p0",),
    )
    waiting = plan_finalize(seen)
    assert not waiting.complete
    assert kinds(waiting.actions) == ["LiftOutOfService", "SetFinalizer", "DeleteWorkers", "Note"]
    lift = waiting.actions[0]
    assert isinstance(lift, LiftOutOfService) and lift.lifted == (
        "Normal",
        "NodeBackInService",
        "removed the out-of-service taint from n1 (pipeline deleted)",
    )
    delete = waiting.actions[2]
    assert isinstance(delete, DeleteWorkers) and not delete.force and delete.deleted is None
    note = waiting.actions[3]
    assert isinstance(note, Note) and note.message == (
        "analytics/events deleted: waiting for the Leases events-p0 to run out before "
        "deleting its internal topic"
    )
    ready = replace(seen, marked_nodes=(), workers=(), held_leases=(), kafka_settings={})
    done = plan_finalize(ready)
    assert done.complete
    assert kinds(done.actions) == ["SetFinalizer", "DeleteOwnedTopic", "SetFinalizer"]
    topic = done.actions[1]
    assert isinstance(topic, DeleteOwnedTopic) and topic.deleted[1] == "OwnedTopicDeleted"
    assert done.actions[2] == SetFinalizer(names.FINALIZER_OWNED_TOPIC, False, guarded=False)
    unreadable = plan_finalize(replace(ready, settings_error="Secret s (key k) not found"))
    assert not unreadable.complete and isinstance(unreadable.actions[-1], Note)
    assert unreadable.actions[-1].level == logging.ERROR
