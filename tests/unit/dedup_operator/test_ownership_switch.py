"""The one-step switch of an OwnershipOff pipeline to ownership
(dedup_operator.ownership_generation, and the plan's use of it): which phase the switch
is in, and the one rule it rests on — no worker starts under ownership before every old
worker is gone and fenced (an old and a new worker side by side would publish an id
twice). Passes are run by hand over
observations built here, each status written as the operator writes it (merge patch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from test_plan import NOW, lease, node, observation, spec, worker

from dedup_contract import names
from dedup_contract.handover import HandoverReason
from dedup_contract.ownership_status import OWNERSHIP_SWITCHING
from dedup_operator.desired.partition import template_hash, worker_env
from dedup_operator.failover import (
    BeginHandover,
    CreatePod,
    DeletePods,
    FenceLease,
    LeaseView,
    PodView,
    Steady,
)
from dedup_operator.ownership_generation import (
    OFF,
    OWNERSHIP_OFF,
    SWITCHING,
    HeldStart,
    SwitchPhase,
    decide,
)
from dedup_operator.plan import Plan, plan_pass
from dedup_operator.spec import PipelineSpec
from dedup_operator.status import pipeline_status
from dedup_operator.topics import TopicCheck

OFF_TOPIC = TopicCheck(True, "TopicFound", "input topic has 2 partitions", 2)
OWNED_TOPIC = TopicCheck(True, "TopicFound", "input and internal topic", 2, ownership=True)
RAN = {
    "phase": "Running",
    "partitions": [{"partition": p, "epoch": 1, "pod": f"events-p{p}-e1"} for p in (0, 1)],
}


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies the operator's status writes."""
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge_patch(out[k], v)
        else:
            out[k] = v
    return out


def off_worker(p: int, epoch: int, on: str, **kw: Any) -> PodView:
    """A worker as an OwnershipOff pipeline renders it."""
    return replace(
        worker(p, epoch, on), spec_hash=template_hash(replace(spec(), ownership=False), p), **kw
    )


def free(p: int, epoch: int) -> tuple[str, LeaseView]:
    return names.lease("events", p), LeaseView(None, epoch, timedelta(seconds=10), free=True)


def run(
    previous: Mapping[str, Any],
    pods: Mapping[int, tuple[PodView, ...]],
    leases: Mapping[str, LeaseView],
    asked: bool = True,
    topic: TopicCheck | None = None,
) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
    """One pass: its plan, the status it writes, and the status after both writes."""
    state = decide(spec(), previous, asked)
    if topic is None:
        topic = OWNED_TOPIC if state.spec.ownership else OFF_TOPIC
    obs = observation(
        spec=state.spec,
        previous=previous,
        ownership=state,
        pods=dict(pods),
        leases=dict(leases),
        topic=topic,
    )
    plan = plan_pass(obs, NOW)
    status = pipeline_status(obs, plan, {}, [], None, None, NOW)
    after = merge_patch(merge_patch(previous, plan.record or {}), status)
    return plan, status, after


def conditions(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def actions(plan: Plan) -> dict[int, Any]:
    return {s.partition: s.action for s in plan.steps}


RUNNING = {0: (off_worker(0, 1, "n1"),), 1: (off_worker(1, 1, "n2"),)}
HELD_LEASES = dict([lease(0, 1), lease(1, 1)])


# ------------------------------------------------------------------------------ phases
def test_the_annotation_on_an_ownership_off_pipeline_begins_the_switch() -> None:
    assert decide(spec(), RAN).switch is None  # not asked: off, as before
    state = decide(spec(), RAN, switch_asked=True)
    assert state.switch == SwitchPhase.BEGIN
    assert not state.spec.ownership and state.to_record == SWITCHING
    assert state.condition is not None and state.condition.type == OWNERSHIP_OFF
    # recorded: the workers are being stopped, whatever the annotation says now
    stopping = decide(spec(), {**RAN, "ownership": SWITCHING}, switch_asked=False)
    assert stopping.switch == SwitchPhase.STOPPING and not stopping.spec.ownership
    assert stopping.recorded == SWITCHING


def test_a_switched_pipeline_runs_under_ownership_with_the_switch_env_for_good() -> None:
    record = {"workers": 2, "reshards": 0, "switched": "2026-11-23T12:00:00Z"}
    starting = {**RAN, "ownership": record, "conditions": [
        {"type": OWNERSHIP_SWITCHING, "status": "True"}]}  # fmt: skip
    state = decide(spec(), starting, switch_asked=True)
    assert state.switch == SwitchPhase.STARTING and not state.switch_ignored
    assert state.spec.ownership and state.spec.ownership_switch and state.spec.workers == 2
    done = decide(spec(), {**RAN, "ownership": record}, switch_asked=True)
    assert done.switch is None and not done.switch_ignored  # the annotation may stay
    assert done.spec.ownership_switch  # kept: removing it would roll every pod


def test_the_annotation_on_a_pipeline_under_ownership_is_ignored() -> None:
    owned = decide(spec(), {**RAN, "ownership": {"workers": 2, "reshards": 0}}, True)
    assert owned.switch is None and owned.switch_ignored
    assert not owned.spec.ownership_switch
    new = decide(spec(), {}, switch_asked=True)  # a new pipeline gets ownership anyway
    assert new.switch is None and new.switch_ignored
    assert new.to_record == {"workers": 2, "reshards": 0}


def test_the_switch_env_is_rendered_only_for_switched_pipelines() -> None:
    def env(s: PipelineSpec) -> dict[str, str]:
        return {e["name"]: e.get("value", "") for e in worker_env(s, 0)}

    switched = replace(spec(), ownership_switch=True)
    assert env(switched)["DEDUP_OWNERSHIP_SWITCH"] == "true"
    assert env(switched)["DEDUP_OWNED_TOPIC"] == "analytics.events-owned"
    assert env(switched)["DEDUP_WORKERS"] == "2"
    assert "DEDUP_OWNERSHIP_SWITCH" not in env(spec())
    assert template_hash(switched, 0) != template_hash(spec(), 0)


# ------------------------------------------------------------------------ the passes
def test_begin_records_the_switch_and_every_handover_before_touching_a_worker() -> None:
    plan, status, after = run(RAN, RUNNING, HELD_LEASES)
    assert plan.record is not None and plan.record["ownership"] == SWITCHING
    for p, action in actions(plan).items():
        assert isinstance(action, BeginHandover), (p, action)
        assert action.handover.reason == HandoverReason.OWNERSHIP_SWITCH
        assert action.handover.from_pod == f"events-p{p}-e1"
    handovers = [e["handover"]["reason"] for e in plan.record["partitions"]]
    assert handovers == ["OwnershipSwitch", "OwnershipSwitch"]
    assert [e[1] for e in plan.events] == ["OwnershipSwitchStarted"]
    assert "the output pauses meanwhile" in plan.events[0][2]
    told = {e[1] for s in plan.steps for e in s.events}
    assert told == {"WorkerSwitchStarted"}  # planned: not a failover
    assert plan.failovers == 0
    by_type = conditions(status)
    assert by_type[OWNERSHIP_SWITCHING]["status"] == "True"
    assert by_type[OWNERSHIP_SWITCHING]["reason"] == "StoppingWorkers"
    assert by_type[OWNERSHIP_OFF]["status"] == "True"
    assert after["ownership"] == SWITCHING


def begun() -> dict[str, Any]:
    return run(RAN, RUNNING, HELD_LEASES)[2]


def test_stopping_deletes_every_worker_and_starts_none() -> None:
    plan, _, _ = run(begun(), RUNNING, HELD_LEASES, asked=False)
    for action in actions(plan).values():
        assert isinstance(action, DeletePods) and not action.force
    assert plan.events == () and (plan.record or {}).get("ownership") in (None, SWITCHING)


def test_no_worker_starts_while_one_old_worker_still_runs() -> None:
    """p0's worker is gone and its Lease free; p1's still runs: p0 is held, not started."""
    pods = {1: (off_worker(1, 1, "n2"),)}
    plan, status, _ = run(begun(), pods, dict([free(0, 1), lease(1, 1)]))
    a = actions(plan)
    assert isinstance(a[0], HeldStart) and isinstance(a[1], DeletePods)
    assert not any(isinstance(x, CreatePod) for x in a.values())
    assert "every worker of the pipeline to stop" in status["partitions"][0]["waitingFor"]
    assert (plan.record or {}).get("ownership") in (None, SWITCHING)


def test_no_worker_starts_while_an_old_workers_lease_may_still_be_held() -> None:
    """p1's pod is gone but its Lease was renewed a moment ago: that worker may still be
    committing (cut off from the API server, not from Kafka) until it runs out."""
    plan, _, _ = run(begun(), {}, dict([free(0, 1), lease(1, 1, unchanged_s=3)]))
    a = actions(plan)
    assert isinstance(a[0], HeldStart)
    assert type(a[1]) is Steady and "Lease held by events-p1-e1" in (a[1].waiting_for or "")
    assert "switched" not in ((plan.record or {}).get("ownership") or {})
    # run out on the operator's clock: cleared first (compare-and-set), still no start
    plan, _, _ = run(begun(), {}, dict([free(0, 1), lease(1, 1, unchanged_s=11)]))
    a = actions(plan)
    assert isinstance(a[1], FenceLease) and isinstance(a[0], HeldStart)
    assert "switched" not in ((plan.record or {}).get("ownership") or {})


def test_a_terminating_worker_still_counts_as_running() -> None:
    pods = {0: (off_worker(0, 1, "n1", deleting=True),)}
    plan, _, _ = run(begun(), pods, dict([free(0, 1), free(1, 1)]))
    a = actions(plan)
    assert type(a[0]) is Steady and isinstance(a[1], HeldStart)
    assert "switched" not in ((plan.record or {}).get("ownership") or {})


def stopped() -> dict[str, Any]:
    return run(begun(), {}, dict([free(0, 1), free(1, 1)]))[2]


def test_once_every_worker_is_stopped_ownership_is_recorded_and_still_none_starts() -> None:
    plan, status, after = run(begun(), {}, dict([free(0, 1), free(1, 1)]))
    assert all(isinstance(a, HeldStart) for a in actions(plan).values())
    assert plan.record is not None
    assert plan.record["ownership"] == {"workers": 2, "reshards": 0,
        "switched": "2026-11-23T12:00:00Z", "enabled": None, "switching": None}  # fmt: skip
    assert after["ownership"] == {"workers": 2, "reshards": 0, "switched": "2026-11-23T12:00:00Z"}
    assert status["ownership"] == after["ownership"]
    assert [e[1] for e in plan.events] == ["OwnershipSwitchWorkersStopped"]
    by_type = conditions(status)
    assert OWNERSHIP_OFF not in by_type and by_type[OWNERSHIP_SWITCHING]["status"] == "True"
    # the handovers stay, without a start: the next pass (under ownership) creates them
    assert all(e["handover"]["reason"] == "OwnershipSwitch" for e in after["partitions"])
    assert all("started" not in e["handover"]["steps"] for e in after["partitions"])


def test_starting_creates_every_worker_under_ownership_at_a_new_epoch() -> None:
    previous = stopped()
    # no internal topic yet: no worker starts (the pass created it first, if it could)
    missing = TopicCheck(False, "OwnedTopicMissing", "internal topic x does not exist",
                         2, ownership=True, blocks=True)  # fmt: skip
    plan, _, _ = run(previous, {}, dict([free(0, 1), free(1, 1)]), topic=missing)
    assert all(a is None for a in actions(plan).values())
    plan, status, after = run(previous, {}, dict([free(0, 1), free(1, 1)]))
    a = actions(plan)
    assert all(isinstance(x, CreatePod) and x.epoch == 2 for x in a.values()), a
    assert conditions(status)[OWNERSHIP_SWITCHING]["reason"] == "StartingWorkers"
    state = decide(spec(), previous)
    env = {e["name"]: e.get("value") for e in worker_env(state.spec, 1)}
    assert env["DEDUP_OWNERSHIP_SWITCH"] == "true"
    assert env["DEDUP_OWNED_TOPIC"] == "analytics.events-owned"

    # every new worker Ready: the handovers complete, then the switch is over
    new_hash = {p: template_hash(state.spec, p) for p in (0, 1)}
    pods = {p: (replace(worker(p, 2, f"n{p + 1}"), spec_hash=new_hash[p]),) for p in (0, 1)}
    leases = dict([lease(0, 2), lease(1, 2)])
    plan, status, after = run(after, pods, leases)
    assert {e[1] for s in plan.steps for e in s.events} == {"WorkerSwitchCompleted"}
    by_type = conditions(status)
    assert OWNERSHIP_SWITCHING not in by_type and OWNERSHIP_OFF not in by_type
    assert by_type["Ready"]["status"] == "True"
    assert decide(spec(), after).switch is None
    plan, status, after = run(after, pods, leases)  # and stays so
    assert all(isinstance(x, Steady) for x in actions(plan).values())
    assert OWNERSHIP_SWITCHING not in conditions(status) and plan.record is None


def test_a_roll_in_progress_finishes_its_pod_which_is_then_stopped_too() -> None:
    """A handover begun before the switch whose replacement (an old-style worker) exists:
    it completes, and that worker is stopped like the others before any new one starts."""
    rolling = {**RAN, "partitions": [RAN["partitions"][0], {"partition": 1, "epoch": 2,
        "handover": {"reason": "SpecChanged", "started": "2026-11-23T11:59:00Z",
                     "fromEpoch": 1, "fromPod": "events-p1-e1", "steps": {}}}]}  # fmt: skip
    pods = {0: (off_worker(0, 1, "n1"),), 1: (off_worker(1, 2, "n2", ready=False),)}
    plan, _, after = run(rolling, pods, dict([lease(0, 1), lease(1, 2)]))
    a = actions(plan)
    assert isinstance(a[0], BeginHandover) and type(a[1]) is Steady  # waits for p1-e2
    pods = {1: (off_worker(1, 2, "n2"),)}
    plan, _, after = run(after, pods, dict([free(0, 1), lease(1, 2)]))
    a = actions(plan)
    assert isinstance(a[0], HeldStart) and not isinstance(a[1], (CreatePod, HeldStart))
    assert "switched" not in after["ownership"]


def test_an_old_worker_on_a_lost_node_holds_the_switch() -> None:
    """Its pod cannot go until its node is back or the pod is force-deleted: the switch
    waits (no worker starts), as the deletion flow does."""
    pods = {1: (off_worker(1, 1, "n2", deleting=True),)}
    nodes = {"n1": node("n1"), "n2": node("n2", up=False)}
    state = decide(spec(), begun())
    obs = observation(spec=state.spec, previous=begun(), ownership=state, pods=pods,
                      leases=dict([free(0, 1), lease(1, 1, 30)]), nodes=nodes,
                      topic=OFF_TOPIC)  # fmt: skip
    plan = plan_pass(obs, NOW)
    assert not any(isinstance(s.action, CreatePod) for s in plan.steps)
    assert "switched" not in ((plan.record or {}).get("ownership") or {})
    assert OFF == {"enabled": False}


# -------------------------------------------------------------- dedupctl switch-ownership
def pipeline(status: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> Any:
    return {
        "metadata": {"name": "events", "namespace": "analytics",
                     "annotations": dict(annotations or {})},
        "spec": {"partitions": 2, "window": {"duration": "24h"},
                 "kafka": {"inputTopic": "in", "outputTopic": "out"}},
        "status": dict(status),
    }  # fmt: skip


def test_dedupctl_tells_where_a_pipeline_stands_with_ownership() -> None:
    from dedupctl import view as ctl_view

    asked = {names.ANNOTATION_SWITCH_TO_OWNERSHIP: "true"}
    assert ctl_view.switch_state(pipeline({**RAN, "ownership": OFF})) == "off"
    assert ctl_view.switch_state(pipeline(RAN)) == "off"  # before the operator recorded it
    assert ctl_view.switch_state(pipeline({**RAN, "ownership": OFF}, asked)) == "switching"
    assert ctl_view.switch_state(pipeline({**RAN, "ownership": SWITCHING})) == "switching"
    record = {"workers": 2, "reshards": 0, "switched": "2026-11-23T12:00:00Z"}
    switching = [{"type": OWNERSHIP_SWITCHING, "status": "True"}]
    assert (
        ctl_view.switch_state(pipeline({"ownership": record, "conditions": switching}))
        == "switching"
    )
    assert ctl_view.switch_state(pipeline({"ownership": record})) == "switched"
    assert ctl_view.switch_state(pipeline({"ownership": {"workers": 2}})) == "owned"
    assert ctl_view.switch_state(pipeline({})) == "owned"
    text = ctl_view.switch_plan_text(pipeline({**RAN, "ownership": OFF}))
    for part in ("every worker stops", "analytics.events-owned", "(24h)", "one way"):
        assert part in text, text


class FakeCluster:
    namespace = "analytics"

    def __init__(self, body: Any) -> None:
        self.body = body
        self.annotated: list[tuple[str, str, str]] = []

    def pipeline(self, name: str) -> Any:
        return self.body

    def annotate_pipeline(self, name: str, key: str, value: str) -> None:
        self.annotated.append((name, key, value))


def test_dedupctl_switch_ownership_needs_yes_and_sets_the_annotation(capsys: Any) -> None:
    import argparse

    import pytest

    from dedupctl import cli as ctl

    cluster = FakeCluster(pipeline({**RAN, "ownership": OFF}))
    with pytest.raises(SystemExit) as exit_:
        ctl.cmd_switch_ownership(cluster, argparse.Namespace(pipeline="events", yes=False))  # type: ignore[arg-type]
    assert exit_.value.code == ctl.USAGE and cluster.annotated == []
    out, err = capsys.readouterr()
    assert "every worker stops" in out
    assert err.strip().splitlines() == [
        "dedupctl: nothing done: add --yes to switch pipeline analytics/events to ownership"
    ]
    code = ctl.cmd_switch_ownership(cluster, argparse.Namespace(pipeline="events", yes=True))  # type: ignore[arg-type]
    assert code == ctl.OK
    assert cluster.annotated == [("events", "dedup.io/switch-to-ownership", "true")]
    owned = FakeCluster(pipeline({"ownership": {"workers": 2, "reshards": 0}}))
    assert ctl.cmd_switch_ownership(owned, argparse.Namespace(pipeline="events", yes=True)) == 0  # type: ignore[arg-type]
    assert owned.annotated == [] and "nothing to switch" in capsys.readouterr().out
    assert ctl.parser().parse_args(["switch-ownership", "events", "--yes"]).yes
