"""Which ownership generation a pipeline's workers run
(dedup_operator.ownership_generation), and what the reconcile pass's plan does with it:
status.ownership recorded before the first worker, ReshardPending for a changed
spec.partitions, OwnershipOff for a pipeline that ran before ownership."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from test_plan import NOW, observation
from test_plan import spec as plan_spec

from dedup_contract import names
from dedup_contract.ownership_status import ran_before
from dedup_operator.failover import CreatePod, LeaseView
from dedup_operator.ownership_generation import OWNERSHIP_OFF, RESHARD_PENDING, decide
from dedup_operator.plan import plan_pass
from dedup_operator.spec import PipelineSpec
from dedup_operator.status import pipeline_status
from dedup_operator.topics import TopicCheck

BODY: dict[str, Any] = {
    "kafka": {"bootstrapServers": "k:9092", "inputTopic": "in", "outputTopic": "out"},
    "partitions": 2,
    "messageId": {"source": "key"},
    "window": {"duration": "1h"},
}


def spec(partitions: int = 2) -> PipelineSpec:
    return PipelineSpec.parse("events", "analytics", {**BODY, "partitions": partitions})


def test_a_new_pipeline_gets_ownership_with_spec_partitions_workers() -> None:
    state = decide(spec(3), {})
    assert state.spec.ownership and state.spec.workers == 3
    assert state.to_record == {"workers": 3, "reshards": 0}
    assert state.recorded is None and state.condition is None
    # a status from passes that never started a worker (the topic was missing) is new too
    waiting = {"partitions": [{"partition": 0, "epoch": 0, "phase": "Missing"}]}
    assert not ran_before(waiting)
    assert decide(spec(3), waiting).to_record == {"workers": 3, "reshards": 0}


def test_the_recorded_generation_is_what_runs() -> None:
    previous = {"ownership": {"workers": 2, "reshards": 0}, "partitions": [{"partition": 0,
                "epoch": 1, "pod": "events-p0-e1"}]}  # fmt: skip
    same = decide(spec(2), previous)
    assert same.spec.workers == 2 and same.condition is None and same.to_record is None
    assert same.recorded == {"workers": 2, "reshards": 0}


def test_a_changed_worker_count_is_reshard_pending_and_changes_nothing() -> None:
    state = decide(spec(4), {"ownership": {"workers": 2, "reshards": 0}})
    assert state.spec.workers == 2 and state.spec.ownership
    c = state.condition
    assert c is not None and (c.type, c.status, c.reason) == (
        RESHARD_PENDING,
        True,
        "WorkerCountFixed",
    )
    assert "spec.partitions is 4, the pipeline runs 2 workers" in c.message
    assert "cannot change yet" in c.message and "input topic can grow freely" in c.message


def test_a_pipeline_that_ran_before_ownership_is_not_switched() -> None:
    ran = {"phase": "Running", "partitions": [{"partition": 1, "epoch": 3}]}
    state = decide(spec(2), ran)
    assert not state.spec.ownership and state.spec.partitions == 2
    assert state.to_record is None and state.recorded == {"enabled": False}
    c = state.condition
    assert c is not None and (c.type, c.status, c.reason) == (
        OWNERSHIP_OFF,
        True,
        "PreOwnershipPipeline",
    )
    for part in ("keys records by the id with Kafka's murmur2", "exactly spec.partitions (2)",
                 "dedupctl switch-ownership events -n analytics", "One way"):  # fmt: skip
        assert part in c.message


def free_leases() -> dict[str, LeaseView]:
    return {
        names.lease("events", p): LeaseView(None, 0, timedelta(seconds=10), free=True)
        for p in (0, 1)
    }


def test_ownership_is_recorded_before_the_first_worker_is_created() -> None:
    state = decide(spec(2), {})
    first = observation(spec=state.spec, pods={}, leases=free_leases(), ownership=state)
    plan = plan_pass(first, NOW)
    assert any(isinstance(s.action, CreatePod) for s in plan.steps)
    assert plan.record is not None
    assert plan.record["ownership"] == {"workers": 2, "reshards": 0}
    status = pipeline_status(first, plan, {}, [], None, None, NOW)
    assert status["ownership"] == {"workers": 2, "reshards": 0}


def test_nothing_is_recorded_while_no_worker_can_start() -> None:
    state = decide(spec(2), {})
    missing = TopicCheck(False, "OwnedTopicMissing", "internal topic x does not exist",
                         2, ownership=True, blocks=True)  # fmt: skip
    waiting = observation(
        spec=state.spec, pods={}, leases=free_leases(), ownership=state, topic=missing
    )
    plan = plan_pass(waiting, NOW)
    assert all(s.action is None for s in plan.steps)
    assert plan.record is None or "ownership" not in plan.record
    assert plan.partitions[0].waiting_for == "internal topic (OwnedTopicMissing)"
    assert "ownership" not in pipeline_status(waiting, plan, {}, [], None, None, NOW)


def test_under_ownership_every_worker_starts_whatever_the_input_partitions() -> None:
    state = decide(spec(2), {})
    one_partition = TopicCheck(True, "TopicFound", "input has 1 partition", 1, ownership=True)
    obs = observation(
        spec=state.spec, pods={}, leases=free_leases(), ownership=state, topic=one_partition
    )
    plan = plan_pass(obs, NOW)
    assert [isinstance(s.action, CreatePod) for s in plan.steps] == [True, True]
    # without ownership worker p needs input partition p
    old = TopicCheck(True, "TopicFound", "input has 1 partition", 1)
    plan = plan_pass(observation(pods={}, leases=free_leases(), topic=old), NOW)
    assert [isinstance(s.action, CreatePod) for s in plan.steps] == [True, False]


def test_the_status_carries_reshard_pending_and_keeps_the_record() -> None:
    previous = {"ownership": {"workers": 2, "reshards": 0}}
    state = decide(replace(plan_spec(), partitions=5), previous)  # the workers' spec, grown
    obs = observation(spec=state.spec, previous=previous, ownership=state)
    plan = plan_pass(obs, NOW)
    assert plan.record is None  # the workers run on, nothing to persist
    assert all(s.action is None or not isinstance(s.action, CreatePod) for s in plan.steps)
    status = pipeline_status(obs, plan, {}, [], None, None, NOW)
    assert status["ownership"] == {"workers": 2, "reshards": 0}
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type[RESHARD_PENDING]["status"] == "True"
    assert by_type["Ready"]["message"] == "2/2 partitions ready"
    assert by_type["Degraded"]["status"] == "False"  # refused, not broken
    assert status["phase"] == "Running"


def test_the_status_of_a_pipeline_that_ran_before_ownership_says_ownership_is_off() -> None:
    previous = {"partitions": [{"partition": 0, "epoch": 1}, {"partition": 1, "epoch": 1}]}
    state = decide(spec(2), previous)
    obs = observation(spec=state.spec, previous=previous, ownership=state)
    status = pipeline_status(obs, plan_pass(obs, NOW), {}, [], None, None, NOW)
    assert status["ownership"] == {"enabled": False}  # recorded: the decision sticks
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type[OWNERSHIP_OFF]["status"] == "True"
    assert by_type[OWNERSHIP_OFF]["reason"] == "PreOwnershipPipeline"


def test_ownership_off_sticks_when_the_entries_it_was_read_from_are_gone() -> None:
    """Every pod gone: the next status has epoch 0 entries, but the record says off."""
    after = {"ownership": {"enabled": False}, "partitions": [{"partition": 0, "epoch": 0}]}
    state = decide(spec(2), after)
    assert not state.spec.ownership and state.recorded == {"enabled": False}
    assert state.condition is not None and state.condition.type == OWNERSHIP_OFF
    obs = observation(
        spec=state.spec, previous=after, ownership=state, pods={}, leases=free_leases()
    )
    plan = plan_pass(obs, NOW)
    assert plan.ownership == {"enabled": False}
    assert plan.record is None or plan.record["ownership"] == {"enabled": False}
    assert pipeline_status(obs, plan, {}, [], None, None, NOW)["ownership"] == {"enabled": False}
