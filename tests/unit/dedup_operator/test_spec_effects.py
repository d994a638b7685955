"""Spec fields that had no test of their effect: each is changed in a spec, parsed as the
operator parses it (`PipelineSpec.parse`), and seen where it acts: in the worker pod and
what the worker makes of its environment, or in the decision of a handover. The table
tests/support/crd_field_effects.py names these and the older tests, one per CRD field."""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dedup_contract.handover import HandoverReason
from dedup_contract.store import MiB
from dedup_operator import failover
from dedup_operator.desired.owner import Owner
from dedup_operator.desired.partition import worker_pod
from dedup_operator.failover import (
    AttachmentView,
    BeginHandover,
    DeletePods,
    Handover,
    LeaseView,
    NodePod,
    NodeView,
    PartitionObservation,
    PodView,
    Steady,
    TaintOutOfService,
)
from dedup_operator.spec import PipelineSpec
from dedup_worker.cli import build_parser, config_from_args
from dedup_worker.config import WorkerConfig

OWNER = Owner(name="events", namespace="analytics", uid="uid-1")
BASE: dict[str, Any] = {
    "kafka": {
        "bootstrapServers": "kafka:9092",
        "inputTopic": "events",
        "outputTopic": "events-deduped",
        "securityRef": {"secretName": "kafka-client"},
    },
    "partitions": 2,
    "messageId": {"source": "jsonField", "field": "messageId"},
    "window": {"duration": "1h"},
}


def parse(**changes: Any) -> PipelineSpec:
    """BASE with `kafka__inputTopic="x"`-style changes, as the operator parses it."""
    body = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return PipelineSpec.parse("events", "analytics", body)


def container(spec: PipelineSpec) -> dict[str, Any]:
    return dict(worker_pod(spec, 1, 2, OWNER)["spec"]["containers"][0])


def what_the_worker_reads(
    spec: PipelineSpec, monkeypatch: pytest.MonkeyPatch
) -> tuple[argparse.Namespace, WorkerConfig]:
    """The worker's arguments and configuration from the pod's environment alone, the
    downward-API values filled in as the kubelet would (the Secret's variable left out:
    only the kubelet reads Secrets)."""
    downward = {
        "metadata.name": "events-p1-e2",
        "metadata.namespace": "analytics",
        "status.podIP": "10.0.0.7",
    }
    for name in [n for n in os.environ if n.startswith("DEDUP_")]:
        monkeypatch.delenv(name)
    for e in container(spec)["env"]:
        if "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
        elif "fieldRef" in e["valueFrom"]:
            monkeypatch.setenv(e["name"], downward[e["valueFrom"]["fieldRef"]["fieldPath"]])
    args = build_parser().parse_args([])
    return args, config_from_args(args)


Read = Callable[[argparse.Namespace, WorkerConfig], Any]
WORKER_FIELDS: list[tuple[str, Any, Read, Any]] = [
    # the field as `parse` takes it, a value, what the worker reads, what it should read
    ("kafka__bootstrapServers", "b1:9092,b2:9092", lambda a, c: c.bootstrap_servers, None),
    ("kafka__inputTopic", "clicks", lambda a, c: c.input_topic, None),
    ("kafka__outputTopic", "clicks-once", lambda a, c: c.output_topic, None),
    ("kafka__deadLetterTopic", "clicks-bad", lambda a, c: c.dead_letter_topic, None),
    ("kafka__consumerGroup", "team-a-dedup", lambda a, c: c.consumer_group, None),
    (
        "messageId",
        {"source": "header", "field": "x-id"},
        lambda a, c: (c.id_spec.source, c.id_spec.field),
        ("header", "x-id"),
    ),
    ("worker__batchSize", 123, lambda a, c: c.batch_size, None),
    ("worker__lingerMs", 75, lambda a, c: c.linger_ms, None),
    ("worker__blockCacheMB", 256, lambda a, c: c.store.block_cache_bytes // MiB, None),
    ("worker__logLevel", "DEBUG", lambda a, c: a.log_level, None),
    ("upgrade__finalizedRelease", "0.2.0", lambda a, c: c.finalized, True),
]


@pytest.mark.parametrize(
    ("field", "value", "read", "expected"),
    WORKER_FIELDS,
    ids=[f[0].replace("__", ".") for f in WORKER_FIELDS],
)
def test_worker_fields_reach_the_workers_arguments(
    field: str, value: Any, read: Read, expected: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = value if expected is None else expected
    default = read(*what_the_worker_reads(parse(), monkeypatch))
    changed = read(*what_the_worker_reads(parse(**{field: value}), monkeypatch))
    assert changed == expected != default


def test_image_requests_node_selector_and_tolerations_reach_the_worker_pod() -> None:
    plain = worker_pod(parse(), 0, 1, OWNER)["spec"]
    assert "nodeSelector" not in plain and "tolerations" not in plain
    toleration = {"key": "dedicated", "operator": "Equal", "value": "dedup", "effect": "NoSchedule"}
    spec = parse(
        worker={
            "image": "registry.example/dedup-operator:9.9",
            "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}},
            "nodeSelector": {"pool": "dedup"},
            "tolerations": [toleration],
        }
    )
    pod = worker_pod(spec, 0, 1, OWNER)["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry.example/dedup-operator:9.9" != plain["containers"][0]["image"]
    assert c["resources"]["requests"] == {"cpu": "250m", "memory": "1Gi"}
    assert pod["nodeSelector"] == {"pool": "dedup"}
    assert pod["tolerations"] == [toleration]


def test_security_ref_key_names_the_secrets_key() -> None:
    def secret_ref(spec: PipelineSpec) -> Any:
        env = {e["name"]: e for e in container(spec)["env"]}
        return env["DEDUP_KAFKA_CONFIG"]["valueFrom"]["secretKeyRef"]

    assert secret_ref(parse()) == {"name": "kafka-client", "key": "kafka-config"}
    spec = parse(kafka__securityRef={"secretName": "kafka-client", "key": "sasl"})
    assert secret_ref(spec) == {"name": "kafka-client", "key": "sasl"}


# ------------------------------------------------------------------ spec.failover.*
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
OLD = "events-p0-e1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(name: str, lost_for_s: float | None = None, pods: tuple[NodePod, ...] = ()) -> NodeView:
    """A node heartbeating, or whose node Lease has been unchanged `lost_for_s`."""
    return NodeView(
        name=name,
        ready="True" if lost_for_s is None else "Unknown",
        ready_since=at(-1000),
        heartbeat_age=timedelta(seconds=lost_for_s or 1),
        heartbeat_stale=lost_for_s is not None,
        pods=pods,
    )


def ran_out(holder: str | None = None) -> LeaseView:
    return LeaseView(holder, 1, timedelta(seconds=5), timedelta(seconds=60), free=holder is None)


def observe(**kw: Any) -> PartitionObservation:
    base: dict[str, Any] = {
        "partition": 0,
        "pods": (PodView(OLD, 1, "a", "Running", ready=True),),
        "nodes": {"a": node("a"), "b": node("b")},
        "lease": LeaseView(OLD, 1, timedelta(seconds=5), timedelta(seconds=1)),
        "attachments": (),
        "handover": None,
    }
    base.update(kw)
    return PartitionObservation(**base)


def decide(spec: PipelineSpec, o: PartitionObservation, now: datetime) -> failover.Decision:
    return failover.partition_action(o, spec.failover.policy(), now)


def lost_handover(**steps: float) -> Handover:
    return Handover(HandoverReason.NODE_LOST, at(0), 1, OLD, "a", steps=steps)


def test_node_lost_after_decides_when_a_handover_begins() -> None:
    silent = observe(nodes={"a": node("a", lost_for_s=30), "b": node("b")})
    d = decide(parse(failover={"nodeLostAfter": "20s"}), silent, at(30))
    assert isinstance(d.action, BeginHandover)
    assert d.action.handover.reason == HandoverReason.NODE_LOST
    d = decide(parse(failover={"nodeLostAfter": "60s"}), silent, at(30))
    assert isinstance(d.action, Steady) and d.handover is None


@pytest.mark.parametrize(
    ("release", "action"),
    [
        ("OutOfServiceTaint", TaintOutOfService("a")),
        ("WaitForDetach", DeletePods((OLD,), force=True, why="its node is lost (WaitForDetach)")),
        ("External", Steady(waiting_for="an out-of-service taint on node a (External)")),
    ],
)
def test_release_volume_decides_how_a_lost_nodes_volume_is_released(
    release: str, action: Any
) -> None:
    """The old worker fenced on a lost node that runs nothing else."""
    ours = NodePod("analytics", OLD, worker=True, worker_lease=ran_out())
    o = observe(
        nodes={"a": node("a", lost_for_s=30, pods=(ours,)), "b": node("b")},
        handover=lost_handover(fenced=1),
        lease=ran_out(),
    )
    d = decide(parse(failover={"releaseVolume": release}), o, at(2))
    assert d.action == action


def test_detach_timeout_decides_when_a_stuck_volume_degrades() -> None:
    stuck = observe(
        pods=(),
        handover=lost_handover(fenced=1, released=1),
        lease=ran_out(),
        attachments=(AttachmentView("csi-x", "a", True),),
    )
    short, long = parse(failover={"detachTimeout": "1m"}), parse(failover={"detachTimeout": "5m"})
    d = decide(short, stuck, at(1 + 60))
    assert d.degraded_reason == "VolumeNotDetached" and "csi-x on a" in (d.degraded or "")
    assert decide(long, stuck, at(1 + 60)).degraded is None


def test_schedule_timeout_decides_when_an_unplaceable_pod_degrades() -> None:
    why = "0/2 nodes are available: 2 Insufficient cpu"
    pending = PodView(
        OLD, 1, None, "Pending", unschedulable=why, unschedulable_since=at(0)
    )  # a first pod the scheduler cannot place
    o = observe(pods=(pending,))
    d = decide(parse(failover={"scheduleTimeout": "30s"}), o, at(30))
    assert d.degraded_reason == "Unschedulable" and why in (d.degraded or "")
    assert decide(parse(failover={"scheduleTimeout": "2m"}), o, at(30)).degraded is None
