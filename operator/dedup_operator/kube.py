"""The operator's Kubernetes API calls: the thin shell around the Kubernetes API (Kafka's
admin API is `kafka_admin`, the workers' metrics `dedup_contract.worker_metrics`).
Objects go in and come out as JSON dicts (the API's camelCase form), which is what the
pure modules (desired/, observed, failover) use.

`Kube` is built from one mixin per concern, over `kube_calls.KubeCalls` (what they
share): `kube_watches` (the watches and their caches), `kube_workloads` (the pipeline's
objects, pods and scheduled audit), `kube_nodes` (nodes, heartbeats, out-of-service
taints), `kube_leases` (partition Leases), `kube_volumes` (volume claims and
attachments) and `kube_pipelines` (the pipelines, their status and Events)."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client
from kubernetes.client import ApiClient

from dedup_contract import kube_client
from dedup_operator.cache import WatchedKind
from dedup_operator.event_poster import EventPoster
from dedup_operator.kube_calls import (
    NODE_LEASE_NAMESPACE,
    Conflict,
    NotLeader,
    Obj,
    WatchEvent,
    attached_volume,
)
from dedup_operator.kube_leases import KubeLeases
from dedup_operator.kube_nodes import KubeNodes
from dedup_operator.kube_pipelines import KubePipelines
from dedup_operator.kube_volumes import KubeVolumes
from dedup_operator.kube_watches import KubeWatches
from dedup_operator.kube_workloads import WRITTEN_THROUGH, KubeWorkloads
from dedup_operator.node_marks import NodeMarkBatches

__all__ = [
    "NODE_LEASE_NAMESPACE",
    "WRITTEN_THROUGH",
    "Conflict",
    "Kube",
    "NotLeader",
    "Obj",
    "WatchEvent",
    "api_client",
    "attached_volume",
]


def api_client(
    kubeconfig: str | None = None,
    qps: float = kube_client.DEFAULT_QPS,
    burst: int = kube_client.DEFAULT_BURST,
) -> ApiClient:
    """The operator's client (`kube_client.api_client`): from a kubeconfig, else the pod's
    service account in a cluster, else the default kubeconfig; `qps` requests a second,
    bursts of `burst` (qps 0: no client-side limit)."""
    return kube_client.api_client(kubeconfig or None, qps=qps, burst=burst)


class Kube(KubeWatches, KubeWorkloads, KubeNodes, KubeLeases, KubeVolumes, KubePipelines):
    """Synchronous calls, one ApiClient (kopf runs sync handlers in threads)."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.dynamic_kinds: dict[str, Any] = {}
        self._crds: dict[str, tuple[float, bool]] = {}  # name -> (monotonic time, found)
        self._node_leases_denied_until = 0.0  # monotonic: node Leases refused until then
        self._acting = threading.local()  # per thread: the leadership check of its pass
        # Nodes, node Leases, VolumeAttachments (and the pipelines with their worker pods,
        # volume claims and partition Leases) followed by watches once `watch_cluster()`
        # ran (dedup_operator.cache); each read falls back to a list while one is not synced.
        self._watched: dict[str, WatchedKind] = {}
        self._events: EventPoster | None = None  # Events posted from a thread, once set
        self._on_event: WatchEvent | None = None  # watch events, to wake passes
        # How many node taint writes this process made: nodes judged before the last one
        # are not judged again from memory (`memory.LeaseWatch.node_views`).
        self._node_writes = 0
        self._node_writes_lock = threading.Lock()
        self._mark_batches = NodeMarkBatches()
