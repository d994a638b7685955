"""The kubelets' and workers' side of the operator's failover tests on the bare control
plane (tests/integration/test_operator_failover.py, test_operator_stale_leader.py):
`Kubelets` heartbeats the nodes that are up, reports bound pods Running and Ready,
finishes graceful deletions and renews each running worker's Lease the way the worker
does; `pipeline` is the two-partition pipeline those tests run and `entry` one of its
partitions' status entries.

Named as what it is: a stand-in for kubelets and worker processes, which the local
cluster's end-to-end tests run for real.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import lease_clock, names
from dedup_contract.timefmt import format_micro_time, format_time, parse_time
from support.operator_helpers import get_pipeline

LEASE_S = 3


def _now() -> str:
    return format_time(datetime.now(UTC))


class Kubelets:
    """The node agents and workers of a few fake nodes, in one thread."""

    def __init__(self, api: client.ApiClient, namespace: str, nodes: list[str], label: str) -> None:
        self.core = client.CoreV1Api(api)
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.nodes = nodes
        self.label = label
        self.up = set(nodes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[str] = []
        self.volumes: list[str] = []
        self._lock = threading.Lock()  # a lost node gets no late heartbeat
        self._seen = lease_clock.LeaseClock()  # the fake workers' observations

    def create_volumes(self, pipeline: str, partitions: int) -> None:
        """Static PVs pre-bound to the pipeline's claims (no provisioner here)."""
        for p in range(partitions):
            claim = names.volume_claim(pipeline, p)
            self.core.create_persistent_volume(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": f"{self.namespace}-{claim}"[:63]},
                    "spec": {
                        "capacity": {"storage": "10Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "",
                        "hostPath": {"path": f"/tmp/{self.namespace}/{claim}"},
                        "claimRef": {"namespace": self.namespace, "name": claim},
                        "persistentVolumeReclaimPolicy": "Delete",
                    },
                }
            )
            self.volumes.append(f"{self.namespace}-{claim}"[:63])

    def create_nodes(self) -> None:
        for name in self.nodes:
            self.core.create_node(
                client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={self.label: "yes"}))
            )
            self._report(name, True, transition=True)

    def delete_nodes(self) -> None:
        for name in self.volumes:
            with contextlib.suppress(ApiException):
                self.core.delete_persistent_volume(name)
        for name in self.nodes:
            with contextlib.suppress(ApiException):
                self.core.delete_node(name)

    def _report(self, node: str, ready: bool, transition: bool = False) -> None:
        capacity = {"cpu": "8", "memory": "16Gi", "pods": "110"}
        cond: dict[str, Any] = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletStopped",
            "lastHeartbeatTime": _now(),
        }
        if transition:
            cond["lastTransitionTime"] = _now()
        self.core.patch_node_status(
            node,
            {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [cond]}},
        )

    def cordon(self, node: str, unschedulable: bool = True) -> None:
        """The scheduler places no new pod on `node` (or again, with False)."""
        self.core.patch_node(node, {"spec": {"unschedulable": unschedulable}})

    def lose(self, node: str) -> None:
        """The node stops: no heartbeats, its pods stop renewing; reported NotReady."""
        with self._lock:
            self.up.discard(node)
            self._report(node, False, transition=True)

    def back(self, node: str) -> None:
        with self._lock:
            self.up.add(node)
            self._report(node, True, transition=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                with self._lock:
                    self._step()
            except ApiException as exc:
                if exc.status not in (404, 409):
                    self.errors.append(f"{exc.status} {exc.reason}")

    def _step(self) -> None:
        for node in list(self.up):
            self._report(node, True)
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}"
        ).items
        for pod in pods:
            node = pod.spec.node_name
            if node not in self.up:
                continue
            name = pod.metadata.name
            if pod.metadata.deletion_timestamp is not None:
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
                continue
            if pod.status.phase != "Running":
                self.core.patch_namespaced_pod_status(
                    name,
                    self.namespace,
                    {
                        "status": {
                            "phase": "Running",
                            "conditions": [
                                {"type": "Ready", "status": "True", "lastTransitionTime": _now()}
                            ],
                        }
                    },
                )
            self._hold_lease(pod)

    def _hold_lease(self, pod: Any) -> None:
        """The worker's rule (docs/design.md, "The partition Lease";
        `dedup_contract.lease_clock`): take the Lease iff it is ours, or free or seen
        unchanged for its duration with leaseTransitions < our epoch; then renew it."""
        labels = pod.metadata.labels
        epoch = int(labels[names.LABEL_EPOCH])
        lease_name = names.lease(labels[names.LABEL_PIPELINE], int(labels[names.LABEL_PARTITION]))
        lease = self.leases.read_namespaced_lease(lease_name, self.namespace)
        spec = lease.spec
        now = datetime.now(UTC)
        renew = parse_time(spec.renew_time)
        duration = spec.lease_duration_seconds or 0
        stamp = lease_clock.LeaseStamp(spec.holder_identity, renew, lease.metadata.resource_version)
        expired = lease_clock.expired(
            lease_clock.is_free(
                spec.holder_identity, renew, parse_time(spec.acquire_time), duration
            ),
            self._seen.observe((pod.metadata.name, lease_name), stamp),
            duration,
        )
        ours = spec.holder_identity == pod.metadata.name
        if not ours and not (expired and (spec.lease_transitions or 0) < epoch):
            return
        body = {
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {
                "holderIdentity": pod.metadata.name,
                "leaseTransitions": epoch,
                "renewTime": format_micro_time(now),
                "leaseDurationSeconds": spec.lease_duration_seconds,
            },
        }
        if not ours:
            body["spec"]["acquireTime"] = format_micro_time(now)
        self.leases.patch_namespaced_lease(lease_name, self.namespace, body)

    def __enter__(self) -> Kubelets:
        self.create_nodes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.delete_nodes()


def pipeline(
    bootstrap: str, topic: str, label: str, name: str = "events", partitions: int = 2
) -> dict[str, Any]:
    return {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": names.KIND,
        "metadata": {"name": name},
        "spec": {
            "kafka": {
                "bootstrapServers": bootstrap,
                "inputTopic": topic,
                "outputTopic": f"{topic}-o",
            },
            "partitions": partitions,
            "messageId": {"source": "key"},
            "window": {"maxKeys": 1000},
            "worker": {"nodeSelector": {label: "yes"}},
            "failover": {"nodeLostAfter": "3s", "leaseDuration": f"{LEASE_S}s"},
        },
    }


def entry(api: client.ApiClient, ns: str, p: int, name: str = "events") -> dict[str, Any]:
    found = get_pipeline(api, ns, name) or {}
    for e in (found.get("status") or {}).get("partitions") or []:
        if e["partition"] == p:
            return dict(e)
    return {}
