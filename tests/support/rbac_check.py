"""Did a ServiceAccount ask the API server for anything the chart does not grant it?

An RBAC evaluator of its own (independent of the chart's templates and of
tests/support/chart_rbac.py's table): it takes the rendered ClusterRoles, Roles and
their bindings as `helm template` prints them, and each request of the API server's audit
log (local/dedup_local/control_plane.py writes one), and decides by RBAC's rules whether the
request was allowed: a ClusterRoleBinding grants its ClusterRole everywhere, a
RoleBinding grants its Role or ClusterRole in its own namespace only; a rule matches
when its apiGroups, resources (with `resource/subresource`), verbs and, if any,
resourceNames match, `*` matching anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    """One resource request, as the audit log records it."""

    verb: str
    group: str
    resource: str  # with "/subresource" when there is one
    namespace: str  # "" for cluster-scoped objects and cluster-wide lists
    name: str
    code: int

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " (cluster)"
        named = f" {self.name}" if self.name else ""
        group = f"{self.group}/" if self.group else ""
        return f"{self.verb} {group}{self.resource}{named}{where} -> {self.code}"


def requests(events: Iterable[Mapping[str, Any]]) -> list[Request]:
    """The resource requests of audit events (non-resource URLs such as discovery left
    out: every authenticated user may read those)."""
    out = []
    for event in events:
        ref = event.get("objectRef")
        if not ref or not ref.get("resource"):
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        out.append(
            Request(
                verb=event["verb"],
                group=ref.get("apiGroup", ""),
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=int((event.get("responseStatus") or {}).get("code", 0)),
            )
        )
    return out


def _matches(rule: Mapping[str, Any], req: Request) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values

    names = rule.get("resourceNames") or []
    return (
        has("apiGroups", req.group)
        and has("resources", req.resource)
        and has("verbs", req.verb)
        and (not names or req.name in names)
    )


def allowed(docs: Iterable[Mapping[str, Any]], account: tuple[str, str], req: Request) -> bool:
    """Whether the rendered RBAC objects `docs` let ServiceAccount (namespace, name)
    make `req`."""
    docs = list(docs)
    roles = {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d.get("rules") or []
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
    }

    def bound(binding: Mapping[str, Any]) -> bool:
        return any(
            s.get("kind") == "ServiceAccount" and (s.get("namespace"), s.get("name")) == account
            for s in binding.get("subjects") or []
        )

    for d in docs:
        if d["kind"] not in ("ClusterRoleBinding", "RoleBinding") or not bound(d):
            continue
        ref = d["roleRef"]
        if d["kind"] == "ClusterRoleBinding":
            scope = None  # everywhere
            rules = roles.get(("ClusterRole", "", ref["name"]), [])
        else:
            scope = d["metadata"]["namespace"]
            key = (ref["kind"], scope if ref["kind"] == "Role" else "", ref["name"])
            rules = roles.get(key, [])
        if scope is not None and req.namespace != scope:
            continue
        if any(_matches(rule, req) for rule in rules):
            return True
    return False


def not_granted(
    docs: Iterable[Mapping[str, Any]], account: tuple[str, str], reqs: Iterable[Request]
) -> list[str]:
    """Each distinct request the rendered RBAC does not allow, or that was refused."""
    docs = list(docs)
    bad = {str(r) for r in reqs if r.code == 403 or not allowed(docs, account, r)}
    return sorted(bad)
