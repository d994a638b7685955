"""The act step (dedup_operator.executor): one applier per action type, and what the
appliers do with a write's outcome (an action's own Event only when the write did
something, a taint someone else's got to first off the list, the fault point before
the handover record, a refused topic deletion stopping the rest), over a STAND-IN for
the API server (support.fake_kube.FakeKube); the real one: tests/integration/test_operator*.py."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

import pytest
from test_reconcile_pass import pipeline_body

from dedup_contract import names
from dedup_operator import actions, executor
from dedup_operator.actions import (
    CreateWorker,
    DeleteOwnedTopic,
    FenceWorkerLease,
    MarkOutOfService,
    ReleaseTaintFinalizer,
    SetFinalizer,
    Tell,
    WriteHandoverRecord,
)
from dedup_operator.executor import APPLIERS, Acting, execute
from dedup_operator.memory import PipelineMemory
from support.fake_kube import FakeKube

TOLD = ("Normal", "Told", "something happened")


def test_every_action_type_has_exactly_one_applier() -> None:
    kinds = set(typing.get_args(actions.PassAction))
    assert kinds, "PassAction lists the action types"
    assert set(APPLIERS) == kinds
    assert len(set(APPLIERS.values())) == len(APPLIERS), "one applier per type"
    for kind, applier in APPLIERS.items():
        hints = typing.get_type_hints(applier, vars(executor))
        first = next(iter(hints.values()))
        assert first is kind, f"{applier.__name__} applies {first}, not {kind.__name__}"


def test_every_action_class_of_the_module_is_a_pass_action() -> None:
    declared = {
        obj
        for obj in vars(actions).values()
        if isinstance(obj, type) and obj.__module__ == actions.__name__
    }
    assert declared - {actions.TopicQuery} == set(typing.get_args(actions.PassAction))


class Kube(FakeKube):
    """A fake whose writes succeed or not as the test says."""

    def __init__(self, succeed: bool = True) -> None:
        super().__init__(pipeline_body())
        self.succeed = succeed

    def create_pod(self, body: Mapping[str, Any]) -> bool:
        self._write("create_pod", body["metadata"]["name"])
        return self.succeed

    def fence_lease(self, namespace: str, name: str, resource_version: str | None) -> bool:
        self._write("fence_lease", name, resource_version)
        return self.succeed

    def taint_out_of_service(self, node: str, owner: str) -> bool:
        self._write("taint_out_of_service", node, owner)
        return self.succeed


def acting(kube: Kube, tainted: tuple[str, ...] = ()) -> tuple[Acting, list[Any]]:
    told: list[Any] = []

    def record(type_: str, reason: str, message: str, error: bool = False) -> None:
        told.append((type_, reason, message, error))

    context = Acting(kube, record, PipelineMemory(), "analytics", "events", "10")
    context.tainted = list(tainted)
    return context, told


@pytest.mark.parametrize("succeed", [True, False])
def test_an_actions_own_event_is_told_only_when_its_write_did_something(succeed: bool) -> None:
    kube = Kube(succeed)
    context, told = acting(kube)
    pod = {"metadata": {"name": "events-p0-e1", "namespace": "analytics"}}
    assert execute(
        [CreateWorker(pod, TOLD), FenceWorkerLease("analytics", "events-p0", "rv", TOLD)],
        context,
    )
    assert len(told) == (2 if succeed else 0)
    assert context.applied == ["CreateWorker", "FenceWorkerLease"]


def test_a_taint_someone_elses_got_to_first_is_not_ours() -> None:
    context, told = acting(Kube(succeed=False), tainted=("n1", "n2"))
    execute([MarkOutOfService("n1", "analytics/events", TOLD)], context)
    assert context.tainted == ["n2"] and told == []
    context, told = acting(Kube(succeed=True), tainted=("n1",))
    execute([MarkOutOfService("n1", "analytics/events", TOLD)], context)
    assert context.tainted == ["n1"] and told == [(*TOLD, False)]


def test_guarded_writes_carry_the_version_the_pass_left() -> None:
    kube = Kube()
    context, _ = acting(kube)
    record = {"partitions": []}
    execute(
        [
            SetFinalizer(names.FINALIZER_TAINTS, present=True),
            WriteHandoverRecord(record, fault_point=False),
            SetFinalizer(names.FINALIZER_OWNED_TOPIC, present=False, guarded=False),
        ],
        context,
    )
    assert kube.writes == [
        ("set_finalizer", names.FINALIZER_TAINTS, True, "10"),
        ("patch_status", record, "11"),
        ("set_finalizer", names.FINALIZER_OWNED_TOPIC, False, None),
    ]
    assert context.version == "12"


def test_the_taint_finalizer_goes_only_when_no_taint_is_relied_on() -> None:
    kube = Kube()
    context, _ = acting(kube, tainted=("n1",))
    execute([ReleaseTaintFinalizer()], context)
    assert kube.writes == []
    context.tainted.clear()
    execute([ReleaseTaintFinalizer()], context)
    assert kube.writes == [("set_finalizer", names.FINALIZER_TAINTS, False, "10")]


@pytest.mark.parametrize("fault_point", [True, False])
def test_the_fault_point_is_just_before_a_record_with_entries(
    monkeypatch: pytest.MonkeyPatch, fault_point: bool
) -> None:
    kube = Kube()
    stops: list[tuple[str, int]] = []
    monkeypatch.setattr(
        executor.faults, "maybe_stop", lambda point: stops.append((point, len(kube.writes)))
    )
    context, _ = acting(kube)
    execute([Tell(TOLD), WriteHandoverRecord({"partitions": []}, fault_point)], context)
    # stopped with the record not yet written (the Event before it is the recorder's)
    assert stops == ([("operator-before-handover-record", 0)] if fault_point else [])
    assert [w[0] for w in kube.writes] == ["patch_status"]


def test_a_refused_topic_deletion_stops_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "delete_topic", lambda *a: "broker says no")
    kube = Kube()
    context, told = acting(kube)
    done = execute(
        [
            DeleteOwnedTopic("kafka:9092", {}, "t", TOLD, "analytics/events: cannot delete t"),
            SetFinalizer(names.FINALIZER_OWNED_TOPIC, present=False, guarded=False),
        ],
        context,
    )
    assert not done and kube.writes == [] and told == []
    monkeypatch.setattr(executor, "delete_topic", lambda *a: None)
    context, told = acting(kube)
    assert execute(
        [
            DeleteOwnedTopic("kafka:9092", {}, "t", TOLD, "analytics/events: cannot delete t"),
            SetFinalizer(names.FINALIZER_OWNED_TOPIC, present=False, guarded=False),
        ],
        context,
    )
    assert told == [(*TOLD, False)] and kube.writes[-1][0] == "set_finalizer"


def test_an_error_is_told_as_one() -> None:
    context, told = acting(Kube())
    execute([Tell(TOLD, error=True), Tell(TOLD)], context)
    assert told == [(*TOLD, True), (*TOLD, False)]
