"""The tests' own RBAC evaluator (tests/support/rbac_check.py) on hand-made objects: a
checker that allowed everything would pass every audit-log test."""

from __future__ import annotations

from typing import Any

from support.rbac_check import Request, allowed, not_granted, requests

SA = ("ops", "op")
SUBJECTS = [{"kind": "ServiceAccount", "namespace": "ops", "name": "op"}]
DOCS: list[dict[str, Any]] = [
    {"kind": "ClusterRole", "metadata": {"name": "c"},
     "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"]}]},
    {"kind": "ClusterRoleBinding", "metadata": {"name": "c"},
     "roleRef": {"kind": "ClusterRole", "name": "c"}, "subjects": SUBJECTS},
    {"kind": "Role", "metadata": {"name": "r", "namespace": "a"},
     "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "resourceNames": ["leader"], "verbs": ["get", "update"]},
               {"apiGroups": ["dedup.io"], "resources": ["deduppipelines/status"],
                "verbs": ["patch"]}]},
    {"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "a"},
     "roleRef": {"kind": "Role", "name": "r"}, "subjects": SUBJECTS},
    # bound to someone else: grants the ServiceAccount nothing
    {"kind": "Role", "metadata": {"name": "x", "namespace": "a"},
     "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
    {"kind": "RoleBinding", "metadata": {"name": "x", "namespace": "a"},
     "roleRef": {"kind": "Role", "name": "x"},
     "subjects": [{"kind": "ServiceAccount", "namespace": "ops", "name": "other"}]},
]  # fmt: skip


def req(verb: str, group: str, resource: str, ns: str = "", name: str = "") -> Request:
    return Request(verb, group, resource, ns, name, 200)


def test_rules_scopes_and_names() -> None:
    assert allowed(DOCS, SA, req("watch", "", "nodes"))
    assert allowed(DOCS, SA, req("get", "", "nodes", name="n1"))
    assert not allowed(DOCS, SA, req("patch", "", "nodes", name="n1"))
    assert allowed(DOCS, SA, req("update", "coordination.k8s.io", "leases", "a", "leader"))
    assert not allowed(DOCS, SA, req("update", "coordination.k8s.io", "leases", "a", "other"))
    assert not allowed(DOCS, SA, req("update", "coordination.k8s.io", "leases", "b", "leader"))
    assert not allowed(DOCS, SA, req("list", "coordination.k8s.io", "leases", "a"))
    assert allowed(DOCS, SA, req("patch", "dedup.io", "deduppipelines/status", "a", "p"))
    assert not allowed(DOCS, SA, req("patch", "dedup.io", "deduppipelines", "a", "p"))
    assert not allowed(DOCS, ("ops", "op2"), req("watch", "", "nodes"))


def test_audit_events_become_requests_and_a_403_is_reported() -> None:
    events = [
        {"verb": "watch", "objectRef": {"resource": "nodes"}, "responseStatus": {"code": 200}},
        {"verb": "get", "requestURI": "/version", "responseStatus": {"code": 200}},
        {"verb": "get", "objectRef": {"resource": "nodes", "name": "n1"},
         "responseStatus": {"code": 403}},
        {"verb": "patch", "objectRef": {"apiGroup": "dedup.io", "resource": "deduppipelines",
         "subresource": "status", "namespace": "a", "name": "p"}, "responseStatus": {"code": 200}},
        {"verb": "list", "objectRef": {"apiGroup": "coordination.k8s.io", "resource": "leases",
         "namespace": "kube-node-lease"}, "responseStatus": {"code": 200}},
    ]  # fmt: skip
    reqs = requests(events)
    assert len(reqs) == 4  # /version is no resource request
    assert not_granted(DOCS, SA, reqs) == [
        "get nodes n1 (cluster) -> 403",
        "list coordination.k8s.io/leases in kube-node-lease -> 200",
    ]
