"""Another team's workload on a node, for the tests that prove the operator never harms a
neighbour: a plain pod of the project's image running `sleep` (each real node has the
image imported; nothing is pulled), bound to the node, tolerating the node's unreachable
and not-ready taints for ever (as a pod with local data may) and not the out-of-service
taint, so that only that taint would evict it."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client import ApiClient

from dedup_local.real_cluster import IMAGE_TAGS
from support.operator_helpers import wait_for
from support.pod_bodies import image_pod

FOREIGN_POD = "team-db-0"


def foreign_pod(api: ApiClient, namespace: str, node_name: str, name: str = FOREIGN_POD) -> str:
    """Creates the pod in `namespace` on `node_name` and waits until it runs; its name."""
    tolerate = [
        {"key": key, "operator": "Exists", "effect": "NoExecute"}
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]
    pod = image_pod(name, IMAGE_TAGS[0], ["sleep", "100000"], namespace)
    pod["spec"].update(nodeName=node_name, tolerations=tolerate)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, pod)
    wait_for(
        lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running",
        90,
        f"pod {namespace}/{name} Running on {node_name}",
    )
    return name
