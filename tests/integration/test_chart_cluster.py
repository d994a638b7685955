"""The rendered chart on a real kube-apiserver (RBAC authorization on): every object
passes a server-side dry run, the RBAC table holds under `kubectl auth can-i`, and a
real operator process runs a pipeline under nothing but the chart's ServiceAccount."""

from __future__ import annotations

import base64
import concurrent.futures
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_local.chart import CHART, template
from support import rbac_check
from support.chart_rbac import CLUSTER, DENIED_EVERYWHERE, NAMESPACED
from support.kube_fixtures import KubeCluster, KubeNamespace
from support.operator_helpers import get_pipeline, running_operator, wait_for
from support.pipelines import pipeline_body

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]

MONITORING = CHART / "ci" / "namespaced-monitoring-values.yaml"

# STAND-INS, not the real prometheus-operator CRDs (no registry is reachable here): just
# enough for the API server to serve the three kinds, with any content. The dry run of
# the monitoring objects checks their apiVersion, kind, name and namespace, not fields.
STAND_IN_MONITORING_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.monitoring.coreos.com",
            "labels": {"dedup.io/test": "stand-in-for-prometheus-operator"},
        },
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": plural[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    for kind, plural in (
        ("ServiceMonitor", "servicemonitors"),
        ("PodMonitor", "podmonitors"),
        ("PrometheusRule", "prometheusrules"),
    )
]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@contextmanager
def namespaces(cluster: KubeCluster, count: int) -> Iterator[list[str]]:
    core = client.CoreV1Api(cluster.api_client)
    made = [_unique(f"watched{i}") for i in range(count)]
    for name in made:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield made
    finally:
        for name in made:
            core.delete_namespace(name)


@contextmanager
def applied(cluster: KubeCluster, manifests: str) -> Iterator[list[dict[str, Any]]]:
    """Apply rendered manifests for real; delete the cluster-scoped ones afterwards
    (the namespaced ones go with their test namespaces)."""
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    cluster.control_plane.kubectl("apply", "--server-side", "-f", "-", input=manifests)
    try:
        yield docs
    finally:
        for d in docs:
            if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.control_plane.kubectl(
                    "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"
                )


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def render_rbac(release_ns: str, watched: list[str] | None) -> tuple[str, str]:
    """(release name, its ServiceAccount and RBAC objects) with a unique release name;
    `watched`: namespaced scope over those namespaces, else cluster scope."""
    release = _unique("dedup-operator")
    sets = []
    if watched is not None:
        sets = [f"watchNamespaces={{{','.join(watched)}}}", "rbac.scope=namespaced"]
    out = template(sets=sets, namespace=release_ns, release=release).stdout
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] in RBAC_KINDS]
    return release, yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def stand_in_monitoring_crds(
    dedup_crd: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The STAND-IN monitoring.coreos.com CRDs, for this module's dry runs only: installed
    once for both value sets. A CRD deleted between them was still terminating when the
    next one applied its objects (the API server refuses those while it is), so they are
    deleted once, at the end, without waiting for the API server to finish."""
    path = tmp_path_factory.mktemp("monitoring") / "stand-in-monitoring-crds.yaml"
    path.write_text(yaml.safe_dump_all(STAND_IN_MONITORING_CRDS))
    dedup_crd.control_plane.install_crds([path])
    try:
        yield
    finally:
        for crd in STAND_IN_MONITORING_CRDS:
            dedup_crd.control_plane.kubectl(
                "delete", "crd", crd["metadata"]["name"], "--ignore-not-found", "--wait=false"
            )


@pytest.mark.usefixtures("stand_in_monitoring_crds")
@pytest.mark.parametrize("value_set", ["default", "namespaced-monitoring"])
def test_every_rendered_object_passes_a_server_side_dry_run(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace, value_set: str
) -> None:
    with namespaces(dedup_crd, 2) as watched:
        release = _unique("dedup-operator")
        values = (MONITORING,) if value_set != "default" else ()
        sets = [f"watchNamespaces={{{','.join(watched)}}}"] if values else []
        manifests = template(
            values, sets, namespace=kube_namespace.name, release=release, include_crds=True
        ).stdout
        docs = [d for d in yaml.safe_load_all(manifests) if d]
        result = dedup_crd.control_plane.kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=chart-test",
            "-f",
            "-",
            input=manifests,
        )
    kinds = {d["kind"] for d in docs}
    expected = {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole"}
    if values:
        expected |= {"Role", "RoleBinding", "ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert expected <= kinds
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(docs), result.stdout
    assert all(line.endswith("(server dry run)") for line in lines), result.stdout


Row = tuple[str, str, str, str | None, bool]  # verb, resource, subresource, namespace, yes


def can_i(cluster: KubeCluster, sa: str, row: Row) -> bool:
    verb, resource, sub, namespace, _ = row
    args = ["auth", "can-i", verb, resource, f"--as={sa}"]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    if sub:
        args.append(f"--subresource={sub}")
    result = cluster.control_plane.kubectl(*args, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stdout + result.stderr
    return answer == "yes"


def ask_all(cluster: KubeCluster, sa: str, rows: list[Row]) -> list[str]:
    """The rows kubectl answers otherwise than expected, said as a sentence each."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda r: can_i(cluster, sa, r), rows))
    return [
        f"{verb} {resource}{'/' + sub if sub else ''} in {ns or 'all namespaces'}: "
        f"expected {'yes' if want else 'no'}"
        for (verb, resource, sub, ns, want), got in zip(rows, answers, strict=True)
        if got != want
    ]


def _resource(group: str, resource: str, name: str = "") -> tuple[str, str]:
    """(TYPE[/NAME] as kubectl takes it, subresource)."""
    kind, _, sub = resource.partition("/")
    full = f"{kind}.{group}" if group else kind
    return (f"{full}/{name}" if name else full), sub


def granted_rows(ns: str | None, want: bool) -> list[Row]:
    rows: list[Row] = []
    for group, resource, verbs, _why in NAMESPACED:
        full, sub = _resource(group, resource)
        rows += [(verb, full, sub, ns, want) for verb in verbs]
    return rows


def pods_listable(rows: list[Row]) -> list[Row]:
    """The rows with `list pods` answered yes (rbac.listPodsOnNodes)."""
    return [(v, r, sub, ns, want or (v, r) == ("list", "pods")) for v, r, sub, ns, want in rows]


def cluster_rows() -> list[Row]:
    rows: list[Row] = []
    for group, resource, name, verbs, _why in CLUSTER:
        full, sub = _resource(group, resource, name)
        rows += [(verb, full, sub, None, True) for verb in verbs]
    return rows


def denied_rows(namespaces: list[str | None]) -> list[Row]:
    return [
        (verb, res, sub, ns, False) for ns in namespaces for verb, res, sub in DENIED_EVERYWHERE
    ]


SPARK_OPERATOR_CRDS = Path(__file__).resolve().parents[1] / "support" / "spark_operator_crds.yaml"


@pytest.fixture
def spark_operator_kinds(dedup_crd: KubeCluster) -> Iterator[None]:
    """The Spark operator's kinds (stand-in CRDs) for one test, so that kubectl can
    resolve them; removed afterwards (other tests must see no Spark operator)."""
    installed = dedup_crd.control_plane.install_crds([SPARK_OPERATOR_CRDS])
    try:
        yield
    finally:
        for name in installed:
            dedup_crd.control_plane.kubectl("delete", "crd", name, "--ignore-not-found")


@pytest.mark.usefixtures("spark_operator_kinds")
def test_rbac_cluster_scope_under_auth_can_i(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    release, rbac = render_rbac(kube_namespace.name, None)
    sa = f"system:serviceaccount:{kube_namespace.name}:{release}"
    with applied(dedup_crd, rbac), namespaces(dedup_crd, 1) as (other,):
        rows = [
            *granted_rows(other, True),  # every namespace (-A): the same rows anywhere
            *granted_rows(kube_namespace.name, True),
            *granted_rows(None, True),
            *cluster_rows(),
            # the CRD get is for the Spark operator's CRD only
            ("get", "customresourcedefinitions.apiextensions.k8s.io", "", None, False),
            *denied_rows([other, None]),
        ]
        wrong = ask_all(dedup_crd, sa, rows)
    assert wrong == []


@pytest.mark.usefixtures("spark_operator_kinds")
def test_rbac_namespaced_scope_under_auth_can_i(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    with namespaces(dedup_crd, 3) as (first, second, elsewhere):
        release, rbac = render_rbac(kube_namespace.name, [first, second])
        sa = f"system:serviceaccount:{kube_namespace.name}:{release}"
        with applied(dedup_crd, rbac):
            leader = "leases.coordination.k8s.io/dedup-operator-leader"
            rows = [
                *granted_rows(first, True),
                *granted_rows(second, True),
                # nothing of it outside the watched namespaces (no Secrets, no pods) but
                # listing pods, for the lost-node check (rbac.listPodsOnNodes)
                *pods_listable(granted_rows(elsewhere, False)),
                *cluster_rows(),
                ("get", leader, "", kube_namespace.name, True),
                ("update", leader, "", kube_namespace.name, True),
                ("create", "leases.coordination.k8s.io", "", kube_namespace.name, True),
                ("get", "leases.coordination.k8s.io/other", "", kube_namespace.name, False),
                # the nodes' heartbeats, read only
                ("list", "leases.coordination.k8s.io", "", "kube-node-lease", True),
                ("watch", "leases.coordination.k8s.io", "", "kube-node-lease", True),
                ("update", "leases.coordination.k8s.io", "", "kube-node-lease", False),
                ("get", "secrets", "", kube_namespace.name, False),
                # nothing cluster-wide but listing pods
                *pods_listable(granted_rows(None, False)),
                *denied_rows([first, elsewhere, None]),
            ]
            wrong = ask_all(dedup_crd, sa, rows)
    assert wrong == []


def _service_account_kubeconfig(cluster: KubeCluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a TokenRequest token),
    as the operator's pod would in the cluster."""
    token = cluster.control_plane.kubectl(
        "create", "token", sa, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig_path.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("scope", ["namespaced", "cluster"])
def test_the_operator_runs_a_pipeline_with_only_the_charts_rbac(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace, tmp_path: Path, scope: str
) -> None:
    """Under either rbac.scope: every call of a reconcile pass (worker and audit objects,
    whose Roles the API server only lets it create because it holds what they grant; the
    Secret of kafka.securityRef; nodes, node Leases, VolumeAttachments, the Spark CRD,
    the leader Lease) is allowed. From the API server's audit log: every (verb, resource,
    namespace, name) the operator's ServiceAccount asked for is one the rendered chart
    grants (tests/support/rbac_check.py, an RBAC evaluator of its own), none was
    answered 403, and the operator's log has no permission warning. (The operator runs
    with --namespace under both: with -A it would act on other tests' pipelines.)"""
    with namespaces(dedup_crd, 1) as (watched,):
        release, rbac = render_rbac(
            kube_namespace.name, [watched] if scope == "namespaced" else None
        )
        with applied(dedup_crd, rbac):
            core = client.CoreV1Api(dedup_crd.api_client)
            core.create_namespaced_secret(
                watched,
                client.V1Secret(
                    metadata=client.V1ObjectMeta(name="kafka-client"),
                    data={"kafka-config": base64.b64encode(b"client.id=chart-test").decode()},
                ),
            )
            body = pipeline_body(
                "events",
                "127.0.0.1:1",  # no broker: the topic check says KafkaUnreachable
                "events",
                2,
                reconciliation={"schedule": "0 3 * * *"},
            )
            body["spec"]["kafka"]["securityRef"] = {"secretName": "kafka-client"}
            client.CustomObjectsApi(dedup_crd.api_client).create_namespaced_custom_object(
                names.GROUP, names.VERSION, watched, names.PLURAL, body
            )
            kubeconfig = _service_account_kubeconfig(
                dedup_crd, kube_namespace.name, release, tmp_path / "sa.kubeconfig"
            )
            extra = ("--leader-election-namespace", kube_namespace.name)
            with running_operator(kubeconfig, watched, tmp_path / "op.log", extra=extra) as op:
                wait_for(lambda: op.probe("/readyz")[0] == 200, 60, "the operator Ready")

                def done() -> bool:
                    status = (get_pipeline(dedup_crd.api_client, watched, "events") or {}).get(
                        "status"
                    ) or {}
                    return bool(status.get("partitions")) and _has_everything(dedup_crd, watched)

                wait_for(done, 90, "the pipeline's objects and status")
                time.sleep(2)  # a few more passes
                log = op.log()
                leases = client.CoordinationV1Api(dedup_crd.api_client)
                held = leases.read_namespaced_lease("dedup-operator-leader", kube_namespace.name)
                assert held.spec is not None and held.spec.holder_identity  # leader election
            assert op.process.returncode == 0
            released = leases.read_namespaced_lease("dedup-operator-leader", kube_namespace.name)
            assert released.spec is not None and not released.spec.holder_identity
            refused = [
                line
                for line in log.splitlines()
                if re.search(r"Forbidden|forbidden|\b403\b|cannot (watch|list|get)", line)
            ]
            assert refused == []
            account = (kube_namespace.name, release)
            asked = rbac_check.requests(
                dedup_crd.control_plane.audit_events(
                    f"system:serviceaccount:{account[0]}:{account[1]}"
                )
            )
            assert {r.resource for r in asked} >= {"deduppipelines", "leases", "nodes", "pods"}
            # the node Leases (kube-node-lease) and the leader Lease were asked for
            assert any(r.namespace == "kube-node-lease" and r.verb == "watch" for r in asked)
            assert any(r.name == "dedup-operator-leader" for r in asked)
            docs = [d for d in yaml.safe_load_all(rbac) if d]
            assert rbac_check.not_granted(docs, account, asked) == []
            status = (get_pipeline(dedup_crd.api_client, watched, "events") or {})["status"]
            topic = next(c for c in status["conditions"] if c["type"] == "TopicReady")
            assert topic["reason"] == "KafkaUnreachable"  # it read the Secret, then tried


def _has_everything(cluster: KubeCluster, ns: str) -> bool:
    api = cluster.api_client
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    try:
        core.read_namespaced_service_account("events-worker", ns)
        rbac.read_namespaced_role("events-worker", ns)
        rbac.read_namespaced_role_binding("events-worker", ns)
        core.read_namespaced_service("events-workers", ns)
        client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("events-workers", ns)
        rbac.read_namespaced_role("events-reconcile", ns)
        rbac.read_namespaced_role_binding("events-reconcile", ns)
        client.BatchV1Api(api).read_namespaced_cron_job("events-reconcile", ns)
        for p in range(2):
            core.read_namespaced_persistent_volume_claim(f"events-p{p}", ns)
            client.CoordinationV1Api(api).read_namespaced_lease(f"events-p{p}", ns)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    pods = core.list_namespaced_pod(ns, label_selector="dedup.io/pipeline=events").items
    return len(pods) == 2
