"""Spark on Kubernetes, on the local cluster: the audit runs as a driver pod in client
mode that asks the API server for two executor pods; the node agents run them
(`dedup-entrypoint executor`, pyspark's jars) and they register with the driver.
The test sees the executor pods, owned by the driver pod, and the audit's result."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dedup_local.kafka import KafkaBroker
from support.cluster_fixtures import ClusterNamespace
from support.operator_helpers import wait_for
from support.worker_helpers import event, produce, unique

pytestmark = pytest.mark.integration

DRIVER_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "delete", "deletecollection", "patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "update", "delete", "deletecollection"],
    },
    {
        "apiGroups": [""],
        "resources": ["services", "persistentvolumeclaims"],
        "verbs": ["get", "list", "create", "delete", "deletecollection"],
    },
]


def driver_account(api: client.ApiClient, namespace: str) -> str:
    name = "spark-driver"
    client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": DRIVER_RULES})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    return name


class ExecutorWatch:
    """Polls the namespace's executor pods while the driver runs (Spark deletes them at
    the end): name -> (owner pod names, phases seen, node)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.seen: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                pods = self.core.list_namespaced_pod(
                    self.namespace, label_selector="spark-role=executor"
                ).items
            except Exception:  # the API server busy for a moment: try again
                continue
            for pod in pods:
                entry = self.seen.setdefault(
                    pod.metadata.name, {"owners": set(), "phases": set(), "node": None}
                )
                entry["owners"] |= {(r.kind, r.name) for r in pod.metadata.owner_references or []}
                entry["phases"].add(pod.status.phase)
                entry["node"] = pod.spec.node_name or entry["node"]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_the_audit_runs_as_a_driver_pod_with_two_executor_pods(
    kafka: KafkaBroker, cluster_namespace: ClusterNamespace, tmp_path: Path
) -> None:
    ns, api = cluster_namespace.name, cluster_namespace.api_client
    name = unique("sparkk8s")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 2)
    for p in range(2):
        values = [event(f"id-{p}-{i}") for i in range(200)]
        produce(kafka.bootstrap, f"{name}-in", values, partition=p)
        produce(kafka.bootstrap, f"{name}-out", values, partition=p)

    account = driver_account(api, ns)
    watch = ExecutorWatch(api, ns)
    driver = f"{name}-driver"
    args = [
        *("--pipeline", name, "--bootstrap-servers", kafka.bootstrap),
        *("--input-topic", f"{name}-in", "--output-topic", f"{name}-out"),
        *("--dead-letter-topic", f"{name}-dlq", "--window", "1h", "--lookback", "1h"),
        *("--all-input", "--report-dir", "/reports", "--configmap"),
        *("--master", "k8s", "--image", "dedup-operator:dev", "--executors", "2"),
        *("--executor-memory", "512m", "--log-format", "text"),
    ]
    client.CoreV1Api(api).create_namespaced_pod(
        ns,
        {
            "metadata": {"name": driver, "labels": {"app": "dedup-reconcile"}},
            "spec": {
                "serviceAccountName": account,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "driver",
                        "image": "dedup-operator:dev",
                        "command": ["dedup-reconcile", *args],
                        "env": [
                            {
                                "name": "DEDUP_POD_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                            },
                            {
                                "name": "DEDUP_POD_NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            },
                            {
                                "name": "DEDUP_NAMESPACE",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                            },
                        ],
                        "volumeMounts": [{"name": "reports", "mountPath": "/reports"}],
                    }
                ],
                "volumes": [{"name": "reports", "emptyDir": {}}],
            },
        },
    )
    core = client.CoreV1Api(api)
    started = time.monotonic()
    try:
        phase = wait_for(
            lambda: (
                (p := core.read_namespaced_pod(driver, ns).status.phase) in ("Succeeded", "Failed")
                and p
            ),
            timeout=300,
            what="the driver pod to finish",
        )
    finally:
        watch.stop()
        log = cluster_namespace.cluster.pod_log(ns, driver)
        print(f"driver finished after {time.monotonic() - started:.1f}s; log tail:\n{log[-3000:]}")
    assert phase == "Succeeded", log[-5000:]

    # Two executors, created by Spark through the API server, owned by the driver pod.
    assert len(watch.seen) >= 2, watch.seen
    for pod, entry in watch.seen.items():
        assert ("Pod", driver) in entry["owners"], (pod, entry)
        assert "Running" in entry["phases"], (pod, entry)
    for pod in watch.seen:
        executor_log = cluster_namespace.cluster.pod_log(ns, pod)
        assert (
            "KubernetesExecutorBackend" in executor_log or "Successfully registered" in executor_log
        ), executor_log[-2000:]

    cm = core.read_namespaced_config_map(f"{name}-reconciliation", ns)
    summary = json.loads(cm.data["summary.json"])
    assert summary["passed"] is True
    assert summary["totals"]["input"] == 400 and summary["totals"]["published"] == 400
