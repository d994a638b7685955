"""Spark on Kubernetes, on the local cluster with containers: the audit runs as a driver
pod in client mode (a container from the project's image) that asks the API server for
two executor pods; the node agents run them in containers from the same image
(`dedup-entrypoint executor`, the image's pyspark jars) and they register with the driver.
The test sees the executor pods, owned by the driver pod, and the audit's result."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from dedup_contract.ownership import owner_reference
from dedup_local.kafka import KafkaBroker
from dedup_local.spark_pods import PROJECT_IMAGE, driver_pod, grant_driver, run_driver
from support.cluster_fixtures import ClusterNamespace
from support.worker_helpers import event, produce, unique

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("containers")]


def test_the_audit_runs_as_a_driver_pod_with_two_executor_pods(
    kafka: KafkaBroker, container_namespace: ClusterNamespace
) -> None:
    ns, api = container_namespace.name, container_namespace.api_client
    name = unique("sparkk8s")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 2)
    for p in range(2):
        ids = [f"id-{p}-{i}" for i in range(200)]
        produce(kafka.bootstrap, f"{name}-in", [event(i) for i in ids], partition=p)
        for q in range(2):  # published by the id's owner, on its output partition
            owned = [event(i) for i in ids if owner_reference(i.encode(), 2) == q]
            produce(kafka.bootstrap, f"{name}-out", owned, partition=q)

    driver = f"{name}-driver"
    command = [
        "dedup-audit",
        *("--pipeline", name, "--bootstrap-servers", kafka.bootstrap),
        *("--input-topic", f"{name}-in", "--output-topic", f"{name}-out"),
        *("--dead-letter-topic", f"{name}-dlq", "--window", "1h", "--lookback", "1h"),
        *("--workers", "2"),
        *("--all-input", "--report-dir", "/reports", "--configmap"),
        *("--master", "k8s", "--image", PROJECT_IMAGE, "--executors", "2"),
        *("--executor-memory", "512m", "--log-format", "text"),
    ]
    pod = driver_pod(driver, command, grant_driver(api, ns))
    # Generous: the suite runs its groups side by side on two cores.
    phase, log, executors = run_driver(container_namespace.cluster, api, ns, pod, timeout_s=600)
    print(f"driver log tail:\n{log[-3000:]}\nexecutors: {executors.seen}")
    assert phase == "Succeeded", log[-5000:]

    # Two executors, created by Spark through the API server, owned by the driver pod,
    # run by the node agents, registered with the driver.
    assert len(executors.seen) >= 2, executors.seen
    for pod_name, seen in executors.seen.items():
        assert ("Pod", driver) in seen.owners, (pod_name, seen)
        assert "Running" in seen.phases, (pod_name, seen)
        assert seen.container_ids and all(c.startswith("podman://") for c in seen.container_ids), (
            seen
        )  # run in a container from the image, not as a process
        executor_log = container_namespace.cluster.pod_log(ns, pod_name)
        assert "Successfully registered with driver" in executor_log, executor_log[-2000:]

    cm = client.CoreV1Api(api).read_namespaced_config_map(f"{name}-reconciliation", ns)
    summary = json.loads(cm.data["summary.json"])
    assert summary["passed"] is True
    assert summary["totals"]["input"] == 400 and summary["totals"]["published"] == 400
