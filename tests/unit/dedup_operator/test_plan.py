"""The decide step of a reconcile pass (dedup_operator.plan), from observations built
by hand: what is persisted before acting, which actions run, which taints are lifted,
and the status composed at the end. Pure: no cluster, no clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dedup_contract import names
from dedup_contract.handover import HandoverReason
from dedup_contract.release import VERSION
from dedup_operator.desired.partition import template_hash
from dedup_operator.failover import (
    CreatePod,
    FenceLease,
    LeaseView,
    NodeView,
    PodView,
    Steady,
)
from dedup_operator.node_marks import taint_mark
from dedup_operator.observe import PipelineObservation
from dedup_operator.plan import plan_pass
from dedup_operator.spec import PipelineSpec
from dedup_operator.status import pipeline_status
from dedup_operator.status_records import WorkerCounters
from dedup_operator.topics import TopicCheck

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
TOPIC_OK = TopicCheck(True, "TopicFound", "input topic has 2 partitions", 2)
US = taint_mark("analytics", "events")


def spec() -> PipelineSpec:
    return PipelineSpec.parse(
        "events",
        "analytics",
        {
            "kafka": {
                "bootstrapServers": "kafka:9092",
                "inputTopic": "events",
                "outputTopic": "events-deduped",
                "deadLetterTopic": "events-dlq",
            },
            "partitions": 2,
            "messageId": {"source": "jsonField", "field": "messageId"},
            "window": {"duration": "1h"},
            "storage": {"size": "1Gi"},
            "failover": {"leaseDuration": "10s", "nodeLostAfter": "20s"},
        },
    )


def node(name: str, up: bool = True, **kw: Any) -> NodeView:
    return NodeView(
        name=name,
        ready="True" if up else "Unknown",
        ready_since=NOW - timedelta(hours=1),
        heartbeat_age=timedelta(seconds=1 if up else 60),
        heartbeat_stale=not up,
        **kw,
    )


def worker(p: int, epoch: int, on: str, ready: bool = True) -> PodView:
    return PodView(
        name=names.worker_pod("events", p, epoch),
        epoch=epoch,
        node=on,
        phase="Running",
        ready=ready,
        spec_hash=template_hash(spec(), p),
        ip=f"127.0.1.{p + 1}",
    )


def lease(p: int, epoch: int, unchanged_s: float = 1.0) -> tuple[str, LeaseView]:
    return names.lease("events", p), LeaseView(
        holder=names.worker_pod("events", p, epoch),
        epoch=epoch,
        duration=timedelta(seconds=10),
        unchanged_for=timedelta(seconds=unchanged_s),
        resource_version=f"rv{p}",
    )


def observation(**kw: Any) -> PipelineObservation:
    base: dict[str, Any] = {
        "spec": spec(),
        "generation": 1,
        "previous": {},
        "claims": {},
        "pods": {0: (worker(0, 1, "n1"),), 1: (worker(1, 1, "n2"),)},
        "leases": dict([lease(0, 1), lease(1, 1)]),
        "nodes": {n: node(n) for n in ("n1", "n2", "n3")},
        "attachments": (),
        "topic": TOPIC_OK,
    }
    base.update(kw)
    return PipelineObservation(**base)


def test_steady_pipeline_persists_nothing_and_acts_on_nothing() -> None:
    plan = plan_pass(observation(), NOW)
    assert plan.record is None
    assert not plan.set_finalizer
    assert all(isinstance(s.action, Steady) and not s.events for s in plan.steps)
    assert [plan.partitions[p].ready for p in (0, 1)] == [True, True]


def test_a_pod_waits_for_its_input_topic_and_says_so() -> None:
    missing = TopicCheck(False, "TopicMissing", "input topic events not found")
    plan = plan_pass(observation(pods={}, topic=missing, leases={}), NOW)
    assert [s.action for s in plan.steps] == [s.decision.action for s in plan.steps]  # leases
    first_start = observation(
        pods={},
        topic=missing,
        leases={
            names.lease("events", p): LeaseView(None, 0, timedelta(seconds=10), free=True)
            for p in (0, 1)
        },
    )
    plan = plan_pass(first_start, NOW)
    assert all(isinstance(s.decision.action, CreatePod) for s in plan.steps)
    assert all(s.action is None for s in plan.steps), "no pod before the topic exists"
    assert plan.partitions[0].waiting_for == "input topic (TopicMissing)"


def test_a_lost_node_is_recorded_as_a_handover_before_anything_is_done() -> None:
    nodes = {"n1": node("n1", up=False), "n2": node("n2"), "n3": node("n3")}
    plan = plan_pass(observation(nodes=nodes), NOW)
    step = plan.steps[0]
    assert step.decision.handover is not None
    assert step.decision.handover.reason == HandoverReason.NODE_LOST
    assert plan.record is not None, "the handover is persisted before acting"
    assert plan.record["partitions"][0]["handover"]["fromNode"] == "n1"
    assert [e[1] for e in step.events] == ["FailoverStarted"]
    assert plan.steps[1].action == Steady()


def test_the_lease_is_fenced_once_it_ran_out_on_the_operators_clock() -> None:
    nodes = {"n1": node("n1", up=False), "n2": node("n2"), "n3": node("n3")}
    begun = plan_pass(observation(nodes=nodes), NOW)
    assert begun.record is not None
    later = observation(
        nodes=nodes,
        previous=begun.record,
        leases=dict([lease(0, 1, unchanged_s=11), lease(1, 1)]),
    )
    plan = plan_pass(later, NOW + timedelta(seconds=11))
    assert isinstance(plan.steps[0].action, FenceLease)
    assert plan.steps[0].action.resource_version == "rv0"


def test_our_taint_is_lifted_from_a_node_back_without_our_volumes_others_forgotten() -> None:
    nodes = {
        "n1": node("n1"),
        "n2": node("n2"),
        "n3": node("n3", out_of_service=True, tainted_by=(US,)),
        "n4": node("n4", out_of_service=True),  # someone else's taint: never ours to lift
    }
    previous = {"taintedNodes": ["n3", "n4", "gone"]}
    plan = plan_pass(observation(nodes=nodes, previous=previous), NOW)
    assert plan.lift == ("n3",)
    assert set(plan.forget) == {"n4", "gone"}
    assert plan.record is None


def test_our_taint_stays_while_one_of_our_volumes_is_attached_there() -> None:
    nodes = {
        "n1": node("n1"),
        "n2": node("n2"),
        "n3": node("n3", out_of_service=True, tainted_by=(US,)),
    }
    claims = {"events-p0": {"spec": {"volumeName": "pv-0"}}}
    attached = [
        {
            "metadata": {"name": "csi-1"},
            "spec": {"nodeName": "n3", "source": {"persistentVolumeName": "pv-0"}},
            "status": {"attached": True},
        }
    ]
    plan = plan_pass(
        observation(
            nodes=nodes, previous={"taintedNodes": ["n3"]}, claims=claims, attachments=attached
        ),
        NOW,
    )
    assert plan.lift == () and plan.forget == ()


def test_status_sums_the_workers_counters_and_keeps_the_tainted_list_given() -> None:
    obs = observation()
    plan = plan_pass(obs, NOW)
    counters = {
        0: WorkerCounters(duplicates=3, records_in=100, records_out=97, lag=5),
        1: WorkerCounters(duplicates=1, records_in=50, records_out=49, lag=0),
    }
    status = pipeline_status(obs, plan, counters, ["n9"], None, None, NOW)
    assert (status["recordsIn"], status["recordsOut"], status["duplicatesDropped"]) == (
        150,
        146,
        4,
    )
    assert status["consumerLag"] == 5
    assert status["taintedNodes"] == ["n9"]
    assert status["phase"] == "Running" and status["readyPartitions"] == 2
    assert [p["lag"] for p in status["partitions"]] == [5, 0]
    assert "lastReconciliation" not in status


def test_a_worker_that_refused_a_newer_releases_store_is_the_condition_store_too_new() -> None:
    refusal = "store at /var/lib/dedup/store has format 3, written by release 0.3.0; ..."
    refused = replace(worker(1, 1, "n2", ready=False), store_too_new=refusal)
    obs = observation(pods={0: (worker(0, 1, "n1"),), 1: (refused,)})
    status = pipeline_status(obs, plan_pass(obs, NOW), {}, [], None, None, NOW)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["StoreTooNew"]["status"] == "True"
    assert conditions["StoreTooNew"]["reason"] == "StoreTooNew"
    assert conditions["StoreTooNew"]["message"] == f"p1: {refusal}"
    assert (
        conditions["Degraded"]["status"] == "True" and refusal in conditions["Degraded"]["message"]
    )
    assert status["phase"] == "Degraded"
    healthy = observation()  # the condition goes once no worker refuses its store
    status = pipeline_status(healthy, plan_pass(healthy, NOW), {}, [], None, None, NOW)
    assert "StoreTooNew" not in {c["type"] for c in status["conditions"]}
    assert status["operatorVersion"] == VERSION


def test_the_next_pass_is_due_at_once_after_acting_else_when_a_wait_runs_out() -> None:
    assert plan_pass(observation(), NOW).requeue_after(NOW) is None, "steady: the interval"
    nodes = {"n1": node("n1", up=False), "n2": node("n2"), "n3": node("n3")}
    begun = plan_pass(observation(nodes=nodes), NOW)
    assert begun.requeue_after(NOW) == 0.0, "a handover recorded: its next step at once"
    waiting = plan_pass(
        observation(nodes=nodes, previous=begun.record, leases=dict([lease(0, 1, 4), lease(1, 1)])),
        NOW,
    )
    assert isinstance(waiting.steps[0].action, Steady)
    assert waiting.requeue_after(NOW) == 6.0, "when the old worker's Lease runs out"


def test_a_steady_pipeline_rests_on_its_workers_nodes_and_a_waiting_one_does_not() -> None:
    steady = observation()
    rest = plan_pass(steady, NOW).rest(steady)
    assert rest is not None, "nothing pending: at rest"
    assert dict(rest.nodes) == {"n1": 1.0, "n2": 1.0}, "its workers' nodes, silent 1 s each"
    assert rest.lost_after_s == 20.0
    nodes = {"n1": node("n1", up=False), "n2": node("n2"), "n3": node("n3")}
    begun_obs = observation(nodes=nodes)
    begun = plan_pass(begun_obs, NOW)
    assert begun.rest(begun_obs) is None, "a handover recorded: busy"
    waiting_obs = observation(
        nodes=nodes, previous=begun.record, leases=dict([lease(0, 1, 4), lease(1, 1)])
    )
    assert plan_pass(waiting_obs, NOW).rest(waiting_obs) is None, "waiting for a Lease: busy"
    starting = observation(pods={0: (worker(0, 1, "n1", ready=False),), 1: ()})
    assert plan_pass(starting, NOW).rest(starting) is None, "a worker to create: busy"


def test_a_completion_recorded_but_not_told_is_told_by_the_next_pass() -> None:
    last = {
        "reason": "NodeLost",
        "fromEpoch": 1,
        "fromPod": "events-p0-e1",
        "fromNode": "n1",
        "steps": {"fenced": 5.0, "ready": 12.5},
        "toPod": "events-p0-e2",
        "told": False,  # persisted before acting; the pass stopped before its status
    }
    previous = {"partitions": [{"partition": 0, "lastHandover": last}]}
    obs = observation(previous=previous)
    plan = plan_pass(obs, NOW)
    told = [e for e in plan.steps[0].events if e[1] == "FailoverCompleted"]
    assert told == [
        (
            "Normal",
            "FailoverCompleted",
            "partition 0: events-p0-e2 is Ready after 12.5s (fenced 5.0s, ready 12.5s)",
        )
    ]
    status = pipeline_status(obs, plan, {}, [], None, None, NOW)
    assert status["partitions"][0]["lastHandover"]["told"] is True
    again = plan_pass(observation(previous=status), NOW)
    assert not any(e[1] == "FailoverCompleted" for s in again.steps for e in s.events)


def test_a_completed_failover_is_counted_in_the_record_written_before_acting() -> None:
    """The record ends the handover; a pass killed after writing it (or whose final
    status write conflicts) never decides the completion again, so the count of
    failovers goes with the record, not only with the status at the end of the pass."""
    handover = {
        "reason": "NodeLost",
        "started": "2026-11-23T11:59:40Z",
        "fromEpoch": 1,
        "fromPod": "events-p0-e1",
        "fromNode": "n1",
        "steps": {"fenced": 5.0, "released": 6.0},
    }
    previous = {
        "failovers": 3,
        "partitions": [{"partition": 0, "epoch": 1, "handover": handover}],
    }
    pods = {0: (worker(0, 2, "n3"),), 1: (worker(1, 1, "n2"),)}
    obs = observation(previous=previous, pods=pods, leases=dict([lease(0, 2), lease(1, 1)]))
    plan = plan_pass(obs, NOW)
    assert plan.record is not None
    assert plan.record["failovers"] == 4 == plan.failovers
    assert plan.record["partitions"][0].get("handover") is None
    after_kill = plan_pass(observation(previous=plan.record, pods=pods), NOW)
    assert after_kill.failovers == 4, "the restarted pass keeps the count, adds nothing"
    assert after_kill.record is None
