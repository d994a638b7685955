"""The kubelets' and workers' side of the operator's failover tests on the bare control
plane (tests/integration/test_operator_failover.py, test_operator_stale_leader.py):
`Kubelets` heartbeats the nodes that are up, reports bound pods Running and Ready,
finishes graceful deletions and renews each running worker's Lease the way the worker
does; `pipeline` is the two-partition pipeline those tests run and `entry` one of its
partitions' status entries.

Named as what it is: a stand-in for kubelets and worker processes, which the local
cluster's end-to-end tests run for real.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from dedup_local.kubelet_simulation import Kubelets, simulated_output, simulated_pipeline
from support.operator_helpers import get_pipeline

__all__ = ["LEASE_S", "Kubelets", "entry", "kubelets_in", "pipeline", "simulated_output"]

LEASE_S = 3


def pipeline(
    bootstrap: str,
    topic: str,
    label: str,
    name: str = "events",
    partitions: int = 2,
    lease_s: int = LEASE_S,
    node_lost_s: int = 3,
) -> dict[str, Any]:
    failover = {"nodeLostAfter": f"{node_lost_s}s", "leaseDuration": f"{lease_s}s"}
    return simulated_pipeline(bootstrap, topic, label, name, partitions, failover)


def kubelets_in(
    api: client.ApiClient,
    namespace: str,
    prefix: str,
    count: int,
    cpus: int = 8,
    attach_volumes: bool = False,
) -> Kubelets:
    """`count` simulated nodes for a test in `namespace`: named `<prefix>-a-<suffix>`,
    `<prefix>-b-<suffix>`, ... and labelled `dedup.io/<prefix>-<suffix>` (the suffix is
    the namespace's, so tests running at once never share a node); with
    `attach_volumes`, volumes attached through VolumeAttachments (`Kubelets`)."""
    suffix = namespace[-6:]
    nodes = [f"{prefix}-{chr(ord('a') + i)}-{suffix}" for i in range(count)]
    label = f"dedup.io/{prefix}-{suffix}"
    return Kubelets(api, namespace, nodes, label, cpus=cpus, attach_volumes=attach_volumes)


def entry(api: client.ApiClient, ns: str, p: int, name: str = "events") -> dict[str, Any]:
    found = get_pipeline(api, ns, name) or {}
    for e in (found.get("status") or {}).get("partitions") or []:
        if e["partition"] == p:
            return dict(e)
    return {}
