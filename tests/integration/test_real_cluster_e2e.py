"""The chart end to end on real nodes (issue 28, fourth stage): a `RealCluster` (three
kubelets with their own containerd, the host's kube-proxy, volumes through real CSI) and
a Kafka broker on the control plane's host address; `helm install` of the chart with the
locally built image (imported into each node's containerd, never pulled) runs the
operator as pods of real nodes; a pipeline of 2 partitions goes Ready with workers on real
nodes and claims of the default StorageClass provisioned by csi-provisioner and attached
by the attach/detach controller; `helm upgrade` with a changed value rolls the operator
and leaves the workers undisturbed; traffic with duplicates comes out exactly once. Then the
node of partition 0 is killed under traffic (shut down, as a cloud reports it): the
replacement on another node mounts the same disk (its VolumeAttachment moved) and the
output stays exact. Health: the operator's and workers' pods 0 restarts, no ERROR line.
`helm uninstall` leaves the CRD, the pipeline, its claims and its running workers.

A partitioned real node, beside another team's pod: with its pods cut off the API server
too, the operator fences the old worker first, does not taint the node, force-deletes only
its own pod, and the partition moves once healed; with only the kubelet stopped, the
worker keeps its Lease and nothing is fenced until the heal. The foreign pod is left
alone; the output stays exact.

On the session's real-node cluster (`local_cluster`), as every test of the local-cluster
group; each test installs the chart and uninstalls it again, and deletes what pipelines an
earlier test left.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kubernetes import client

from dedup_contract import names
from dedup_contract.timefmt import parse_time
from dedup_local.chart import CHART, helm, template
from dedup_local.kafka import KafkaBroker
from dedup_local.paths import versions
from dedup_local.pod_health import log_problems, unhealthy
from dedup_local.real_cluster import RealCluster
from dedup_local.real_csi import DRIVER
from support import rbac_check
from support.cluster_fixtures import RESERVED_NODE, pod_log_tails
from support.foreign_workload import foreign_pod
from support.operator_helpers import (
    condition,
    delete_every_pipeline,
    drop_finalizers,
    events,
    get_pipeline,
    reasons_once_posted,
    wait_for,
    wait_for_event,
)
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

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("local-cluster")]

RELEASE, NAMESPACE, PIPELINE = "dedup-operator", "dedup-system", "events"
OPERATOR_SELECTOR = f"app.kubernetes.io/name={RELEASE}"
WORKER_SELECTOR = f"{names.LABEL_PIPELINE}={PIPELINE}"
# The image as each node's containerd holds it (RealCluster tags it so); never pulled.
PANIC = re.compile(r"^(panic: |fatal error: )|level=(panic|fatal)", re.MULTILINE)
VALUES = ("image.repository=localhost/dedup-operator", "image.tag=dev", "image.pullPolicy=Never")


@pytest.fixture
def real_cluster(local_cluster: RealCluster) -> RealCluster:
    """The session's real-node cluster (tests/support/cluster_fixtures.py)."""
    return local_cluster


def helm_on(cluster: RealCluster, *args: str, timeout: float = 120) -> str:
    result = helm(*args, "--kubeconfig", str(cluster.kubeconfig_path), timeout=timeout)
    return result.stdout


def print_pod_logs(cluster: RealCluster, *namespaces: str) -> None:
    """The end of every pod log of `namespaces`, deleted pods' included: the chart test's
    namespaces are its own, not a `cluster_namespace`, whose failed test's report holds
    them by itself."""
    for namespace in namespaces:
        for title, tail in pod_log_tails(cluster, namespace):
            print(f"--- {title}:\n{tail}")


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


def worker_state(api: client.ApiClient, ns: str) -> dict[str, tuple[str, str, int]]:
    """Each live worker pod: (uid, containerID, restarts); unchanged means undisturbed."""
    state = {}
    for pod in live_pods(api, ns, WORKER_SELECTOR):
        (status,) = pod.status.container_statuses or [None]
        assert status is not None, pod.metadata.name
        state[pod.metadata.name] = (pod.metadata.uid, status.container_id, status.restart_count)
    return state


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


def test_chart_on_real_nodes(
    real_cluster: RealCluster, kafka_broker_factory: Callable[..., KafkaBroker]
) -> None:
    cluster = real_cluster
    t_test = time.monotonic()
    timings: dict[str, float] = {}
    api = cluster.api_client()
    delete_every_pipeline(cluster.api_client())  # an earlier test's, its operator gone

    # Real nodes, as `kubectl get nodes -o wide` shows them: the kubelet's version, the
    # containerd runtime, the bridge address.
    wide = cluster.kubectl("get", "nodes", "-o", "wide", "-L", "topology.kubernetes.io/zone")
    print(wide.stdout)
    rows = {line.split()[0]: line.split() for line in wide.stdout.splitlines()[1:]}
    assert sorted(rows) == cluster.node_names
    for name, row in rows.items():
        # the reserved node may be down: the group's background scenario kills it
        assert row[1] == "Ready" or name == RESERVED_NODE, row
        assert row[4] == f"v{versions()['KUBERNETES_VERSION']}", row
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
        helm_on(cluster, "install", RELEASE, str(CHART), "--take-ownership", "--namespace", NAMESPACE,
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
            print_pod_logs(cluster, ns, NAMESPACE)
            raise
        timings["pipeline applied -> Ready (2 partitions)"] = time.monotonic() - t0

        # An upgrade with a changed value rolls the operator, not the workers.
        undisturbed = worker_state(api, ns)
        old_ops = {p.metadata.name for p in ops}
        assert all(p.status.container_statuses[0].restart_count == 0
                   for p in live_pods(api, NAMESPACE, OPERATOR_SELECTOR))  # fmt: skip
        t0 = time.monotonic()
        helm_on(cluster, "upgrade", RELEASE, str(CHART), "--take-ownership", "--namespace", NAMESPACE,
                "--reuse-values", "--set", "operator.logLevel=DEBUG",
                "--wait", "--timeout", "300s", timeout=330)  # fmt: skip
        cluster.kubectl("rollout", "status", "-n", NAMESPACE, f"deployment/{RELEASE}",
                        "--timeout=240s", timeout=260)  # fmt: skip
        installed = time.monotonic()  # the health checks below are the upgraded pods'
        timings["helm upgrade --wait (operator rolled)"] = installed - t0
        ops = live_pods(api, NAMESPACE, OPERATOR_SELECTOR)
        assert len(ops) == 2 and not ({p.metadata.name for p in ops} & old_ops), (old_ops, ops)
        assert worker_state(api, ns) == undisturbed
        ready_pipeline(api, ns, PIPELINE, 2)

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
            try:
                wait_published(broker.bootstrap, topic, 0, 300)
                wait_published(broker.bootstrap, topic, 1, 300)
            except AssertionError:
                print(json.dumps((get_pipeline(api, ns, PIPELINE) or {}).get("status"), indent=1))
                print_pod_logs(cluster, ns, NAMESPACE)
                raise
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

        # Uninstalling the operator leaves the API, the pipeline, its volumes and workers.
        workers_left = worker_state(api, ns).keys()
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        wait_for(lambda: not live_pods(api, NAMESPACE, OPERATOR_SELECTOR), 120,
                 "the operator pods to go")  # fmt: skip
        crds = cluster.kubectl("get", "crd", "-o", "name").stdout
        assert f"customresourcedefinition.apiextensions.k8s.io/{names.PLURAL}.{names.GROUP}" in crds
        assert get_pipeline(api, ns, PIPELINE) is not None
        claims = client.CoreV1Api(api).list_namespaced_persistent_volume_claim(ns).items
        assert sorted(c.metadata.name for c in claims) == [
            names.volume_claim(PIPELINE, p) for p in range(2)
        ]
        assert worker_state(api, ns).keys() == workers_left
    finally:
        if lost is not None:
            cluster.restart(lost)
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found")
        drop_finalizers(api, ns, PIPELINE)
        timings["test total"] = time.monotonic() - t_test
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})


# ---------------------------------------------------------------- a partitioned real node
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
READS = {"get", "list", "watch"}


class NodeWatch:
    """Polls (0.2 s) whether the node was ever tainted out-of-service, and whether the
    foreign pod was ever deleted, evicted or gone."""

    def __init__(self, cluster: RealCluster, node: str, namespace: str, pod: str) -> None:
        import threading

        self.core = client.CoreV1Api(cluster.api_client())
        self.node, self.namespace, self.pod = node, namespace, pod
        self.tainted: list[float] = []
        self.pod_touched: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                node = self.core.read_node(self.node)
                if OUT_OF_SERVICE in {t.key for t in node.spec.taints or []}:
                    self.tainted.append(time.monotonic() - self._t0)
                pod = self.core.read_namespaced_pod(self.pod, self.namespace)
                if pod.metadata.deletion_timestamp or pod.spec.node_name != self.node:
                    self.pod_touched.append(f"deleting {pod.metadata.deletion_timestamp}")
            except client.exceptions.ApiException as exc:
                if exc.status == 404:
                    self.pod_touched.append("gone (404)")
            except Exception:  # a failed read is no evidence either way
                pass

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class LogKeeper:
    """Keeps a copy of a pod's log, read every 0.3 s: the kubelet deletes a deleted pod's
    log files once it stops its containers (here: when the node is healed)."""

    def __init__(self, cluster: RealCluster, namespace: str, pod: str) -> None:
        import threading

        self.cluster, self.namespace, self.pod = cluster, namespace, pod
        self.text = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                text = self.cluster.pod_log(self.namespace, self.pod)
                if len(text) >= len(self.text):
                    self.text = text
            if self._stop.wait(0.3):
                return

    def __enter__(self) -> LogKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _json_lines(cluster: RealCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    out = []
    for line in cluster.pod_log(ns, pod).splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _log_time(line: dict[str, Any]) -> float:
    """The logging module's `time` field ("2026-11-22 11:47:17,811", the pod's local
    time: UTC in the image)."""
    stamp, millis = str(line["time"]).split(",")
    parsed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return parsed.timestamp() + int(millis) / 1000


def test_partitioned_real_node_fenced_not_tainted_foreign_pod_left_alone(
    real_cluster: RealCluster, kafka_broker_factory: Callable[..., KafkaBroker]
) -> None:
    """Partition 0's worker runs on node X beside another team's pod (another namespace,
    not tolerating the out-of-service taint). X is partitioned: its kubelet stopped
    and its pods cut off the API server (`RealCluster.partition`);
    every container keeps running and reaching Kafka. The old worker pauses by its own
    clock; the operator fences its Lease (run out, holder cleared) before anything else,
    does not taint X (the foreign pod: `TaintBlocked`, the OutOfServiceTaintBlocked Event
    and the FailingOver condition name it), force-deletes only its own pod and waits for
    the detach. Healed, the kubelet stops the old worker, the disk detaches and the
    partition runs on another node; X never tainted, the foreign pod never deleted (nor
    asked to be by the operator), the output exact."""
    cluster = real_cluster
    t_test = time.monotonic()
    timings: dict[str, float] = {}
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    broker = kafka_broker_factory(host=cluster.broker_host)
    topic = f"real-cut-{uuid.uuid4().hex[:8]}"
    for name in (topic, f"{topic}-out", f"{topic}-dlq"):
        broker.create_topic(name, 2)
    ns, team = f"real-cut-{uuid.uuid4().hex[:6]}", f"team-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "namespace", team)
    wait_for(
        lambda: core.list_namespaced_service_account(team).items, 60, f"{team}'s ServiceAccount"
    )
    delete_every_pipeline(cluster.api_client())  # an earlier test's, its broker gone
    sets = [arg for value in VALUES for arg in ("--set", value)]
    helm_on(cluster, "install", RELEASE, str(CHART), "--take-ownership", "--namespace", NAMESPACE,
            "--create-namespace", *sets, "--wait", "--timeout", "300s", timeout=330)  # fmt: skip
    cut: str | None = None
    try:
        body = cluster_pipeline_body(
            PIPELINE, broker.bootstrap, topic, cluster.storage_class, 2,
            worker={"batchSize": 200, "lingerMs": 20},
            failover={"nodeLostAfter": "5s", "leaseDuration": "5s"},
        )  # fmt: skip
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
        ready_pipeline(api, ns, PIPELINE, 2)
        traffic = Traffic(broker.bootstrap, topic, 2)
        with traffic.running():
            wait_published(broker.bootstrap, topic, 0, 300)
            before = partition_entry(api, ns, PIPELINE, 0)
            cut, old_pod = before["node"], before["pod"]
            foreign = foreign_pod(cluster.api_client(), team, cut)
            foreign_ref = f"{team}/{foreign}"
            on_cut = [p for p in core.list_pod_for_all_namespaces().items
                      if p.spec.node_name == cut]  # fmt: skip
            print(
                f"on {cut}: {sorted(f'{p.metadata.namespace}/{p.metadata.name}' for p in on_cut)}"
            )
            claim = names.volume_claim(PIPELINE, 0)
            assert attached_to(cluster, ns, claim, cut)
            with (
                NodeWatch(cluster, cut, team, foreign) as watch,
                LogKeeper(cluster, ns, old_pod) as old_log,
            ):
                cut_at, t0 = time.time(), time.monotonic()
                print(f"partitioned {cut}; pods cut off the API: {cluster.partition(cut)}")

                def fenced() -> dict[str, Any] | None:
                    h = partition_entry(api, ns, PIPELINE, 0).get("handover") or {}
                    return h if "fenced" in (h.get("steps") or {}) else None

                h = wait_for(fenced, 90, "the operator to fence the old worker", every=0.2)
                timings["partitioned -> fenced"] = time.monotonic() - t0
                lease = client.CoordinationV1Api(api).read_namespaced_lease(f"{PIPELINE}-p0", ns)
                assert lease.spec.holder_identity != old_pod, lease.spec
                warned = wait_for_event(
                    api, ns, PIPELINE, "Warning", "OutOfServiceTaintBlocked", timeout=60
                )
                timings["partitioned -> OutOfServiceTaintBlocked"] = time.monotonic() - t0
                print(f"OutOfServiceTaintBlocked: {warned[0]}")
                assert foreign_ref in warned[0] and cut in warned[0], warned
                failing = condition(get_pipeline(api, ns, PIPELINE), "FailingOver")
                print(f"FailingOver: {failing}")
                assert failing and "not tainting" in failing["message"], failing
                assert foreign_ref in failing["message"], failing

                def released() -> dict[str, Any] | None:
                    h = partition_entry(api, ns, PIPELINE, 0).get("handover") or {}
                    return h if "released" in (h.get("steps") or {}) else None

                # The release is recorded before the pod's deletion, its step after.
                h = wait_for(released, 30, "the old pod released", every=0.2)
                print(f"handover while partitioned: {json.dumps(h)}")
                assert h.get("release") == "TaintBlocked", h
                steps = h["steps"]
                assert steps["fenced"] <= steps["released"], steps
                # The old worker, still running and reaching Kafka, stopped committing by
                # its own clock before its Lease ran out for anyone else.
                paused = wait_for(
                    lambda: [x for x in _json_lines(cluster, ns, old_pod)
                             if str(x.get("message", "")).startswith("paused: the")],
                    30, f"{old_pod} to pause",
                )  # fmt: skip
                # The operator does not release it any other way: a while longer, the
                # node stays untainted and the partition waits (the controller's own
                # force-detach is 6 minutes away).
                time.sleep(10)
                assert not watch.tainted, f"{cut} tainted out-of-service at {watch.tainted[:1]}"
                assert partition_entry(api, ns, PIPELINE, 0).get("handover"), "moved already?"
                healed = time.monotonic()
                cluster.heal(cut)  # the pods' rules go too
                after = wait_moved_off(cluster, ns, PIPELINE, 0, cut, timeout=240, every=1)
                timings["healed -> partition 0 Ready elsewhere"] = time.monotonic() - healed
                assert wait_for(
                    lambda: attached_to(cluster, ns, claim, after["node"]), 60, "the disk to move"
                )
                sent = traffic.sent
                wait_for(lambda: traffic.sent > sent + 400, 60, "traffic after the move")
                time.sleep(3)
        print(f"partition 0 moved {cut} -> {after['node']}; handover {after['lastHandover']}")
        last = after["lastHandover"]
        assert after["epoch"] == before["epoch"] + 1
        assert last["release"] == "TaintBlocked" and foreign_ref in last["releaseWhy"], last
        assert min(last["steps"], key=last["steps"].get) == "fenced", last["steps"]
        assert not watch.tainted, f"{cut} was tainted out-of-service"
        assert not watch.pod_touched, watch.pod_touched
        reasons = reasons_once_posted(api, ns, PIPELINE, "OutOfServiceTaintBlocked")
        assert "OutOfServiceTaintBlocked" in reasons and "NodeOutOfService" not in reasons
        other = core.read_namespaced_pod(foreign, team)
        assert other.metadata.deletion_timestamp is None and other.spec.node_name == cut
        assert other.status.phase == "Running", other.status
        assert other.status.container_statuses[0].restart_count == 0, other.status
        # The Lease: the replacement holds it; the old worker's last commit came before
        # it paused, which came before the Lease was taken, before the replacement's
        # first commit.
        lease = client.CoordinationV1Api(api).read_namespaced_lease(f"{PIPELINE}-p0", ns)
        assert lease.spec.holder_identity == after["pod"], lease.spec
        taken = lease.spec.acquire_time.timestamp()
        old_stopped = _log_time(paused[0])
        old_last_commit = float(paused[0]["last_commit"])
        first = wait_for(
            lambda: [x for x in _json_lines(cluster, ns, after["pod"])
                     if x.get("message") == "first transaction committed"],
            60, "the replacement's first commit",
        )  # fmt: skip
        new_first_commit = float(first[0]["commit_sent"])
        fenced_at = parse_time(last["started"]).timestamp() + float(last["steps"]["fenced"])
        print(
            f"after the cut: old last commit {old_last_commit - cut_at:+.2f}s, old paused "
            f"{old_stopped - cut_at:+.2f}s, fenced {fenced_at - cut_at:+.2f}s, Lease taken by "
            f"{after['pod']} {taken - cut_at:+.2f}s, new first commit {new_first_commit - cut_at:+.2f}s"
        )
        assert old_last_commit < old_stopped < fenced_at <= taken <= new_first_commit
        t0 = time.monotonic()
        assert_output_exact(broker.bootstrap, topic, traffic)
        print(f"sent {traffic.sent} records ({traffic.duplicates} duplicates); "
              f"output exact, checked in {time.monotonic() - t0:.1f}s")  # fmt: skip
        # The operator's ServiceAccount asked nothing of the foreign namespace but reads.
        assert cluster.control_plane is not None
        asked = rbac_check.requests(
            cluster.control_plane.audit_events(f"system:serviceaccount:{NAMESPACE}:{RELEASE}")
        )
        touched = [str(r) for r in asked if r.namespace == team and r.verb not in READS]
        assert touched == [], touched
        # Health: the new worker, the other partition's and the operator pods: no restart;
        # ERROR lines only where the test cut a pod off the API server (printed).
        problems = unhealthy(cluster, ns, WORKER_SELECTOR) + unhealthy(
            cluster, NAMESPACE, OPERATOR_SELECTOR
        )
        print("pod problems:\n  " + "\n  ".join(problems))
        # The old worker's log (as kept while it ran: the kubelet deletes a deleted pod's
        # log files): printed, with its ERROR lines.
        print(f"{old_pod}: last lines:\n{old_log.text[-2500:]}")
        print(f"{old_pod}: ERROR lines: {log_problems(old_log.text)}")
        cut_pods = {p.metadata.name for p in on_cut}
        unexpected = [p for p in problems if not any(p.startswith(f"{name}:") for name in cut_pods)]
        assert unexpected == [], unexpected
        wait_untainted(cluster, cut)
    finally:
        if cut is not None:
            cluster.heal(cut)
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found")
        delete_every_pipeline(cluster.api_client())
        cluster.kubectl("delete", "namespace", team, "--wait=false", check=False)
        timings["test total"] = time.monotonic() - t_test
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})


def test_partitioned_real_node_kubelet_only_worker_keeps_its_lease(
    real_cluster: RealCluster, kafka_broker_factory: Callable[..., KafkaBroker]
) -> None:
    """`RealCluster.partition(pods=False)`: the kubelet of node X stopped, while X's pods still
    reach the API server (through the host's kube-proxy rules) and Kafka, beside another
    team's pod. The node is judged lost (its heartbeat Lease stops), but its worker keeps
    renewing its partition Lease, so there is nothing to fence: the operator never clears
    the Lease, never taints X, never touches the foreign pod, and the old worker keeps
    committing (the node's NotReady and the taint-eviction of what does not tolerate it
    cannot stop a container without its kubelet). Healed, the partition runs again
    (where it was, or moved the graceful way) and the output is exact."""
    cluster = real_cluster
    t_test = time.monotonic()
    timings: dict[str, float] = {}
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    broker = kafka_broker_factory(host=cluster.broker_host)
    topic = f"real-stop-{uuid.uuid4().hex[:8]}"
    for name in (topic, f"{topic}-out", f"{topic}-dlq"):
        broker.create_topic(name, 2)
    ns, team = f"real-stop-{uuid.uuid4().hex[:6]}", f"team-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "namespace", team)
    wait_for(
        lambda: core.list_namespaced_service_account(team).items, 60, f"{team}'s ServiceAccount"
    )
    delete_every_pipeline(cluster.api_client())  # an earlier test's, its broker gone
    sets = [arg for value in VALUES for arg in ("--set", value)]
    helm_on(cluster, "install", RELEASE, str(CHART), "--take-ownership", "--namespace", NAMESPACE,
            "--create-namespace", *sets, "--wait", "--timeout", "300s", timeout=330)  # fmt: skip
    cut: str | None = None
    try:
        body = cluster_pipeline_body(
            PIPELINE, broker.bootstrap, topic, cluster.storage_class, 2,
            worker={"batchSize": 200, "lingerMs": 20},
            failover={"nodeLostAfter": "5s", "leaseDuration": "5s"},
        )  # fmt: skip
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
        ready_pipeline(api, ns, PIPELINE, 2)
        traffic = Traffic(broker.bootstrap, topic, 2)
        with traffic.running():
            wait_published(broker.bootstrap, topic, 0, 300)
            before = partition_entry(api, ns, PIPELINE, 0)
            cut, old_pod = before["node"], before["pod"]
            foreign = foreign_pod(cluster.api_client(), team, cut)
            on_cut = [p for p in core.list_pod_for_all_namespaces().items
                      if p.spec.node_name == cut]  # fmt: skip
            print(
                f"on {cut}: {sorted(f'{p.metadata.namespace}/{p.metadata.name}' for p in on_cut)}"
            )
            with (
                NodeWatch(cluster, cut, team, foreign) as watch,
                LogKeeper(cluster, ns, old_pod) as old_log,
            ):
                t0 = time.monotonic()
                cluster.partition(cut, pods=False)
                print(f"partitioned {cut} (kubelet stopped) running {old_pod}")
                # Past the node's NotReady (8 s) and the unreachable taint's tolerations
                # (10 s): what Kubernetes does to a lost node's pods has been done.
                wait_for(
                    lambda: cluster.node(cut).ready_status() in ("False", "Unknown"),
                    60,
                    f"{cut} NotReady",
                )
                timings["partitioned -> NotReady"] = time.monotonic() - t0
                published = len(output_ids(broker.bootstrap, f"{topic}-out", 0))
                seen: list[dict[str, Any]] = []
                deadline = time.monotonic() + 25
                while time.monotonic() < deadline:
                    h = partition_entry(api, ns, PIPELINE, 0).get("handover")
                    if h and h not in seen:
                        seen.append(h)
                    time.sleep(0.5)
                print(f"handovers seen while partitioned: {json.dumps(seen)}")
                for h in seen:
                    assert "fenced" not in (h.get("steps") or {}), h
                lease = client.CoordinationV1Api(api).read_namespaced_lease(f"{PIPELINE}-p0", ns)
                assert lease.spec.holder_identity == old_pod, lease.spec
                now = len(output_ids(broker.bootstrap, f"{topic}-out", 0))
                print(f"partition 0's output while partitioned: {published} -> {now}")
                assert now > published, "the old worker stopped committing"
                assert not watch.tainted, f"{cut} tainted out-of-service"
                old = core.read_namespaced_pod(old_pod, ns)
                print(f"{old_pod}: deletionTimestamp {old.metadata.deletion_timestamp}")
                healed, healed_at = time.monotonic(), time.time()
                cluster.heal(cut)

                def running_again() -> dict[str, Any] | None:
                    e = partition_entry(api, ns, PIPELINE, 0)
                    return e if e.get("ready") and not e.get("handover") else None

                after = wait_for(running_again, 240, "partition 0 Ready again", every=1)
                timings["healed -> partition 0 Ready"] = time.monotonic() - healed
                sent = traffic.sent
                wait_for(lambda: traffic.sent > sent + 400, 60, "traffic after the heal")
                time.sleep(3)
        print(f"partition 0 after the heal: {after['pod']} on {after['node']}, "
              f"lastHandover {after.get('lastHandover')}")  # fmt: skip
        if after["epoch"] != before["epoch"]:
            # Moved: fenced only once the old worker let go of its Lease, after the heal
            # (the kubelet, running again, stopped the pod the taint-eviction controller
            # had deleted); released without the out-of-service taint.
            last = after["lastHandover"]
            fenced_at = parse_time(last["started"]).timestamp() + float(last["steps"]["fenced"])
            print(f"fenced {fenced_at - healed_at:+.2f}s after the heal; release {last['release']}")
            assert fenced_at > healed_at, last
            assert last["release"] in ("Graceful", "TaintBlocked"), last
        assert not watch.tainted, f"{cut} was tainted out-of-service"
        assert not watch.pod_touched, watch.pod_touched
        reasons = [e[1] for e in events(api, ns, PIPELINE)]
        print(f"pipeline events: {reasons}")
        assert "NodeOutOfService" not in reasons
        other = core.read_namespaced_pod(foreign, team)
        assert other.metadata.deletion_timestamp is None and other.spec.node_name == cut
        assert other.status.phase == "Running", other.status
        assert other.status.container_statuses[0].restart_count == 0, other.status
        t0 = time.monotonic()
        assert_output_exact(broker.bootstrap, topic, traffic)
        print(f"sent {traffic.sent} records ({traffic.duplicates} duplicates); "
              f"output exact, checked in {time.monotonic() - t0:.1f}s")  # fmt: skip
        assert cluster.control_plane is not None
        asked = rbac_check.requests(
            cluster.control_plane.audit_events(f"system:serviceaccount:{NAMESPACE}:{RELEASE}")
        )
        touched = [str(r) for r in asked if r.namespace == team and r.verb not in READS]
        assert touched == [], touched
        problems = unhealthy(cluster, ns, WORKER_SELECTOR) + unhealthy(
            cluster, NAMESPACE, OPERATOR_SELECTOR
        )
        print("pod problems:\n  " + "\n  ".join(problems))
        # The old worker's log (as kept while it ran: the kubelet deletes a deleted pod's
        # log files): printed, with its ERROR lines.
        print(f"{old_pod}: last lines:\n{old_log.text[-2500:]}")
        print(f"{old_pod}: ERROR lines: {log_problems(old_log.text)}")
        cut_pods = {p.metadata.name for p in on_cut}
        unexpected = [p for p in problems if not any(p.startswith(f"{name}:") for name in cut_pods)]
        assert unexpected == [], unexpected
    finally:
        if cut is not None:
            cluster.heal(cut)
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found")
        delete_every_pipeline(cluster.api_client())
        cluster.kubectl("delete", "namespace", team, "--wait=false", check=False)
        timings["test total"] = time.monotonic() - t_test
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
