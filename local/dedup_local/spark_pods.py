"""Running a Spark driver as a pod on the local cluster (tests and benchmarks).

The driver's ServiceAccount gets the operator's own Role rules for an audit driver
(`dedup_operator.desired.scheduled_audit.DRIVER_RULES`), and its pod the identity env
of `dedup_spark.session`. While it runs, `ExecutorWatch` records the executor pods Spark
creates (it deletes them at the end).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from dedup_contract.driver_pod import pod_identity_env
from dedup_operator.desired.scheduled_audit import DRIVER_RULES, RESULT_VERBS

from .cluster import LocalCluster

PROJECT_IMAGE = "dedup-operator:dev"


def grant_driver(api: client.ApiClient, namespace: str, name: str = "spark-driver") -> str:
    """A ServiceAccount allowed what a Spark driver calls, plus ConfigMap writes for the
    audit's result. Returns its name."""
    rules = [
        {"apiGroups": [""], "resources": [resource], "verbs": list(verbs)}
        for resource, verbs in DRIVER_RULES
    ]
    rules.append({"apiGroups": [""], "resources": ["configmaps"], "verbs": list(RESULT_VERBS)})
    core: Any = client.CoreV1Api(api)  # dict bodies, as the API accepts them
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac: Any = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    return name


def driver_pod(name: str, command: Sequence[str], account: str) -> dict[str, Any]:
    """A run-once driver pod of the project image, with a scratch volume at /reports."""
    return {
        "metadata": {"name": name, "labels": {"app": "spark-driver"}},
        "spec": {
            "serviceAccountName": account,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "driver",
                    "image": PROJECT_IMAGE,
                    "command": list(command),
                    "env": pod_identity_env(),
                    "volumeMounts": [{"name": "reports", "mountPath": "/reports"}],
                }
            ],
            "volumes": [{"name": "reports", "emptyDir": {}}],
        },
    }


@dataclass
class ExecutorPod:
    owners: set[tuple[str, str]] = field(default_factory=set)
    phases: set[str] = field(default_factory=set)
    container_ids: set[str] = field(default_factory=set)
    first_seen: float = 0.0
    running_at: float | None = None


class ExecutorWatch:
    """Polls a namespace's executor pods (label spark-role=executor) in the background."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.namespace = namespace
        self.seen: dict[str, ExecutorPod] = {}
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="executor-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                pods = self.core.list_namespaced_pod(
                    self.namespace, label_selector="spark-role=executor"
                ).items
            except Exception:  # the API server busy for a moment: look again
                continue
            now = time.monotonic() - self.started
            for pod in pods:
                entry = self.seen.setdefault(pod.metadata.name, ExecutorPod(first_seen=now))
                entry.owners |= {(r.kind, r.name) for r in pod.metadata.owner_references or []}
                phase = pod.status.phase or "Pending"
                entry.phases.add(phase)
                for status in pod.status.container_statuses or []:
                    if status.container_id:
                        entry.container_ids.add(status.container_id)
                if phase == "Running" and entry.running_at is None:
                    entry.running_at = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def run_driver(
    cluster: LocalCluster,
    api: client.ApiClient,
    namespace: str,
    pod: dict[str, Any],
    timeout_s: float = 600,
) -> tuple[str, str, ExecutorWatch]:
    """Create the driver pod, wait for it to finish; (phase, its log, the executors seen)."""
    core: Any = client.CoreV1Api(api)
    watch = ExecutorWatch(api, namespace)
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(namespace, pod)
    deadline = time.monotonic() + timeout_s
    phase = "Pending"
    try:
        while time.monotonic() < deadline:
            phase = core.read_namespaced_pod(name, namespace).status.phase or "Pending"
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
    finally:
        watch.stop()
    return phase, cluster.pod_log(namespace, name), watch
