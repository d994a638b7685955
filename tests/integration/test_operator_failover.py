"""The operator's failover against the real control plane (apiserver, scheduler and every
kube-controller-manager controller: taint eviction, pod GC, node lifecycle), with the
kubelets' and workers' side played by the test: `Kubelets` heartbeats the nodes that are
up, reports bound pods Running and Ready, finishes graceful deletions, and renews each
running worker's Lease the way the worker does. No worker process runs here (the local
cluster's end-to-end tests run real ones); what is tested is what the operator does:

node lost -> decision recorded -> Lease expired -> node tainted out-of-service ->
old pod force-deleted by pod GC -> replacement (next epoch) on another node -> Ready ->
handover recorded with its steps; the taint is removed once the node is back. Killed
in the middle (the test holds the handover after its step: a finalizer on the old pod,
an attachment of the volume) and restarted, the operator completes the failover once. A pipeline
deleted while its lost node is tainted lifts its taint (and only its own).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_operator.failover import OUT_OF_SERVICE_TAINT
from dedup_operator.kube import Kube
from support.kafka_fixtures import NewTopic
from support.kube_fixtures import KubeCluster, KubeNamespace
from support.operator_helpers import (
    events,
    get_pipeline,
    reasons_once_posted,
    running_operator,
    wait_for,
    wait_for_event,
)
from support.simulated_kubelets import (
    LEASE_S,
    Kubelets,
    entry,
    kubelets_in,
    pipeline,
    simulated_output,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]


@pytest.fixture
def kubelets(kube_namespace: KubeNamespace) -> Iterator[Kubelets]:
    with kubelets_in(kube_namespace.api_client, kube_namespace.name, "fo", 2) as k:
        k.create_volumes("events", 2)
        yield k


def taints(api: client.ApiClient, node: str) -> list[str]:
    n = client.CoreV1Api(api).read_node(node)
    return [t.key for t in (n.spec.taints or [])]


HOLD = "dedup.io/test-hold"  # a finalizer the test puts on the old worker pod


def _hold_at(api: client.ApiClient, ns: str, step: str, pod: str, node: str) -> Any:
    """Keep the handover after `step` until `release()` is called (the returned
    function): a handover takes its steps a tenth of a second apart, faster than a test
    can see them. After `fenced`, the old pod cannot go (a finalizer holds it, deleted);
    after `released`, the volume stays attached to the lost node (a VolumeAttachment the
    test made, which no attacher removes)."""
    core = client.CoreV1Api(api)
    if step == "fenced":
        core.patch_namespaced_pod(pod, ns, {"metadata": {"finalizers": [HOLD]}})
        return lambda: core.patch_namespaced_pod(
            pod,
            ns,
            {"metadata": {"finalizers": None}},
            _content_type="application/merge-patch+json",
        )
    claim = core.read_namespaced_persistent_volume_claim(names.volume_claim("events", 0), ns)
    storage = client.StorageV1Api(api)
    attachment = f"hold-{ns[-12:]}"
    storage.create_volume_attachment(
        {
            "metadata": {"name": attachment},
            "spec": {
                "attacher": "test-attacher.dedup.io",
                "nodeName": node,
                "source": {"persistentVolumeName": claim.spec.volume_name},
            },
        }
    )
    return lambda: storage.delete_volume_attachment(attachment)


def _fail_over(
    ns: KubeNamespace,
    kubelets: Kubelets,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
    kill_at: str | None,
) -> None:
    api = ns.api_client
    topic = new_topic(partitions=2)
    # TopicReady: the output, kept for ever (the window is maxKeys only)
    kafka.create_topic(simulated_output(topic, "events"), 2, {"retention.ms": "-1"})
    log = tmp_path / "operator.log"
    op_ctx = running_operator(ns.kubeconfig_path, ns.name, log, interval=0.5)
    op = op_ctx.__enter__()
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns.name,
            names.PLURAL,
            pipeline(kafka.bootstrap, topic, kubelets.label),
        )

        def ready() -> bool:
            p = get_pipeline(api, ns.name, "events") or {}
            return (p.get("status") or {}).get("readyPartitions") == 2

        wait_for(ready, 90, "both partitions Ready")
        before = entry(api, ns.name, 0)
        lost = before["node"]
        assert before["epoch"] == 1
        release = None
        if kill_at is not None:
            release = _hold_at(api, ns.name, kill_at, before["pod"], lost)
        t0 = time.monotonic()
        kubelets.lose(lost)

        if kill_at is not None:
            assert release is not None
            following = ["fenced", "released", "detached"]
            next_step = following[following.index(kill_at) + 1]

            def reached() -> bool:
                steps = (entry(api, ns.name, 0).get("handover") or {}).get("steps") or {}
                return kill_at in steps and next_step not in steps

            wait_for(reached, 90, f"the handover to reach {kill_at}", every=0.2)
            time.sleep(1.0)  # held there: the operator's passes find it so
            assert reached(), "held after its step"
            # its start told before the kill: the Events a killed operator had queued
            # are lost with it (event_poster.py); what is checked is that its successor
            # does not tell the start again
            reasons_once_posted(api, ns.name, "events", "FailoverStarted")
            op.kill()
            op_ctx.__exit__(None, None, None)
            release()
            op_ctx = running_operator(ns.kubeconfig_path, ns.name, log, interval=0.5)
            op = op_ctx.__enter__()

        def moved() -> dict[str, Any] | None:
            e = entry(api, ns.name, 0)
            return e if e.get("ready") and e.get("node") != lost and not e.get("handover") else None

        after = wait_for(moved, 120, "partition 0 to run on the other node", every=0.5)
        took = time.monotonic() - t0
        print(f"failover took {took:.1f}s; steps {after['lastHandover']['steps']}")
        assert after["epoch"] == 2 and after["pod"] == "events-p0-e2"
        assert after["lastHandover"]["reason"] == "NodeLost"
        steps = after["lastHandover"]["steps"]
        order = ["fenced", "released", "detached", "started", "ready"]
        assert set(steps) == set(order), steps
        assert all(steps[a] <= steps[b] for a, b in itertools.pairwise(order)), steps

        # the fake worker (as a real one) sees the old hold unchanged for a full duration on
        # its own clock before it takes the Lease (dedup_contract.lease_clock)
        def taken() -> Any:
            lease = client.CoordinationV1Api(api).read_namespaced_lease("events-p0", ns.name)
            return lease if lease.spec.holder_identity == "events-p0-e2" else None

        lease = wait_for(taken, LEASE_S * 3, "the replacement to take the Lease", every=0.2)
        assert lease.spec.lease_transitions == 2
        # the lost node was tainted out-of-service to release the volume
        assert OUT_OF_SERVICE_TAINT in taints(api, lost)
        # the completion is told at least once: recorded with `told: false` before the
        # pass acts, a pass stopped before its status (killed, deposed) leaves it to the
        # next one (plan._completed)
        wait_for(
            lambda: (entry(api, ns.name, 0).get("lastHandover") or {}).get("told"),
            30,
            "the completion told",
        )
        reasons = reasons_once_posted(
            api, ns.name, "events", "FailoverStarted", "FailoverCompleted"
        )
        assert reasons.count("FailoverStarted") == 1, reasons
        assert reasons.count("FailoverCompleted") >= 1, reasons
        if kill_at is None:  # a killed operator may have tainted but not told
            assert "NodeOutOfService" in reasons
        pods = client.CoreV1Api(api).list_namespaced_pod(ns.name).items
        assert sorted(p.metadata.name for p in pods) == ["events-p0-e2", "events-p1-e1"]
        status = (get_pipeline(api, ns.name, "events") or {})["status"]
        assert status["failovers"] == 1 and status["phase"] == "Running"
        assert (
            f'dedup_operator_failovers_total{{namespace="{ns.name}",pipeline="events",reason="NodeLost"}} 1.0'
            in op.metrics()
            or kill_at
        )

        # the node comes back: holding none of the pipeline's volumes, it is untainted
        kubelets.back(lost)
        wait_for(lambda: OUT_OF_SERVICE_TAINT not in taints(api, lost), 30, "taint removal")
        # its Event is posted just after the taint goes (the same pass, a moment later)
        wait_for_event(api, ns.name, "events", "Normal", "NodeBackInService")
        assert not kubelets.errors, kubelets.errors
    finally:
        op_ctx.__exit__(None, None, None)


def test_lost_node_partition_moves_to_the_other_node(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kubelets: Kubelets,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    _fail_over(kube_namespace, kubelets, kafka, new_topic, tmp_path, None)


@pytest.mark.parametrize("kill_at", ["fenced", "released"])
def test_operator_killed_mid_failover_completes_it_once(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kubelets: Kubelets,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
    kill_at: str,
) -> None:
    _fail_over(kube_namespace, kubelets, kafka, new_topic, tmp_path, kill_at)


def test_spec_change_rolls_one_partition_at_a_time(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kubelets: Kubelets,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns, api = kube_namespace, kube_namespace.api_client
    topic = new_topic(partitions=2)
    # TopicReady: the output, kept for ever (the window is maxKeys only)
    kafka.create_topic(simulated_output(topic, "events"), 2, {"retention.ms": "-1"})
    log = tmp_path / "operator.log"
    with running_operator(ns.kubeconfig_path, ns.name, log, interval=0.5):
        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns.name,
            names.PLURAL,
            pipeline(kafka.bootstrap, topic, kubelets.label),
        )

        def ready(epochs: list[int]) -> bool:
            p = get_pipeline(api, ns.name, "events") or {}
            status = p.get("status") or {}
            return (
                status.get("readyPartitions") == 2
                and [e["epoch"] for e in status.get("partitions", [])] == epochs
            )

        wait_for(lambda: ready([1, 1]), 90, "both partitions Ready at epoch 1")
        custom.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns.name,
            names.PLURAL,
            "events",
            {"spec": {"worker": {"batchSize": 100}}},
            _content_type="application/merge-patch+json",
        )
        wait_for(lambda: ready([2, 2]), 120, "both partitions rolled to epoch 2")
        found = get_pipeline(api, ns.name, "events") or {}
        assert found["status"]["observedGeneration"] == 2
        pod = client.CoreV1Api(api).read_namespaced_pod("events-p0-e2", ns.name)
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["DEDUP_BATCH_SIZE"] == "100"
    rolls = [
        (line.split('"reason": "')[1].split('"')[0], line.split("partition ")[1][0])
        for line in log.read_text().splitlines()
        if '"reason": "Roll' in line
    ]
    # a completion is told at least once (plan._completed): a pass whose status write
    # conflicted tells it again, so repeats of the same line count once
    rolls = [r for i, r in enumerate(rolls) if i == 0 or r != rolls[i - 1]]
    # one partition at a time: each roll completes before the next starts
    assert [r for r, _ in rolls] == ["RollStarted", "RollCompleted"] * 2, rolls
    assert rolls[0][1] == rolls[1][1] and rolls[2][1] == rolls[3][1] != rolls[0][1], rolls


def test_pipeline_deleted_while_its_node_is_tainted_lifts_its_taint_only(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kubelets: Kubelets,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """The lost node is tainted out-of-service and marked with the pipeline (node
    annotation); the pipeline carries the finalizer dedup.io/out-of-service-taints while
    it relies on the taint. Deleted with the node still lost, the pipeline lifts its
    taint and goes. An out-of-service taint an administrator set (no mark) is never
    claimed nor removed by the operator's calls."""
    ns, api = kube_namespace, kube_namespace.api_client
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    topic = new_topic(partitions=2)
    # TopicReady: the output, kept for ever (the window is maxKeys only)
    kafka.create_topic(simulated_output(topic, "events"), 2, {"retention.ms": "-1"})
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log", interval=0.5):
        custom.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns.name,
            names.PLURAL,
            pipeline(kafka.bootstrap, topic, kubelets.label),
        )

        def ready() -> bool:
            p = get_pipeline(api, ns.name, "events") or {}
            return (p.get("status") or {}).get("readyPartitions") == 2

        wait_for(ready, 90, "both partitions Ready")
        lost = entry(api, ns.name, 0)["node"]
        kubelets.lose(lost)
        wait_for(lambda: OUT_OF_SERVICE_TAINT in taints(api, lost), 90, "the taint on the node")
        mark = core.read_node(lost).metadata.annotations or {}
        assert mark.get(names.ANNOTATION_TAINT_BY) == f"{ns.name}/events", mark
        found = get_pipeline(api, ns.name, "events") or {}
        assert names.FINALIZER_TAINTS in found["metadata"].get("finalizers", [])

        custom.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, ns.name, names.PLURAL, "events"
        )
        wait_for(lambda: get_pipeline(api, ns.name, "events") is None, 30, "the pipeline gone")
        assert OUT_OF_SERVICE_TAINT not in taints(api, lost)
        mark = core.read_node(lost).metadata.annotations or {}
        assert names.ANNOTATION_TAINT_BY not in mark, mark
        assert ("Normal", "NodeBackInService") in {
            (t, r) for t, r, m in events(api, ns.name, "events") if "pipeline deleted" in m
        }

    # An administrator's taint: the operator neither claims nor removes it.
    admin = kubelets.nodes[1] if lost == kubelets.nodes[0] else kubelets.nodes[0]
    kube = Kube(api)
    node = core.read_node(admin)
    core.patch_node(
        admin,
        {
            "spec": {
                "taints": [
                    *[t.to_dict() for t in node.spec.taints or []],
                    {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"},
                ]
            }
        },
    )
    assert not kube.taint_out_of_service(admin, f"{ns.name}/events")
    assert not kube.release_out_of_service(admin, f"{ns.name}/events")
    assert OUT_OF_SERVICE_TAINT in taints(api, admin)
    assert names.ANNOTATION_TAINT_BY not in (core.read_node(admin).metadata.annotations or {})
    # two pipelines on one node: the taint stays until the last mark is lifted
    assert kube.taint_out_of_service(lost, "a/one") and kube.taint_out_of_service(lost, "b/two")
    assert not kube.release_out_of_service(lost, "a/one")
    assert OUT_OF_SERVICE_TAINT in taints(api, lost)
    assert kube.release_out_of_service(lost, "b/two")
    assert OUT_OF_SERVICE_TAINT not in taints(api, lost)
