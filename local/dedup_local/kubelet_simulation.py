"""A simulation of kubelets and worker processes on the bare control plane, for the
operator's tests and `bench/operator_scale.py`: named as a simulation, because the local
cluster's end-to-end tests and the demo run real ones.

`Kubelets` plays the node agents of a set of nodes and the workers on them, in one
thread: it heartbeats the nodes that are up, reports bound worker pods Running and
Ready, finishes graceful deletions, and renews each running worker's Lease by the
worker's own rule (take it iff ours, or free or seen unchanged for its duration with
leaseTransitions below our epoch; `dedup_contract.lease_clock`). `taken` records when
each Lease was first renewed at each epoch (a replacement's first renewal).

It does not serve /metrics, and a step renews every Lease with one request each: at
hundreds of workers a step takes seconds (`step_seconds` says how long).
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import lease_clock, names
from dedup_contract.timefmt import format_micro_time, format_time, parse_time


def _now() -> str:
    return format_time(datetime.now(UTC))


class Kubelets:
    """The node agents and workers of a few fake nodes, in one thread."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        nodes: list[str],
        label: str,
        cpus: int = 8,  # each node's capacity (a worker requests 500m by default)
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.nodes = nodes
        self.label = label
        self.cpus = cpus
        self.up = set(nodes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[str] = []
        self.volumes: list[str] = []
        self._lock = threading.Lock()  # a lost node gets no late heartbeat
        self._seen = lease_clock.LeaseClock()  # the simulated workers' observations
        # (Lease name, epoch) -> monotonic time of its first renewal at that epoch
        self.taken: dict[tuple[str, int], float] = {}
        self.step_seconds: list[float] = []  # how long each step took

    def create_volumes(self, pipeline: str, partitions: int) -> None:
        """Static PVs pre-bound to the pipeline's claims (no provisioner here)."""
        for p in range(partitions):
            claim = names.volume_claim(pipeline, p)
            name = f"{self.namespace}-{claim}"[:63]
            volume: Any = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "hostPath": {"path": f"/tmp/{self.namespace}/{claim}"},
                    "claimRef": {"namespace": self.namespace, "name": claim},
                    "persistentVolumeReclaimPolicy": "Delete",
                },
            }
            self.core.create_persistent_volume(volume)
            self.volumes.append(name)

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
        capacity = {"cpu": str(self.cpus), "memory": f"{2 * self.cpus}Gi", "pods": "110"}
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
                    began = time.monotonic()
                    self._step()
                    self.step_seconds.append(time.monotonic() - began)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    self.errors.append(f"{exc.status} {exc.reason}")

    def _step(self) -> None:
        for node in list(self.up):
            self._report(node, True)
        pods: list[Any] = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}"
        ).items
        # every Lease read at once (one request a step, not one a worker: hundreds of
        # simulated workers renew within a step)
        listed: list[Any] = self.leases.list_namespaced_lease(self.namespace).items
        leases = {lease.metadata.name: lease for lease in listed}
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
            self._hold_lease(pod, leases)

    def _hold_lease(self, pod: Any, leases: dict[str, Any]) -> None:
        """The worker's rule (docs/design.md, "The partition Lease";
        `dedup_contract.lease_clock`): take the Lease iff it is ours, or free or seen
        unchanged for its duration with leaseTransitions < our epoch; then renew it."""
        labels = pod.metadata.labels
        epoch = int(labels[names.LABEL_EPOCH])
        lease_name = names.lease(labels[names.LABEL_PIPELINE], int(labels[names.LABEL_PARTITION]))
        lease = leases.get(lease_name)
        if lease is None:  # created after this step's read: the next step
            return
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
        self.taken.setdefault((lease_name, epoch), time.monotonic())

    def __enter__(self) -> Kubelets:
        self.create_nodes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.delete_nodes()


def simulated_pipeline(
    bootstrap: str,
    topic: str,
    label: str,
    name: str,
    partitions: int,
    failover: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A DedupPipeline whose workers go to the simulated nodes labelled `label` (ids from
    the key, a small window: nothing here reads records); `failover`: spec.failover,
    None for the CRD's defaults."""
    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": bootstrap, "inputTopic": topic, "outputTopic": f"{topic}-o"},
        "partitions": partitions,
        "messageId": {"source": "key"},
        "window": {"maxKeys": 1000},
        "worker": {"nodeSelector": {label: "yes"}},
    }
    if failover is not None:
        spec["failover"] = failover
    return {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": names.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
