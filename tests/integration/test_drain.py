"""`kubectl drain` of a worker's node, the most common maintenance action, on the local
cluster under traffic: the eviction (through the workers' PodDisruptionBudget) stops
the worker cleanly (its transaction done, its Lease released), the operator moves the
partition with its volume to another node as a planned handover (reason NodeDrained, no
node-loss wait), `dedupctl failovers` shows it with its reason, the drain completes, and
the output is exact. A foreign pod on the node is evicted by the drain as Kubernetes
does, never by the operator."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_local.pod_health import log_problems
from dedup_local.real_cluster import RealCluster
from support.cluster_fixtures import ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.operator_helpers import dedupctl, events, get_pipeline, running_operator, wait_for
from support.pipeline_traffic import (
    Traffic,
    assert_output_exact,
    create_pipeline,
    partition_entry,
    pipeline_body,
    ready_pipeline,
    topics,
    wait_moved_off,
    wait_published,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("local_crds"),
    pytest.mark.cluster_group("local-cluster"),
]


def test_a_drained_node_hands_its_partition_over_as_planned(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns, api = cluster_namespace.name, local_cluster.api_client()
    core = client.CoreV1Api(api)
    topic = topics(kafka, new_topic, 2)
    drained: str | None = None
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log") as op:
        create_pipeline(
            api, ns, pipeline_body("events", kafka.bootstrap, topic, 2, local_cluster.storage_class)
        )
        ready_pipeline(api, ns, "events", 2)
        pdb = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(
            names.disruption_budget("events"), ns
        )
        wait_for(
            lambda: (
                client.PolicyV1Api(api)
                .read_namespaced_pod_disruption_budget(names.disruption_budget("events"), ns)
                .status.disruptions_allowed
                == 1
            ),
            60,
            "the budget to allow one eviction",
        )
        assert pdb.spec.min_available == 1
        before = partition_entry(api, ns, "events", 0)
        drained = str(before["node"])
        old_pod = str(before["pod"])
        traffic = Traffic(kafka.bootstrap, topic, 2)
        try:
            with traffic.running():
                wait_published(kafka.bootstrap, topic, 0, 200)
                started = time.monotonic()
                result = local_cluster.kubectl(
                    "drain", drained, "--ignore-daemonsets", "--delete-emptydir-data",
                    "--force", "--timeout=180s", timeout=200, check=False,
                )  # fmt: skip
                assert result.returncode == 0, result.stdout + result.stderr
                drain_s = time.monotonic() - started

                after = wait_moved_off(local_cluster, ns, "events", 0, drained, every=1)
                moved_s = time.monotonic() - started
                sent = traffic.sent
                wait_for(lambda: traffic.sent > sent + 300, 60, "traffic after the move")
            print(f"drain took {drain_s:.1f}s; partition 0 Ready elsewhere after {moved_s:.1f}s")
            assert_output_exact(kafka.bootstrap, topic, traffic)
        finally:
            local_cluster.kubectl("uncordon", drained, check=False)

        # a planned handover, not a node loss: recorded with its reason
        last = after["lastHandover"]
        assert last["reason"] == "NodeDrained", last
        assert last["fromNode"] == drained and after["epoch"] == before["epoch"] + 1
        told = {e[:2] for e in events(api, ns, "events")}
        assert {("Normal", "DrainStarted"), ("Normal", "DrainCompleted")} <= told, told
        assert not {r for t, r in told if r.startswith("Failover")}, told
        status = (get_pipeline(api, ns, "events") or {})["status"]
        assert status.get("failovers", 0) == 0  # planned: no failover counted
        # the old worker stopped cleanly: its last batch committed, its Lease released
        old_log = local_cluster.pod_log(ns, old_pod)
        assert "released the Lease" in old_log, old_log[-3000:]
        assert log_problems(old_log) == []
        assert op.process.poll() is None and log_problems(op.log()) == []
        shown = dedupctl("failovers", "events", "-n", ns, "-o", "json",
                         kubeconfig=local_cluster.kubeconfig_path)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        row = json.loads(shown.stdout)["failovers"][-1]
        assert (row["partition"], row["reason"], row["fromPod"]) == (0, "NodeDrained", old_pod)
        assert core.read_node(drained).spec.unschedulable is None  # uncordoned
