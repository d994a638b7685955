"""The chart end to end, as a user installs it, on the local cluster whose pods run in
containers from the built image:

`helm install` from charts/dedup-operator -> two operator pods run from the image under
the chart's ServiceAccount and RBAC (in-cluster config, no kubeconfig) -> a pipeline
applied with kubectl goes Ready -> the node of partition 0 is killed during traffic ->
the partition moves with its volume and the output is exact -> `helm upgrade` with a
changed value rolls the operator without touching the workers -> `helm uninstall`
leaves the CRD, the pipeline, its volumes and its running workers.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from dedup_contract import names
from dedup_local.chart import CHART, LOCAL_CLUSTER_VALUES, helm, template
from dedup_local.cluster import LocalCluster
from dedup_local.kafka import KafkaBroker
from dedup_local.pod_health import unhealthy
from support import rbac_check
from support.cluster_fixtures import ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.operator_helpers import drop_finalizers, wait_for
from support.pipeline_traffic import (
    Traffic,
    assert_output_exact,
    partition_entry,
    ready_pipeline,
    topics,
    wait_moved_off,
    wait_published,
    wait_untainted,
)
from support.pipelines import cluster_pipeline_body

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("containers")]

RELEASE, NAMESPACE = "dedup-operator", "dedup-system"


def helm_on(cluster: LocalCluster, *args: str) -> str:
    result = helm(*args, "--kubeconfig", str(cluster.kubeconfig_path))
    return result.stdout


OPERATOR_SELECTOR = f"app.kubernetes.io/name={RELEASE}"  # the chart's name label


def operator_pods(api: client.ApiClient, namespace: str = NAMESPACE) -> list[Any]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=OPERATOR_SELECTOR)
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


def healthy_operator_pods(
    cluster: LocalCluster, api: client.ApiClient, since: float, namespace: str = NAMESPACE
) -> None:
    """Every operator pod, once they have run 75 s: 0 restarts, no ERROR line, no
    permission warning in its log."""
    time.sleep(max(0.0, since + 75 - time.monotonic()))
    assert len(operator_pods(api, namespace)) == 2
    assert unhealthy(cluster, namespace, OPERATOR_SELECTOR) == []


def asked_only_what_the_chart_grants(
    cluster: LocalCluster, release: str, namespace: str, sets: list[str]
) -> list[rbac_check.Request]:
    """From the API server's audit log: every request of the release's operator
    ServiceAccount is granted by `helm template` of the same values, and none was
    answered 403. Returns the requests."""
    assert cluster.control_plane is not None
    asked = rbac_check.requests(
        cluster.control_plane.audit_events(f"system:serviceaccount:{namespace}:{release}")
    )
    assert any(r.namespace == "kube-node-lease" and r.verb == "watch" for r in asked)
    rendered = template(sets=sets, namespace=namespace, release=release)
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert rbac_check.not_granted(docs, (namespace, release), asked) == []
    return asked


def worker_state(api: client.ApiClient, ns: str) -> dict[str, tuple[str, str, int]]:
    """Each worker pod: (uid, containerID, restarts) — unchanged means undisturbed."""
    pods = client.CoreV1Api(api).list_namespaced_pod(
        ns, label_selector=f"{names.LABEL_PIPELINE}=events"
    )
    state = {}
    for pod in pods.items:
        if pod.metadata.deletion_timestamp:
            continue
        (status,) = pod.status.container_statuses or [None]
        assert status is not None, pod.metadata.name
        state[pod.metadata.name] = (pod.metadata.uid, status.container_id, status.restart_count)
    return state


def test_helm_install_failover_upgrade_uninstall(
    container_cluster: LocalCluster,
    container_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
) -> None:
    cluster, ns = container_cluster, container_namespace.name
    api = container_namespace.api_client
    sets = [arg for value in LOCAL_CLUSTER_VALUES for arg in ("--set", value)]
    helm_on(cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--create-namespace", *sets, "--wait", "--timeout", "240s")  # fmt: skip
    installed = time.monotonic()
    lost: str | None = None
    try:
        ops = operator_pods(api)
        assert len(ops) == 2, [p.metadata.name for p in ops]
        for pod in ops:
            (status,) = pod.status.container_statuses
            assert status.ready and status.container_id.startswith("podman://"), status
            assert pod.spec.service_account_name == RELEASE
            container = pod.spec.containers[0]
            # In-cluster config: the pod's token and CA, no kubeconfig anywhere.
            assert not any("kubeconfig" in arg for arg in container.args or [])
            assert "KUBECONFIG" not in {e.name for e in container.env or []}

        topic = topics(kafka, new_topic, 2)
        body = cluster_pipeline_body(
            "events", kafka.bootstrap, topic, cluster.storage_class, 2,
            worker={"batchSize": 200, "lingerMs": 20},
            failover={"nodeLostAfter": "5s", "leaseDuration": "5s"},
        )  # fmt: skip
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
        ready_pipeline(api, ns, "events", 2)
        # Healthy, not only working: the operator pods ran past the ~55 s after which a
        # failing kopf login ended the process (a crash loop no result showed).
        healthy_operator_pods(cluster, api, installed)

        traffic = Traffic(kafka.bootstrap, topic, 2)
        with traffic.running():
            wait_published(kafka.bootstrap, topic, 0, 300)
            before = partition_entry(api, ns, "events", 0)
            lost = before["node"]
            cluster.kill(lost)
            killed = time.monotonic()

            after = wait_moved_off(cluster, ns, "events", 0, lost, timeout=240, every=1)
            print(
                f"partition 0 moved {lost} -> {after['node']} in {time.monotonic() - killed:.0f}s"
            )
            sent = traffic.sent
            wait_for(lambda: traffic.sent > sent + 400, 60, "traffic after the move")
        assert after["epoch"] == before["epoch"] + 1
        assert_output_exact(kafka.bootstrap, topic, traffic)
        cluster.restart(lost)
        wait_untainted(cluster, lost)
        lost = None

        # An upgrade with a changed value rolls the operator, not the workers.
        workers = worker_state(api, ns)
        old_ops = {p.metadata.name for p in operator_pods(api)}
        helm_on(cluster, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--reuse-values", "--set", "operator.logLevel=DEBUG",
                "--wait", "--timeout", "240s")  # fmt: skip
        cluster.kubectl("rollout", "status", "-n", NAMESPACE, f"deployment/{RELEASE}",
                        "--timeout=240s", timeout=260)  # fmt: skip
        upgraded = time.monotonic()
        new_ops = {p.metadata.name for p in operator_pods(api)}
        assert new_ops and not (new_ops & old_ops), (old_ops, new_ops)
        assert worker_state(api, ns) == workers
        ready_pipeline(api, ns, "events", 2)
        healthy_operator_pods(cluster, api, upgraded)

        # Every request of the operator's ServiceAccount over the whole run (failover
        # included) is one the chart grants under its default rbac.scope (cluster), and
        # none was answered 403: from the API server's audit log.
        asked_only_what_the_chart_grants(cluster, RELEASE, NAMESPACE, list(LOCAL_CLUSTER_VALUES))

        # Uninstalling the operator leaves the API, the pipeline, its volumes and workers.
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        wait_for(lambda: not operator_pods(api), 120, "the operator pods to go")
        crds = cluster.kubectl("get", "crd", "-o", "name").stdout
        assert f"customresourcedefinition.apiextensions.k8s.io/{names.PLURAL}.{names.GROUP}" in crds
        claims = client.CoreV1Api(api).list_namespaced_persistent_volume_claim(ns).items
        assert sorted(c.metadata.name for c in claims) == ["events-p0", "events-p1"]
        assert worker_state(api, ns).keys() == workers.keys()
    finally:
        if lost is not None:
            cluster.restart(lost)
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found")
        drop_finalizers(api, ns, "events")


def test_helm_install_under_namespaced_rbac_asks_nothing_it_is_not_granted(
    container_cluster: LocalCluster,
    container_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
) -> None:
    """The chart under `rbac.scope: namespaced` (a Role in the watched namespace, the
    cluster-scoped rules in a small ClusterRole): a pipeline goes Ready under it, the
    operator pods run 75 s with 0 restarts, no ERROR line and no permission warning, and
    the API server's audit log holds no request of theirs that the rendered chart does
    not grant and no 403."""
    cluster, ns = container_cluster, container_namespace.name
    api = container_namespace.api_client
    release, namespace = "dedup-operator-scoped", "dedup-scoped"
    values = [*LOCAL_CLUSTER_VALUES, "rbac.scope=namespaced", f"watchNamespaces={{{ns}}}"]
    sets = [arg for value in values for arg in ("--set", value)]
    helm_on(cluster, "install", release, str(CHART), "--namespace", namespace,
            "--create-namespace", *sets, "--wait", "--timeout", "240s")  # fmt: skip
    installed = time.monotonic()
    try:
        topic = topics(kafka, new_topic, 2)
        body = cluster_pipeline_body(
            "events", kafka.bootstrap, topic, cluster.storage_class, 2,
            worker={"batchSize": 200, "lingerMs": 20},
        )  # fmt: skip
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
        ready_pipeline(api, ns, "events", 2)
        healthy_operator_pods(cluster, api, installed, namespace)
        asked = asked_only_what_the_chart_grants(cluster, release, namespace, values)
        # it did its work in the watched namespace, through the namespaced Role
        assert {r.namespace for r in asked if r.resource == "pods" and r.verb == "create"} == {ns}
    finally:
        helm_on(cluster, "uninstall", release, "--namespace", namespace, "--ignore-not-found")
        drop_finalizers(api, ns, "events")
