"""A simulation of kubelets and worker processes on the bare control plane, for the
operator's tests and `bench/operator_scale.py`: named as a simulation, because the local
cluster's end-to-end tests and the demo run real ones.

`Kubelets` plays the node agents of a set of nodes and the workers on them: one thread
heartbeats the nodes that are up (a status report every `heartbeat_s`, each step when 0;
with `node_lease_s` also the kube-node-lease Lease that often, as a kubelet does, which
is how the operator judges a node in production), another (woken by pod events) reports
bound worker pods Running and Ready, its worker taking its Lease at once, and finishes
graceful deletions, a third renews each running worker's Lease by the worker's own rule
every third of its duration (`dedup_contract.lease_clock`).
`taken` records when each Lease was first renewed at each epoch (a replacement's first
renewal); `milestones` when a step first saw each pod bound and attached; `step_seconds`
how long each renewal round took. A lost node stops every thread's work for it and is
reported NotReady at once. Pods and Leases are read from watches (the
operator's `cache.WatchedKind`). No /metrics is served.

With `attach_volumes`, volumes are CSI volumes attached by the attach/detach controller
through VolumeAttachments, an attacher plays the external-attacher's role, and a pod is
Running only once its volume is attached to its node. What this simulation does and
still does not do as the real parts: docs/development.md, "The simulated kubelets".
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import lease_clock, names
from dedup_contract.timefmt import format_micro_time, format_time, parse_time
from dedup_local.cluster.attacher import DRIVER, Attacher
from dedup_local.cluster.timings import ClusterTimings
from dedup_operator.cache import WatchedKind
from dedup_operator.kube import NODE_LEASE_NAMESPACE


def _items(response: Any) -> list[dict[str, Any]]:
    """A list call's items as raw JSON (no client models: a step lists a thousand)."""
    return list(json.loads(response.data).get("items") or [])


NODE_LEASE_DURATION_S = ClusterTimings().node_lease_duration_s  # the kubelet's default
CONTROLLER_MANAGED = "volumes.kubernetes.io/controller-managed-attach-detach"


def _now() -> str:
    return format_time(datetime.now(UTC))


class Kubelets:
    """The node agents and workers of a few fake nodes."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        nodes: list[str],
        label: str,
        cpus: int = 8,  # each node's capacity (a worker requests 500m by default)
        heartbeat_s: float = 0.0,  # between a node's status reports (0: every step)
        node_lease_s: float | None = None,  # between heartbeat Lease renewals (None: none)
        attach_volumes: bool = False,  # CSI volumes through VolumeAttachments (above)
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
        self._lock = threading.Lock()  # a lost node's workers renew no more
        self._beat_lock = threading.Lock()  # a lost node gets no late heartbeat
        # the nodes' heartbeats on a thread of their own, as each kubelet is a process of
        # its own: a slow round over a thousand pods must not make every node late
        self._beats = threading.Thread(target=self._beat_forever, daemon=True)
        self._seen = lease_clock.LeaseClock()  # the simulated workers' observations
        # (Lease name, epoch) -> monotonic time of its first renewal at that epoch
        self.taken: dict[tuple[str, int], float] = {}
        self.step_seconds: list[float] = []  # how long each step took
        # pod -> milestone -> monotonic time: a step first saw it "bound" (on an up node,
        # not Running), then "attached" (its volume too), and reported it "running"
        self.milestones: dict[str, dict[str, float]] = {}
        self.heartbeat_s = heartbeat_s
        self._reported: dict[str, float] = {}  # node -> monotonic time of its last report
        self.node_lease_s = node_lease_s
        self._beaten: dict[str, float] = {}  # node -> monotonic time of its last Lease renewal
        self._renewed: dict[str, float] = {}  # pod -> monotonic time of its last renewal
        worker = f"{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}"
        self._start_wanted = threading.Event()
        self._starts = threading.Thread(target=self._start_forever, daemon=True)
        self._pods = WatchedKind(
            f"simulated pods in {namespace}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=worker,
            on_event=lambda *_: self._start_wanted.set(),
        )
        self._leases = WatchedKind(
            f"simulated leases in {namespace}", self.leases.list_namespaced_lease, namespace
        )
        self.attach_volumes = attach_volumes
        self._claims: dict[str, str] = {}  # claim -> its PersistentVolume
        self._attacher = Attacher(api, pool=Path("/nonexistent"), poll_s=1.0)
        self._attach_wanted = threading.Event()
        self._attachments = WatchedKind(
            "simulated volume attachments",
            client.StorageV1Api(api).list_volume_attachment,
            on_event=lambda *_: self._attachments_changed(),
        )
        self._attach_thread = threading.Thread(target=self._attach_forever, daemon=True)

    def _attachments_changed(self) -> None:
        self._attach_wanted.set()  # the attacher's turn
        self._start_wanted.set()  # and a kubelet's: a volume attached starts its pod

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
                    "claimRef": {"namespace": self.namespace, "name": claim},
                    "persistentVolumeReclaimPolicy": "Delete",
                },
            }
            if self.attach_volumes:
                volume["spec"]["csi"] = {"driver": DRIVER, "volumeHandle": name}
            else:
                volume["spec"]["hostPath"] = {"path": f"/tmp/{self.namespace}/{claim}"}
            self.core.create_persistent_volume(volume)
            self.volumes.append(name)
            self._claims[claim] = name

    def create_nodes(self) -> None:
        annotations = {CONTROLLER_MANAGED: "true"} if self.attach_volumes else None
        for name in self.nodes:
            self.core.create_node(
                client.V1Node(
                    metadata=client.V1ObjectMeta(
                        name=name, labels={self.label: "yes"}, annotations=annotations
                    )
                )
            )
            self._report(name, True, transition=True)
            if self.node_lease_s is not None:
                self._heartbeat(name, create=True)

    def _heartbeat(self, node: str, create: bool = False) -> None:
        """The node's Lease in kube-node-lease renewed (created), as its kubelet does."""
        now = format_micro_time(datetime.now(UTC))
        if create:
            lease: Any = {
                "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE},
                "spec": {
                    "holderIdentity": node,
                    "leaseDurationSeconds": NODE_LEASE_DURATION_S,
                    "renewTime": now,
                },
            }
            self.leases.create_namespaced_lease(NODE_LEASE_NAMESPACE, lease)
        else:
            self.leases.patch_namespaced_lease(
                node, NODE_LEASE_NAMESPACE, {"spec": {"renewTime": now}}
            )
        self._beaten[node] = time.monotonic()

    def delete_nodes(self) -> None:
        for name in self.volumes:
            with contextlib.suppress(ApiException):
                self.core.delete_persistent_volume(name)
        for name in self.nodes:
            with contextlib.suppress(ApiException):
                self.core.delete_node(name)
            if self.node_lease_s is not None:
                with contextlib.suppress(ApiException):
                    self.leases.delete_namespaced_lease(name, NODE_LEASE_NAMESPACE)

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
        with self._lock, self._beat_lock:
            self.up.discard(node)
            self._report(node, False, transition=True)

    def wait_for_heartbeat(self, node: str, timeout_s: float = 30.0) -> None:
        """Return just after `node`'s heartbeat Lease is renewed (with `node_lease_s`): a
        node lost then is seen silent by the operator for the longest a renewal period
        allows before nodeLostAfter, so the decision comes as late as it can (a
        failover's worst case, whatever the phase of the node's renewals)."""
        last = self._beaten.get(node)
        deadline = time.monotonic() + timeout_s
        while self._beaten.get(node) == last and time.monotonic() < deadline:
            time.sleep(0.005)

    def back(self, node: str) -> None:
        with self._lock, self._beat_lock:
            self.up.add(node)
            self._report(node, True, transition=True)

    def _beat_forever(self) -> None:
        while not self._stop.wait(0.5):
            for node in sorted(self.up):
                try:
                    with self._beat_lock:
                        if node in self.up:
                            self._beat(node, time.monotonic())
                except ApiException as exc:
                    if exc.status not in (404, 409):
                        self.errors.append(f"{exc.status} {exc.reason}")

    def _beat(self, node: str, now: float) -> None:
        """The node's status report and heartbeat Lease renewal, each when due."""
        if now - self._reported.get(node, float("-inf")) >= self.heartbeat_s:
            self._report(node, True)
            self._reported[node] = now
        if self.node_lease_s is not None and (
            now - self._beaten.get(node, float("-inf")) >= self.node_lease_s
        ):
            self._heartbeat(node)

    def _run(self) -> None:
        """The workers: each Running one renews its Lease when due, a round every 0.5 s."""
        while not self._stop.wait(0.5):
            began = time.monotonic()
            self._act(self._renew, _running, self._pod_list())
            self.step_seconds.append(time.monotonic() - began)

    def _start_forever(self) -> None:
        """The kubelets: woken by each pod or VolumeAttachment event (and every 0.5 s),
        each starts the pods bound to it once their volumes are attached and finishes
        graceful deletions, apart from the workers' renewals (a thousand of them in one
        round took seconds, and a replacement waited behind them: no kubelet does)."""
        while not self._stop.is_set():
            self._start_wanted.wait(0.5)
            self._start_wanted.clear()
            self._act(self._start, _not_running, self._pod_list())

    def _pod_list(self) -> list[dict[str, Any]]:
        """The worker pods, from the watch (a list while it is not in sync)."""
        held_pods = self._pods.items()
        if held_pods is not None:
            return list(held_pods.values())
        return _items(
            self.core.list_namespaced_pod(
                self.namespace,
                label_selector=f"{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}",
                _preload_content=False,
            )
        )

    def _leases_now(self) -> dict[str, Any]:
        leases = self._leases.items()
        if leases is None:
            listed = _items(
                self.leases.list_namespaced_lease(self.namespace, _preload_content=False)
            )
            leases = {lease["metadata"]["name"]: lease for lease in listed}
        return leases

    def _act(self, action: Any, wanted: Any, pods: list[dict[str, Any]]) -> None:
        """`action(pod, leases, attached)` for each pod `wanted(pod)` says, on a node that
        is up, under the lock one pod at a time (a node lost meanwhile: nothing more of
        its pods; the lock taken only for the pods acted on, or the two threads queue
        on it a thousand times a round)."""
        todo = [pod for pod in pods if wanted(pod)]
        if not todo:
            return
        leases = self._leases_now()
        attached = self._attached_now() if self.attach_volumes else set()
        for pod in todo:
            try:
                with self._lock:
                    if (pod.get("spec") or {}).get("nodeName") in self.up:
                        action(pod, leases, attached)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    self.errors.append(f"{exc.status} {exc.reason}")

    def _renew(self, pod: dict[str, Any], leases: dict[str, Any], attached: Any) -> None:
        self._hold_lease(pod, leases)

    def _start(
        self, pod: dict[str, Any], leases: dict[str, Any], attached: set[tuple[str, str]]
    ) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        if meta.get("deletionTimestamp"):
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
            return
        seen = self.milestones.setdefault(name, {})
        if "running" in seen:
            return  # reported: the watch has not brought it back yet
        seen.setdefault("bound", time.monotonic())
        if not self._attached(pod, attached):
            return  # the kubelet waits for its volume
        seen.setdefault("attached", time.monotonic())
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
        seen["running"] = time.monotonic()
        self._hold_lease(pod, leases)  # the worker takes its Lease as it starts

    def _attached_now(self) -> set[tuple[str, str]]:
        """(volume, node) of every VolumeAttachment attached and not being deleted."""
        held = self._attachments.items() or {}
        return {
            (va["spec"]["source"].get("persistentVolumeName"), va["spec"]["nodeName"])
            for va in held.values()
            if (va.get("status") or {}).get("attached")
            and not va["metadata"].get("deletionTimestamp")
        }

    def _attached(self, pod: dict[str, Any], attached: set[tuple[str, str]]) -> bool:
        """Every volume of the pod's claims is attached to its node (always, without
        `attach_volumes`)."""
        if not self.attach_volumes:
            return True
        node = pod["spec"]["nodeName"]
        for volume in pod["spec"].get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is not None and (self._claims.get(claim), node) not in attached:
                return False
        return True

    def _attach_forever(self) -> None:
        """The external-attacher's role, woken by each VolumeAttachment event (and every
        second): the local cluster's rule over the attachments the watch holds."""
        while not self._stop.is_set():
            self._attach_wanted.wait(1.0)
            self._attach_wanted.clear()
            held = self._attachments.items()
            if held is None:
                continue
            try:
                self._attacher.attach(list(held.values()))
            except ApiException as exc:  # a stale view (409, 422: its test failed): again
                if exc.status not in (404, 409, 422):
                    self.errors.append(f"attacher: {exc.status} {exc.reason}")
            except Exception as exc:  # the thread goes on; the bench prints the errors
                self.errors.append(f"attacher: {type(exc).__name__}: {exc}")

    def _hold_lease(self, pod: dict[str, Any], leases: dict[str, Any]) -> None:
        """The worker's rule (docs/design.md, "The partition Lease";
        `dedup_contract.lease_clock`): take the Lease iff it is ours, or free or seen
        unchanged for its duration with leaseTransitions < our epoch; renew it every
        third of its duration."""
        meta = pod["metadata"]
        labels, name = meta["labels"], meta["name"]
        epoch = int(labels[names.LABEL_EPOCH])
        lease_name = names.lease(labels[names.LABEL_PIPELINE], int(labels[names.LABEL_PARTITION]))
        lease = leases.get(lease_name)
        if lease is None:  # created after this step's read: the next step
            return
        spec, version = lease.get("spec") or {}, lease["metadata"]["resourceVersion"]
        holder = spec.get("holderIdentity") or None
        renew = parse_time(spec.get("renewTime"))
        duration = int(spec.get("leaseDurationSeconds") or 0)
        stamp = lease_clock.LeaseStamp(holder, renew, version)
        expired = lease_clock.expired(
            lease_clock.is_free(holder, renew, parse_time(spec.get("acquireTime")), duration),
            self._seen.observe((name, lease_name), stamp),
            duration,
        )
        ours = holder == name
        if not ours and not (expired and int(spec.get("leaseTransitions") or 0) < epoch):
            return
        now = time.monotonic()
        if ours and duration >= 1:
            every = lease_clock.LeaseTiming.for_duration(duration).renew_every_s
            if now - self._renewed.get(name, float("-inf")) < every:
                return  # renewed less than a renew interval ago
        wall = datetime.now(UTC)
        body = {
            "metadata": {"resourceVersion": version},
            "spec": {
                "holderIdentity": name,
                "leaseTransitions": epoch,
                "renewTime": format_micro_time(wall),
                "leaseDurationSeconds": spec.get("leaseDurationSeconds"),
            },
        }
        if not ours:
            body["spec"]["acquireTime"] = format_micro_time(wall)
        try:
            answer: Any = self.leases.patch_namespaced_lease(
                lease_name, self.namespace, body, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 409:  # changed since the watch told us: the next step
                return
            raise
        self._leases.wrote(json.loads(answer.data))  # our renewal, held at once
        self._renewed[name] = now
        self.taken.setdefault((lease_name, epoch), now)

    def __enter__(self) -> Kubelets:
        if self.attach_volumes:
            with contextlib.suppress(ApiException):  # (another simulation's, or the cluster's)
                self._attacher.install_driver()
            self._attachments.start()
            self._attach_thread.start()
        self.create_nodes()
        self._pods.start()
        self._leases.start()
        self._beats.start()
        self._thread.start()
        self._starts.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._starts.join(timeout=10)
        self._beats.join(timeout=10)
        self._pods.stop()
        self._leases.stop()
        self.delete_nodes()
        if self.attach_volumes:
            self._attach_thread.join(timeout=10)
            self._attachments.stop()


def _running(pod: dict[str, Any]) -> bool:
    """A worker that runs: it renews its Lease."""
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get(
        "deletionTimestamp"
    )


def _not_running(pod: dict[str, Any]) -> bool:
    """A pod its kubelet has work for: one to start, or a graceful deletion to finish."""
    return (pod.get("status") or {}).get("phase") != "Running" or bool(
        pod["metadata"].get("deletionTimestamp")
    )


def simulated_output(topic: str, name: str) -> str:
    """The output topic of simulated pipeline `name` reading `topic`: one of its own, as
    the operator requires (no two pipelines share an output: dedup_operator.shared_kafka)."""
    return f"{topic}-{name}-o"


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
        "kafka": {
            "bootstrapServers": bootstrap,
            "inputTopic": topic,
            "outputTopic": simulated_output(topic, name),
        },
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
