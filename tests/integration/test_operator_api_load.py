"""The operator's load on the API server does not grow with the cluster: with Nodes,
node Leases, VolumeAttachments and the pipeline's pods, volume claims and Leases
followed by watches (dedup_operator.cache), a reconcile pass makes the same requests
with 3 nodes registered as with 50, and lists nothing. Without the watches, every pass
lists all six.

Requests are counted at the HTTP layer under the kubernetes client (the connection
pool every call goes through), not by the operator's own code. Real kube-apiserver and
controllers; the nodes are registered objects with heartbeat Leases (no kubelets in this
group: pods stay Pending, which changes nothing of what a pass reads)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_operator.kube import Kube
from dedup_operator.memory import NODE_VIEWS_S, LeaseWatch, PipelineMemory
from dedup_operator.reconcile import reconcile
from dedup_operator.settings import ReconcileSettings
from support import pipelines
from support.kafka_fixtures import NewTopic
from support.kube_fixtures import KubeCluster, KubeNamespace
from support.operator_helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]

CLUSTER_WIDE = (
    "/api/v1/nodes",
    "/apis/storage.k8s.io/v1/volumeattachments",
    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
)
PASSES = 3


class CountingPool:
    """Stands between the kubernetes client and its urllib3 pool: counts each request
    by (method, path), apart from watches, and passes it on unchanged."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        parts = urlsplit(url)
        if "watch=true" not in parts.query.lower():
            with self._lock:
                self.requests[(method, parts.path)] += 1
        return self._pool.request(method, url, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def during(self, work: Callable[[], None]) -> Counter[tuple[str, str]]:
        with self._lock:
            before = self.requests.copy()
        work()
        with self._lock:
            return self.requests - before


def counted_kube(kube: KubeCluster) -> tuple[Kube, CountingPool]:
    api = ApiClient(kube.api_client.configuration)
    pool = CountingPool(api.rest_client.pool_manager)
    api.rest_client.pool_manager = pool
    return Kube(api), pool


def register_nodes(api: ApiClient, first: int, count: int, prefix: str) -> list[str]:
    core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
    made = []
    now = datetime.now(UTC)
    for i in range(first, first + count):
        name = f"{prefix}-{i}"
        core.create_node({"metadata": {"name": name, "labels": {"load-test": prefix}}})
        coordination.create_namespaced_lease(
            "kube-node-lease",
            {
                "metadata": {"name": name},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now},
            },
        )
        made.append(name)
    return made


@pytest.fixture
def foreign_nodes(kube: KubeCluster) -> Iterator[tuple[ApiClient, list[str], str]]:
    api = kube.api_client
    prefix = f"load{int(time.time()) % 100000}"
    made: list[str] = []
    try:
        yield api, made, prefix
    finally:
        core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
        for name in made:
            core.delete_node(name)
            coordination.delete_namespaced_lease(name, "kube-node-lease")


def test_requests_per_pass_do_not_grow_with_the_nodes(
    kube: KubeCluster,
    kube_namespace: KubeNamespace,
    dedup_crd: KubeCluster,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    foreign_nodes: tuple[ApiClient, list[str], str],
) -> None:
    api, made, prefix = foreign_nodes
    made += register_nodes(api, 0, 3, prefix)
    topic = new_topic(partitions=2)
    kafka.create_topic(f"{topic}-out", 2)  # TopicReady: the output
    body = pipelines.pipeline_body(
        "events", kafka.bootstrap, topic, 2, dead_letters=False,
        failover={"nodeLostAfter": "5s", "leaseDuration": "5s"},
    )  # fmt: skip
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, kube_namespace.name, names.PLURAL, body
    )
    # the topic and per-pipeline objects checked once, not inside the measured passes
    settings = ReconcileSettings(topic_check_s=3600.0, ensure_s=3600.0)
    memory, lease_watch = PipelineMemory(), LeaseWatch()  # one operator process's

    def passes(kube_client: Kube) -> Callable[[], None]:
        def run() -> None:
            for _ in range(PASSES):
                time.sleep(NODE_VIEWS_S)  # each pass judges the nodes afresh
                reconcile(
                    kube_client,
                    kube_namespace.name,
                    "events",
                    lambda _body: lambda *_event, **_kw: None,
                    settings,
                    memory,
                    lease_watch,
                )

        return run

    listing, listing_pool = counted_kube(kube)
    passes(listing)()  # warm: volumes, Leases, pods created
    listed = listing_pool.during(passes(listing))
    for path in CLUSTER_WIDE:
        assert listed[("GET", path)] == PASSES, (path, listed)

    watching, pool = counted_kube(kube)
    heartbeats: set[str] = set()  # node Leases as the watch delivered them
    partition_leases: set[str] = set()  # the pipeline's Leases as the watch delivered them
    watching.watch_cluster(
        wait_s=30,
        on_heartbeat=lambda lease: heartbeats.add(lease["metadata"]["name"]),
        namespaces=[kube_namespace.name],
        on_partition_lease=lambda lease: partition_leases.add(lease["metadata"]["name"]),
    )
    try:
        passes(watching)()
        few = pool.during(passes(watching))
        made += register_nodes(api, 3, 47, prefix)
        wait_for(
            lambda: sum(1 for n in watching.nodes() if n["metadata"]["name"] in made) == 50,
            30,
            "the watch to see 50 registered nodes",
        )
        many = pool.during(passes(watching))
        assert set(made) <= heartbeats, "each node Lease seen by the watch as it was created"
    finally:
        watching.stop_watching()

    reads_few = Counter({k: v for k, v in few.items() if k[0] == "GET"})
    reads_many = Counter({k: v for k, v in many.items() if k[0] == "GET"})
    print(f"reads per {PASSES} passes: 3 nodes {sum(reads_few.values())}, "
          f"50 nodes {sum(reads_many.values())}; listing every pass: "
          f"{sum(v for k, v in listed.items() if k[0] == 'GET')}")  # fmt: skip
    assert reads_few == reads_many, (reads_few, reads_many)
    for path in CLUSTER_WIDE:
        assert ("GET", path) not in reads_many, (path, reads_many)
    ns = kube_namespace.name
    for path in (
        f"/api/v1/namespaces/{ns}/pods",
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
        f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
    ):  # the pipeline's own objects: watched too, so a pass lists nothing
        assert listed[("GET", path)] == PASSES, (path, listed)
        assert ("GET", path) not in reads_many, (path, reads_many)
    assert partition_leases == {"events-p0", "events-p1"}
    assert sum(reads_many.values()) == sum(reads_few.values()) <= PASSES  # the pipeline


def test_a_standby_watches_the_leases_so_a_new_leader_judges_them_with_history(
    kube: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    """A standby replica's passes only observe (reconcile.watch_leases): when it becomes
    leader, a Lease it saw unchanged for a while is not 'fresh at first sight'."""
    from datetime import timedelta

    from dedup_operator import reconcile as passes
    from dedup_operator.observed import lease_view

    ns = kube_namespace.name
    client.CoordinationV1Api(kube_namespace.api_client).create_namespaced_lease(
        ns,
        {
            "metadata": {"name": "events-p0", "labels": {names.LABEL_PIPELINE: "events"}},
            "spec": {
                "holderIdentity": "events-p0-e1",
                "leaseDurationSeconds": 15,
                "renewTime": datetime.now(UTC),
                "leaseTransitions": 1,
            },
        },
    )
    standby = Kube(kube.api_client)
    watch = LeaseWatch()  # the standby process's
    passes.watch_leases(standby, ns, "events", watch)  # first sight
    time.sleep(2.0)
    passes.watch_leases(standby, ns, "events", watch)
    lease = standby.leases(ns, "events")["events-p0"]
    seen = lease_view(lease, watch.lease_clock).unchanged_for
    assert seen >= timedelta(seconds=2), seen
