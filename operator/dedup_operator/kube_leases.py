"""The pipeline's partition Leases: read (from their watch) and fenced (a run-out
Lease's holder cleared, compare-and-set on the version the operator saw)."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_operator.kube_calls import KubeCalls, Obj, absent


class KubeLeases(KubeCalls):
    """The partition Leases."""

    def leases(self, namespace: str, pipeline: str) -> dict[str, Obj]:
        cached = self._pipeline_objects("leases", namespace, pipeline)
        if cached is not None:
            return cached
        found = self.coordination.list_namespaced_lease(
            namespace, label_selector=f"{names.LABEL_PIPELINE}={pipeline}"
        )
        return {o["metadata"]["name"]: o for o in (self._json(lease) for lease in found.items)}

    def lease(self, namespace: str, name: str) -> Obj | None:
        trusted, held = self._held("leases", namespace, name)
        if trusted:
            return held
        try:
            return self._json(self.coordination.read_namespaced_lease(name, namespace))
        except ApiException as exc:
            if absent(exc):
                return None
            raise

    def fence_lease(self, namespace: str, name: str, resource_version: str | None) -> bool:
        """Clear a run-out Lease's holder (epoch kept), only if it is still at
        `resource_version` (the version the operator saw unchanged for its duration).
        False when it changed meanwhile (409: renewed, look again) or is gone."""
        self._may_act(f"fence Lease {name}")
        body: dict[str, Any] = {"spec": {"holderIdentity": None}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            fenced = self._raw(self.coordination.patch_namespaced_lease, name, namespace, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        self._wrote("leases", fenced)
        return True
