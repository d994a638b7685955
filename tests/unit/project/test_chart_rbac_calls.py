"""Every Kubernetes API call in the operator's code has its row in the chart's RBAC
table (tests/support/chart_rbac.py, which the rendered Roles must equal): a new call
without a grant fails here, before it fails with 403 in somebody's cluster."""

from __future__ import annotations

import re
from pathlib import Path

from support.chart_rbac import CLUSTER_ROWS, NAMESPACED_ROWS, POD_LIST_ROWS

OPERATOR = Path(__file__).resolve().parents[3] / "operator" / "dedup_operator"

# kubernetes-client method name -> verb
VERBS = {
    "create": "create",
    "read": "get",
    "list": "list",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}
CALL = re.compile(
    r"\.(create|read|list|patch|replace|delete)_(namespaced_)?([a-z_]+?)(_for_all_namespaces)?\b"
)
CLUSTER_SCOPED = {"node", "volume_attachment", "custom_resource_definition"}
# the project's own methods and Kafka's, not API calls; custom objects are checked by
# their group in test_chart.py (deduppipelines, the Spark operator's kinds)
NOT_API = {"pod", "if_present", "status", "role_rules", "topics", "custom_object"}
WATCHED_EVERYWHERE_WITH_A = {"pods", "persistentvolumeclaims", "leases"}
GROUPS = {
    "lease": "coordination.k8s.io",
    "cron_job": "batch",
    "pod_disruption_budget": "policy",
    "role": "rbac.authorization.k8s.io",
    "role_binding": "rbac.authorization.k8s.io",
    "volume_attachment": "storage.k8s.io",
    "custom_resource_definition": "apiextensions.k8s.io",
}


def calls() -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, verb, scope: namespaced|cluster|all-namespaces) of every
    kubernetes-client method the operator names (called, or put in a table)."""
    found = set()
    for path in sorted(OPERATOR.rglob("*.py")):
        if path.name.startswith("ctl"):
            continue  # dedupctl: a person's tool, run with their own credentials
        for method, namespaced, kind, everywhere in CALL.findall(path.read_text()):
            if "custom_object" in kind or (kind in NOT_API and not (namespaced or everywhere)):
                continue
            if not namespaced and not everywhere and kind not in CLUSTER_SCOPED:
                continue  # not a kubernetes-client method
            resource = kind.replace("_", "") + "s"
            scope = "all-namespaces" if everywhere else "namespaced" if namespaced else "cluster"
            found.add((GROUPS.get(kind, ""), resource, VERBS[method], scope))
    return found


def test_the_scan_sees_the_calls_it_should() -> None:
    seen = calls()
    assert ("", "secrets", "get", "namespaced") in seen
    assert ("", "pods", "list", "all-namespaces") in seen
    assert ("", "nodes", "patch", "cluster") in seen
    assert ("rbac.authorization.k8s.io", "rolebindings", "create", "namespaced") in seen


def test_every_call_the_operator_makes_is_granted() -> None:
    namespaced = {(g, r, v) for g, r, _, v in NAMESPACED_ROWS}
    cluster = {(g, r, v) for g, r, _, v in CLUSTER_ROWS | POD_LIST_ROWS}
    missing = []
    for group, resource, verb, scope in sorted(calls()):
        grants = namespaced if scope == "namespaced" else cluster
        if scope == "all-namespaces" and resource in WATCHED_EVERYWHERE_WITH_A:
            # the watches over every namespace (kube_watches._watch_pipelines) are made only
            # with -A (cli), where the ClusterRole carries the namespaced rows
            grants = namespaced | cluster
        if (group, resource, verb) not in grants:
            missing.append(f"{verb} {resource}.{group or 'core'} ({scope})")
    assert missing == [], "add the rows to charts/dedup-operator/templates/_rbac.tpl"
