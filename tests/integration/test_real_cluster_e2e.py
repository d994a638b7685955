"""The chart end to end on real nodes (issue 28, fourth stage): a `RealCluster` (three
kubelets with their own containerd, the host's kube-proxy, volumes through real CSI) and
a Kafka broker on the control plane's host address; `helm install` of the chart with the
locally built image (imported into each node's containerd, never pulled) runs the
operator as pods of real nodes; a pipeline of 2 partitions goes Ready with workers on real
nodes and claims of the default StorageClass provisioned by csi-provisioner and attached
by the attach/detach controller; traffic with duplicates comes out exactly once. Then the
node of partition 0 is killed under traffic (shut down, as a cloud reports it): the
replacement on another node mounts the same disk (its VolumeAttachment moved) and the
output stays exact. Health: the operator's and workers' pods 0 restarts, no ERROR line.

Own control plane and nodes, as tests/integration/test_real_kubelet.py (its docstring
says why); the module names `kube` to run in the control-plane group's process, where the
other real-node tests run (not the containers group: its session fixture would start a
second, podman-backed cluster beside this one on a 2-core machine).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from dedup_contract import names
from dedup_local.chart import CHART, helm, template
from dedup_local.cluster import ClusterTimings
from dedup_local.image import ensure_image
from dedup_local.kafka import KafkaBroker
from dedup_local.paths import versions
from dedup_local.pod_health import unhealthy
from dedup_local.real_cluster import RealCluster
from dedup_local.real_csi import DRIVER
from support import rbac_check
from support.kube_fixtures import CRD_FILES, KubeCluster
from support.operator_helpers import get_pipeline, wait_for
from support.pipeline_traffic import (
    Traffic,
    assert_output_exact,
    partition_entry,
    ready_pipeline,
    wait_moved_off,
    wait_published,
    wait_untainted,
    worker_ready_line,
)
from support.pipelines import cluster_pipeline_body
from support.worker_helpers import output_ids

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]

RELEASE, NAMESPACE, PIPELINE = "dedup-operator", "dedup-system", "events"
OPERATOR_SELECTOR = f"app.kubernetes.io/name={RELEASE}"
WORKER_SELECTOR = f"{names.LABEL_PIPELINE}={PIPELINE}"
# The image as each node's containerd holds it (RealCluster tags it so); never pulled.
PANIC = re.compile(r"^(panic: |fatal error: )|level=(panic|fatal)", re.MULTILINE)
VALUES = ("image.repository=localhost/dedup-operator", "image.tag=dev", "image.pullPolicy=Never")


@pytest.fixture(scope="module")
def real_cluster(kube: KubeCluster) -> Iterator[RealCluster]:
    del kube  # only for the group's process (see the module docstring)
    t0 = time.monotonic()
    ensure_image()
    cluster = RealCluster(nodes=3, timings=ClusterTimings.fast(), crds=CRD_FILES)
    try:
        cluster.start()
        cluster.startup["total"] = time.monotonic() - t0
        print("cluster start (s):", {k: round(v, 1) for k, v in cluster.startup.items()})
        yield cluster
    finally:
        t0 = time.monotonic()
        cluster.stop()
        print(f"cluster stop: {time.monotonic() - t0:.1f}s")


def helm_on(cluster: RealCluster, *args: str, timeout: float = 120) -> str:
    result = helm(*args, "--kubeconfig", str(cluster.kubeconfig_path), timeout=timeout)
    return result.stdout


def live_pods(api: client.ApiClient, namespace: str, selector: str) -> list[Any]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector)
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


def attachments(cluster: RealCluster, namespace: str, claim: str) -> dict[str, dict[str, Any]]:
    """The VolumeAttachments of the claim's PV by node name."""
    pvc = json.loads(cluster.kubectl("get", "pvc", "-n", namespace, claim, "-o", "json").stdout)
    pv = pvc["spec"]["volumeName"]
    items = json.loads(cluster.kubectl("get", "volumeattachments", "-o", "json").stdout)["items"]
    return {
        va["spec"]["nodeName"]: va
        for va in items
        if va["spec"]["source"].get("persistentVolumeName") == pv
    }


def attached_to(cluster: RealCluster, namespace: str, claim: str, node: str) -> bool:
    found = attachments(cluster, namespace, claim)
    va = found.get(node)
    return list(found) == [node] and va is not None and (va.get("status") or {}).get("attached")


def asked_only_what_the_chart_grants(cluster: RealCluster) -> list[rbac_check.Request]:
    """Every request of the operator's ServiceAccount in the API server's audit log is
    granted by `helm template` of the same values, and none was answered 403."""
    assert cluster.control_plane is not None
    asked = rbac_check.requests(
        cluster.control_plane.audit_events(f"system:serviceaccount:{NAMESPACE}:{RELEASE}")
    )
    rendered = template(sets=list(VALUES), namespace=NAMESPACE, release=RELEASE)
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert rbac_check.not_granted(docs, (NAMESPACE, RELEASE), asked) == []
    return asked


def drop_finalizers(api: client.ApiClient, ns: str, name: str) -> None:
    try:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, names.PLURAL, name, {"metadata": {"finalizers": None}}
        )
    except client.exceptions.ApiException as exc:
        if exc.status != 404:
            raise


def test_chart_on_real_nodes(
    real_cluster: RealCluster, kafka_broker_factory: Callable[..., KafkaBroker]
) -> None:
    cluster = real_cluster
    t_test = time.monotonic()
    timings: dict[str, float] = {}
    api = cluster.api_client()

    # Real nodes, as `kubectl get nodes -o wide` shows them: the kubelet's version, the
    # containerd runtime, the bridge address.
    wide = cluster.kubectl("get", "nodes", "-o", "wide", "-L", "topology.kubernetes.io/zone")
    print(wide.stdout)
    rows = {line.split()[0]: line.split() for line in wide.stdout.splitlines()[1:]}
    assert sorted(rows) == cluster.node_names
    for name, row in rows.items():
        assert row[1] == "Ready" and row[4] == f"v{versions()['KUBERNETES_VERSION']}", row
        assert row[5] == cluster.node(name).node_ip and row[-2].startswith("containerd://"), row
    classes = json.loads(cluster.kubectl("get", "storageclass", "-o", "json").stdout)["items"]
    default = [
        c["metadata"]["name"]
        for c in classes
        if (c["metadata"].get("annotations") or {}).get(
            "storageclass.kubernetes.io/is-default-class"
        )
        == "true"
    ]
    assert default == [cluster.storage_class]

    broker = kafka_broker_factory(host=cluster.broker_host)  # pods reach it there
    topic = f"real-e2e-{uuid.uuid4().hex[:8]}"
    for name in (topic, f"{topic}-out", f"{topic}-dlq"):
        broker.create_topic(name, 2)
    ns = f"real-e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)

    sets = [arg for value in VALUES for arg in ("--set", value)]
    t0 = time.monotonic()
    try:
        helm_on(cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", *sets, "--wait", "--timeout", "300s",
                timeout=330)  # fmt: skip
    except Exception:
        print(cluster.kubectl("get", "pods,events", "-A", "-o", "wide").stdout)
        raise
    installed = time.monotonic()
    timings["helm install --wait"] = installed - t0
    lost: str | None = None
    try:
        ops = live_pods(api, NAMESPACE, OPERATOR_SELECTOR)
        assert len(ops) == 2, [p.metadata.name for p in ops]
        for pod in ops:
            (status,) = pod.status.container_statuses
            assert status.ready and status.container_id.startswith("containerd://"), status
            assert pod.spec.node_name in cluster.node_names
            assert pod.status.pod_ip in {str(a) for a in cluster.node(pod.spec.node_name).network}

        body = cluster_pipeline_body(
            PIPELINE, broker.bootstrap, topic, cluster.storage_class, 2,
            worker={"batchSize": 200, "lingerMs": 20},
            failover={"nodeLostAfter": "5s", "leaseDuration": "5s"},
        )  # fmt: skip
        t0 = time.monotonic()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
        try:
            ready_pipeline(api, ns, PIPELINE, 2)
        except AssertionError:
            print(cluster.kubectl("get", "pods,pvc,events", "-n", ns, "-o", "wide").stdout)
            for pod in client.CoreV1Api(api).list_namespaced_pod(ns).items:
                print(f"--- {pod.metadata.name}:\n{cluster.pod_log(ns, pod.metadata.name)[-3000:]}")
            for pod in ops:
                print(f"--- {pod.metadata.name}:\n"
                      f"{cluster.pod_log(NAMESPACE, pod.metadata.name)[-3000:]}")  # fmt: skip
            raise
        timings["pipeline applied -> Ready (2 partitions)"] = time.monotonic() - t0

        # Workers on real nodes with disks through CSI: each claim of the default class
        # provisioned by the driver, attached by the attach/detach controller to its node.
        workers = live_pods(api, ns, WORKER_SELECTOR)
        assert len(workers) == 2
        for pod in workers:
            (status,) = pod.status.container_statuses
            assert status.container_id.startswith("containerd://"), status
            (claim,) = [v.persistent_volume_claim.claim_name for v in pod.spec.volumes
                        if v.persistent_volume_claim]  # fmt: skip
            pvc = client.CoreV1Api(api).read_namespaced_persistent_volume_claim(claim, ns)
            assert pvc.spec.storage_class_name == cluster.storage_class
            assert attached_to(cluster, ns, claim, pod.spec.node_name), attachments(
                cluster, ns, claim
            )
            assert attachments(cluster, ns, claim)[pod.spec.node_name]["spec"]["attacher"] == (
                DRIVER
            )

        traffic = Traffic(broker.bootstrap, topic, 2)
        with traffic.running():
            wait_published(broker.bootstrap, topic, 0, 300)
            wait_published(broker.bootstrap, topic, 1, 300)
            # Healthy, not only working: the operator pods ran past the ~55 s after which a
            # failing login ended the process; the workers too.
            time.sleep(max(0.0, installed + 75 - time.monotonic()))
            assert unhealthy(cluster, NAMESPACE, OPERATOR_SELECTOR) == []
            assert unhealthy(cluster, ns, WORKER_SELECTOR) == []
            for pod in [*ops, *workers]:  # the logs are read (an empty one proves nothing)
                assert cluster.pod_log(pod.metadata.namespace, pod.metadata.name), pod

            # The operator pod scraped the workers' /metrics at their pod IPs, across
            # nodes (pod to pod through the host): their counters are in the status.
            def scraped() -> dict[str, Any] | None:
                status = (get_pipeline(api, ns, PIPELINE) or {}).get("status") or {}
                return status if (status.get("recordsIn") or 0) > 0 else None

            counted = wait_for(scraped, 90, "the workers' counters in the status", every=2)
            print(f"status counters: recordsIn {counted['recordsIn']}, "
                  f"duplicatesDropped {counted.get('duplicatesDropped')}")  # fmt: skip

            # The node of partition 0 dies under traffic (the cloud reports it shut down:
            # an operator replica may run there too, which would block the taint).
            before = partition_entry(api, ns, PIPELINE, 0)
            lost = before["node"]
            claim = names.volume_claim(PIPELINE, 0)
            assert attached_to(cluster, ns, claim, lost)
            killed = time.monotonic()
            cluster.kill(lost, shutdown=True)
            after = wait_moved_off(cluster, ns, PIPELINE, 0, lost, timeout=240, every=1)
            timings["node killed -> partition 0 Ready elsewhere"] = time.monotonic() - killed
            print(f"partition 0 moved {lost} -> {after['node']}")
            assert wait_for(
                lambda: attached_to(cluster, ns, claim, after["node"]), 60, "the disk to move"
            )
            published_before = len(output_ids(broker.bootstrap, f"{topic}-out", 0))
            sent = traffic.sent
            wait_for(lambda: traffic.sent > sent + 400, 60, "traffic after the move")
        assert after["epoch"] == before["epoch"] + 1
        print(f"handover: {json.dumps(after.get('lastHandover'))}")
        t0 = time.monotonic()
        assert_output_exact(broker.bootstrap, topic, traffic)
        print(f"sent {traffic.sent} records ({traffic.duplicates} duplicates); "
              f"output exact, checked in {time.monotonic() - t0:.1f}s")  # fmt: skip
        # The replacement opened the same disk: its store held the keys (it re-applied
        # at most the few ids published after the store's last write, not a rebuild).
        ready = wait_for(lambda: worker_ready_line(cluster, ns, after["pod"]), 60, "worker ready")
        print(f"replacement worker ready: {ready}")
        assert ready["store_keys"] > 0 and ready["recovered_ids"] < published_before, ready
        assert unhealthy(cluster, ns, WORKER_SELECTOR) == []
        t0 = time.monotonic()
        cluster.restart(lost)
        wait_untainted(cluster, lost)
        timings["killed node restarted and untainted"] = time.monotonic() - t0
        lost = None
        asked = asked_only_what_the_chart_grants(cluster)
        assert any(r.resource == "volumeattachments" for r in asked), [str(r) for r in asked][:20]
        assert all(p.status.container_statuses[0].restart_count == 0
                   for p in live_pods(api, NAMESPACE, OPERATOR_SELECTOR))  # fmt: skip
        # The nodes' own parts: no error of the host's kube-proxy, no panic of a kubelet
        # or containerd; the warnings Kubernetes recorded, by reason (for the record).
        assert cluster.proxy is not None and cluster.proxy.log_errors() == []
        for name in cluster.node_names:
            for component in ("kubelet", "containerd"):
                text = cluster.node(name).log_path(component).read_text(errors="replace")
                assert not PANIC.search(text), f"{name} {component}: {PANIC.search(text)}"
        warnings = cluster.kubectl("get", "events", "-A", "--field-selector", "type=Warning",
                                   "-o", "json").stdout  # fmt: skip
        reasons = Counter(e["reason"] for e in json.loads(warnings)["items"])
        print(f"Warning events by reason: {dict(reasons)}")
    finally:
        if lost is not None:
            cluster.restart(lost)
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found")
        drop_finalizers(api, ns, PIPELINE)
        timings["test total"] = time.monotonic() - t_test
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
