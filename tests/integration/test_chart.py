"""The Helm chart charts/dedup-operator, rendered by the real helm (`make setup-kube`):
lint, determinism, the values schema, install.yaml, the Deployment's shape, the RBAC
rules and the metric names of the alerts and the dashboard. What the API server makes of
the rendered objects is in test_chart_cluster.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dedup_contract import names
from dedup_contract.release import VERSION
from dedup_local.chart import CHART, INSTALL_YAML, helm, install_yaml, template
from dedup_local.paths import free_port

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]

MONITORING = CHART / "ci" / "namespaced-monitoring-values.yaml"
VALUE_SETS = {"default": (), "namespaced-monitoring": (MONITORING,)}


def render(values: tuple[Path, ...] = (), sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(template(values, sets).stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"].get("name"))]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_lint_strict_is_clean(value_set: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in VALUE_SETS[value_set]:
        args += ["--values", str(path)]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout
    assert result.stderr == ""  # e.g. no symlink warnings


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_template_is_byte_identical_across_renders(value_set: str) -> None:
    values = VALUE_SETS[value_set]
    first = template(values, include_crds=True).stdout
    second = template(values, include_crds=True).stdout
    assert first == second and first


def test_install_yaml_is_the_chart_with_default_values() -> None:
    assert INSTALL_YAML.read_text() == install_yaml(), (
        "install.yaml is stale: run make install.yaml"
    )
    docs = [d for d in yaml.safe_load_all(INSTALL_YAML.read_text()) if d]
    assert docs[0]["kind"] == "Namespace" and docs[0]["metadata"]["name"] == "dedup-system"
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "Deployment", "ClusterRole"}
    crd = one(docs, "CustomResourceDefinition")
    top = yaml.safe_load((CHART.parents[1] / "crds" / "dedup.io_dedupPipelines.yaml").read_text())
    assert crd == top


# (values given with --set, what the error must say): each refused by the schema or by
# the chart's own checks, with the path and the reason
BAD_VALUES = [
    (("replicaCount=two",), ["replicaCount", "got string, want integer"]),
    (("replicaCount=0",), ["replicaCount", "minimum"]),
    (("image.pullPolicy=Sometimes",), ["pullPolicy", "'Always', 'IfNotPresent', 'Never'"]),
    (("image.registry=quay.io",), ["image", "additional properties 'registry' not allowed"]),
    (("typo=1",), ["additional properties 'typo' not allowed"]),
    (("watchNamespaces=analytics",), ["watchNamespaces", "got string, want array"]),
    (("watchNamespaces={Bad_NS}",), ["watchNamespaces/0", "does not match pattern"]),
    (("rbac.scope=everywhere",), ["rbac/scope", "'cluster', 'namespaced'"]),
    (("rbac.scope=namespaced",), ["rbac.scope namespaced needs the namespaces in watchNamespaces"]),
    (("operator.interval=0",), ["operator/interval", "exclusiveMinimum"]),
    (("operator.port=70000",), ["operator/port", "maximum"]),
    (("operator.logLevel=TRACE",), ["logLevel", "'DEBUG', 'INFO', 'WARNING'"]),
    (
        ("operator.leaderElection.enabled=false",),
        ["leaderElection.enabled false needs replicaCount 1"],
    ),
    (("resources.limits.gpu=1",), ["resources/limits", "additional properties 'gpu' not allowed"]),
    (("podDisruptionBudget.maxUnavailable=half",), ["podDisruptionBudget/maxUnavailable"]),
    (
        ("metrics.serviceMonitor.interval=often",),
        ["serviceMonitor/interval", "does not match pattern"],
    ),
    (("metrics.prometheusRule.deadLetterRatio=2",), ["deadLetterRatio", "maximum"]),
    (("podLabels.team=null", "podLabels.x=1"), ["podLabels/x", "got number, want string"]),
]


@pytest.mark.parametrize(("sets", "says"), BAD_VALUES, ids=[b[0][0] for b in BAD_VALUES])
def test_bad_values_are_refused_with_a_readable_message(
    sets: tuple[str, ...], says: list[str]
) -> None:
    result = template(sets=sets, check=False)
    assert result.returncode != 0, f"{sets} was accepted"
    for words in says:
        assert words in result.stderr, result.stderr


def test_the_operator_deployment() -> None:
    docs = render()
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    (container,) = pod["containers"]
    # the default tag is the release's (appVersion: tests/unit/project/test_release.py)
    assert container["image"] == f"ghcr.io/dedup-operator/dedup-operator:{VERSION}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["args"][:2] == ["dedup-operator", "--all-namespaces"]
    assert "--health-port=8080" in container["args"] and "--metrics-port=8080" in container["args"]
    assert {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in container["env"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": names.RUN_AS_USER,
        "runAsGroup": names.RUN_AS_USER,
        "fsGroup": names.RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsUser"] == names.RUN_AS_USER
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]

    local = render(
        sets=(
            "image.repository=localhost/dedup-operator",
            "image.tag=dev",
            "operator.bindPodIP=true",
        )
    )
    (container,) = one(local, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "localhost/dedup-operator:dev"
    assert "--health-address=$(POD_IP)" in container["args"]
    assert "--metrics-address=$(POD_IP)" in container["args"]
    assert {
        "name": "POD_IP",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    } in container["env"]
    namespaced = render((MONITORING,))
    (container,) = one(namespaced, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == [
        "dedup-operator",
        "--namespace=analytics",
        "--namespace=payments",
    ]
    single = render(sets=("replicaCount=1", "operator.leaderElection.enabled=false"))
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]
    (container,) = one(single, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--no-leader-election" in container["args"]


def rules_of(doc: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, resourceName or '', verb) rows of a Role or ClusterRole."""
    rows = set()
    for rule in doc["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    for verb in rule["verbs"]:
                        rows.add((group, resource, name, verb))
    return rows


def test_rbac_by_scope() -> None:
    from support.chart_rbac import CLUSTER_ROWS, NAMESPACED_ROWS, POD_LIST_ROWS

    docs = render()
    cluster_role = one(docs, "ClusterRole")
    assert rules_of(cluster_role) == CLUSTER_ROWS | NAMESPACED_ROWS
    # the node Leases' watch and the leader election under the default scope too (an
    # unclosed `if not $cluster` once left both out of every cluster-scope install)
    cluster_roles = {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "Role"
    }
    assert cluster_roles == {
        ("dedup-system", "dedup-operator-leader-election"),
        ("kube-node-lease", "dedup-operator-node-leases"),
    }
    assert {
        (d["metadata"]["namespace"], d["roleRef"]["name"])
        for d in docs
        if d["kind"] == "RoleBinding"
    } == cluster_roles
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dedup-operator", "namespace": "dedup-system"}
    ]

    docs = render((MONITORING,))
    assert rules_of(one(docs, "ClusterRole")) == CLUSTER_ROWS | POD_LIST_ROWS
    narrow = render((MONITORING,), ("rbac.listPodsOnNodes=false",))
    assert rules_of(one(narrow, "ClusterRole")) == CLUSTER_ROWS
    roles = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "Role"
    }
    assert set(roles) == {
        ("analytics", "dedup-operator"),
        ("payments", "dedup-operator"),
        ("dedup-system", "dedup-operator-leader-election"),
        ("kube-node-lease", "dedup-operator-node-leases"),
    }
    assert rules_of(roles["analytics", "dedup-operator"]) == NAMESPACED_ROWS
    assert rules_of(roles["kube-node-lease", "dedup-operator-node-leases"]) == {
        ("coordination.k8s.io", "leases", "", "list"),
        ("coordination.k8s.io", "leases", "", "watch"),
    }
    assert rules_of(roles["dedup-system", "dedup-operator-leader-election"]) == {
        ("coordination.k8s.io", "leases", "", "create"),
        ("coordination.k8s.io", "leases", "dedup-operator-leader", "get"),
        ("coordination.k8s.io", "leases", "dedup-operator-leader", "update"),
    }
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            verbs = {row[3] for row in rules_of(doc)}
            assert not verbs & {"*", "escalate", "bind", "impersonate"}, doc["metadata"]
            assert "*" not in {row[1] for row in rules_of(doc)}


def test_the_operator_holds_every_permission_it_grants() -> None:
    """Escalation prevention: the worker and audit Roles the operator creates are
    within what the chart gives it in the namespace."""
    from dedup_operator.desired import pipeline, scheduled_audit
    from dedup_operator.desired.owner import Owner
    from dedup_operator.spec import PipelineSpec
    from support.chart_rbac import NAMESPACED_ROWS
    from support.pipelines import pipeline_body

    body = pipeline_body(
        "events", "kafka:9092", "events", 3, reconciliation={"schedule": "0 3 * * *"}
    )
    spec = PipelineSpec.parse("events", "analytics", body["spec"])
    owner = Owner(spec.name, spec.namespace, "uid")
    granted = rules_of(pipeline.role(spec, owner)) | rules_of(scheduled_audit.role(spec, owner))
    held = {(g, r, v) for g, r, _, v in NAMESPACED_ROWS}
    assert {(g, r, v) for g, r, _, v in granted} <= held


# ------------------------------------------------------------------ metric names
EXPRESSION_FIELDS = ("expr", "lhs", "rhs", "args", "param", "vector_selector")


def _selectors(node: Any) -> Iterator[str]:
    """Every metric name a parsed PromQL expression selects."""
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            yield node.name
        return
    if isinstance(node, list | tuple):
        for item in node:
            yield from _selectors(item)
        return
    if not isinstance(node, promql_parser.Expr):
        return
    for attr in EXPRESSION_FIELDS:  # the sub-expressions of any node type
        yield from _selectors(getattr(node, attr, None))


def _exported_names() -> set[str]:
    """Every sample name the worker's and the operator's /metrics can show: the worker's
    scraped from a real worker metrics server, the operator's from its registry's
    exposition (labelled series only appear once used, so by family and type)."""
    import urllib.request

    from prometheus_client import REGISTRY, generate_latest

    import dedup_operator.operator_metrics  # noqa: F401  (registers the operator's metrics)
    from dedup_worker.metrics import Health, WorkerMetrics, serve

    port = free_port()
    server = serve(WorkerMetrics("p", 0), Health(), port, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            worker_text = r.read().decode()
    finally:
        server.shutdown()
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created", ""),
    }
    exported = set()
    for text in (worker_text, generate_latest(REGISTRY).decode()):
        for family in text_string_to_metric_families(text):
            if family.name.startswith("dedup_"):
                exported |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return exported


def _grafana_queries(text: str) -> list[str]:
    dashboard = json.loads(text)
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            queries.append(var["definition"].split("(", 1)[1].rsplit(",", 1)[0])
    # Grafana's own variables stand for a duration or a regex
    return [
        q.replace("$__rate_interval", "5m").replace("$__range", "1h")
        .replace("$namespace", ".*").replace("$pipeline", ".*")
        for q in queries
    ]  # fmt: skip


def test_alerts_and_dashboard_use_only_exported_metric_names() -> None:
    exported = _exported_names()
    assert {"dedup_records_in_total", "dedup_operator_partitions_not_running"} <= exported
    docs = render((MONITORING,))
    rule = one(docs, "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {
        "DedupPartitionNotReady",
        "DedupConsumerLagGrowing",
        "DedupWorkerFenced",
        "DedupWorkerRestarting",
        "DedupHandoverStuck",
        "DedupAuditFailed",
        "DedupDeadLetterRate",
    } <= set(alerts)
    dashboard = one(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    queries = {f"alert {a}": e for a, e in alerts.items()}
    for i, q in enumerate(_grafana_queries(dashboard["data"]["dedup-operator.json"])):
        queries[f"dashboard query {i}"] = q
    for where, expr in queries.items():
        used = set(_selectors(promql_parser.parse(expr)))  # a syntax error raises here
        assert used, f"{where} selects no metric: {expr}"
        assert used <= exported, f"{where} uses {sorted(used - exported)}, not exported"


def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}
    kinds = {d["kind"] for d in render((MONITORING,))}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds


def test_gitops_examples_install_this_chart_with_valid_values(tmp_path: Path) -> None:
    examples = CHART.parents[1] / "examples"
    (argo,) = list(yaml.safe_load_all((examples / "argocd-application.yaml").read_text()))
    source = argo["spec"]["source"]
    assert source["path"] == "charts/dedup-operator"
    assert argo["spec"]["destination"]["namespace"] == "dedup-system"
    assert "ServerSideApply=true" in argo["spec"]["syncPolicy"]["syncOptions"]
    flux = {
        d["kind"]: d for d in yaml.safe_load_all((examples / "flux-helmrelease.yaml").read_text())
    }
    release = flux["HelmRelease"]
    assert release["spec"]["chart"]["spec"]["chart"] == "./charts/dedup-operator"
    assert (
        release["spec"]["chart"]["spec"]["sourceRef"]["name"]
        == flux["GitRepository"]["metadata"]["name"]
    )
    assert release["spec"]["targetNamespace"] == "dedup-system"
    assert release["spec"]["upgrade"]["crds"] == "CreateReplace"
    for name, values in (
        ("argo", source["helm"]["valuesObject"]),
        ("flux", release["spec"]["values"]),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(values))
        assert one(render((path,)), "Deployment")  # the schema accepts them


def test_every_alert_links_its_runbook_under_the_base_url() -> None:
    """Each rendered alert's runbook_url is <runbookBaseURL>/<alert>.md: by default this
    repository's docs/runbooks, whose pages exist (tests/unit/project/test_runbooks.py checks
    what they hold); another base, with or without its slash, is used as given."""
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
    for sets, base in (
        ((), f"{home}/blob/main/docs/runbooks"),
        (("metrics.prometheusRule.runbookBaseURL=https://wiki.example/dedup/",), None),
    ):
        rule = one(render((MONITORING,), sets), "PrometheusRule")
        for r in (r for g in rule["spec"]["groups"] for r in g["rules"]):
            url = r["annotations"]["runbook_url"]
            if base is None:
                assert url == f"https://wiki.example/dedup/{r['alert']}.md"
            else:
                assert url == f"{base}/{r['alert']}.md"
                assert (CHART.parents[1] / "docs" / "runbooks" / f"{r['alert']}.md").is_file()
    refused = template(sets=("metrics.prometheusRule.runbookBaseURL=docs/runbooks",), check=False)
    assert refused.returncode != 0 and "runbookBaseURL" in refused.stderr
