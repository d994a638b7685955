"""The chart under `rbac.scope: namespaced`, installed as a user installs it, its operator
pods running in containers from the built image on the stand-in node agent (podman).

The chart's end to end under its default values (install, a node killed under traffic,
upgrade, uninstall) runs on real nodes: test_real_cluster_e2e.py. This one stays on the
stand-in: the host runs one real-node cluster at a time and that group is the suite's
longest; what it checks (the namespaced Role's grants against the API server's audit
log) does not depend on the node.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from dedup_local.chart import CHART, LOCAL_CLUSTER_VALUES, helm, template
from dedup_local.cluster import LocalCluster
from dedup_local.kafka import KafkaBroker
from dedup_local.pod_health import unhealthy
from support import rbac_check
from support.cluster_fixtures import ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.operator_helpers import drop_finalizers
from support.pipeline_traffic import (
    ready_pipeline,
    topics,
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
    helm_on(cluster, "install", release, str(CHART), "--take-ownership", "--namespace", namespace,
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
