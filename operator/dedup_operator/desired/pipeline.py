"""Per pipeline: the workers' ServiceAccount, a Role that lets them read and renew their
own Leases and nothing else, its RoleBinding, the headless Service of the workers'
metrics, and a PodDisruptionBudget (one worker at a time may be evicted: a drain moves
the pipeline's partitions one after the other)."""

from __future__ import annotations

from typing import Any

from dedup_contract import names
from dedup_operator.desired.owner import Owner, metadata
from dedup_operator.spec import PipelineSpec

RBAC = "rbac.authorization.k8s.io"
LEASE_VERBS = ("get", "update", "patch")


def service_account(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(
            names.service_account(spec.name), owner, names.pipeline_labels(spec.name)
        ),
        "automountServiceAccountToken": True,
    }


def role(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    """get/update/patch on exactly the pipeline's Leases (grows with partitions)."""
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role",
        "metadata": metadata(names.role(spec.name), owner, names.pipeline_labels(spec.name)),
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [names.lease(spec.name, p) for p in range(spec.partitions)],
                "verbs": list(LEASE_VERBS),
            }
        ],
    }


def role_binding(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": metadata(names.role(spec.name), owner, names.pipeline_labels(spec.name)),
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": names.role(spec.name)},
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": names.service_account(spec.name),
                "namespace": spec.namespace,
            }
        ],
    }


def metrics_service(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    """Headless: one DNS record per worker, for Prometheus to scrape each of them."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            names.metrics_service(spec.name), owner, names.pipeline_labels(spec.name)
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.worker_selector(spec.name),
            "ports": [
                {
                    "name": names.METRICS_PORT_NAME,
                    "port": names.METRICS_PORT,
                    "targetPort": names.METRICS_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def disruption_budget(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    """One worker of the pipeline evicted at a time (`kubectl drain`): `minAvailable` of
    all partitions but one, a number. Not `maxUnavailable: 1`: the disruption controller
    computes that from the pods' controller's scale, and a DedupPipeline has no scale
    subresource, so it allowed no eviction ever (a drain hung). A worker that is not Ready
    processes nothing: it may be evicted whatever the budget (AlwaysAllow)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(
            names.disruption_budget(spec.name), owner, names.pipeline_labels(spec.name)
        ),
        "spec": {
            "minAvailable": spec.partitions - 1,
            "selector": {"matchLabels": names.worker_selector(spec.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def pipeline_objects(spec: PipelineSpec, owner: Owner) -> list[dict[str, Any]]:
    """Every per-pipeline object, in creation order (the binding after its role)."""
    return [
        service_account(spec, owner),
        role(spec, owner),
        role_binding(spec, owner),
        metrics_service(spec, owner),
        disruption_budget(spec, owner),
    ]
