"""The typed seams between a reconcile pass and the Kubernetes API: what it reads
(`ClusterReads`, the observe step's calls) and what it writes (`ClusterWrites`, the
executor's calls and the report's status write), as controller-runtime splits
`client.Reader` from `client.Writer`.

`kube.Kube` is the real shell and satisfies both (`Cluster`); the unit tests' stand-in
(`tests/support/fake_kube.py`) does too, checked by mypy against these Protocols.
Objects go in and come out as JSON dicts (the API's camelCase form).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

Obj = dict[str, Any]


class ClusterReads(Protocol):
    """The reads a pass makes (`observe.py`, and `reconcile.py` for the pipeline
    itself): the pipeline's objects and the cluster's nodes, mostly from watches."""

    def pipeline(self, namespace: str, name: str) -> Obj | None:
        """The DedupPipeline (None: gone)."""
        ...

    def pipelines(self, namespaces: Sequence[str]) -> list[Obj]:
        """Every DedupPipeline in `namespaces` (all namespaces if empty)."""
        ...

    def volume_claims(self, namespace: str, pipeline: str) -> dict[str, Obj]: ...

    def pods(self, namespace: str, pipeline: str) -> list[Obj]:
        """The pipeline's worker pods."""
        ...

    def leases(self, namespace: str, pipeline: str) -> dict[str, Obj]:
        """The pipeline's partition Leases, by name."""
        ...

    def lease(self, namespace: str, name: str) -> Obj | None: ...

    def leases_watched_since(self, namespace: str) -> float | None:
        """Since when (monotonic) the partition Leases of `namespace` have been followed
        by an unbroken watch (None: not watched, or not in sync)."""
        ...

    def nodes(self) -> list[Obj]: ...

    def node_leases(self) -> dict[str, Obj] | None:
        """The nodes' heartbeat Leases by node name (None: unreadable)."""
        ...

    def heartbeats_watched_since(self) -> float | None: ...

    @property
    def node_writes(self) -> int:
        """How many times this process changed a node's taints."""
        ...

    def pods_on_node(self, node: str) -> list[Obj]:
        """Every pod bound to `node`, in any namespace."""
        ...

    def nodes_marked_by(self, owner: str) -> list[str]:
        """The nodes whose out-of-service mark names pipeline `owner`."""
        ...

    def volume_attachments(self, volumes: Iterable[str | None]) -> list[Obj]: ...

    def secret_value(self, namespace: str, name: str, key: str) -> str | None: ...

    def has_crd(self, name: str) -> bool: ...

    def config_map(self, namespace: str, name: str) -> Obj | None: ...

    def spark_applications(self, namespace: str, scheduled: str) -> list[Obj]: ...


class ClusterWrites(Protocol):
    """The writes a pass makes (`executor.py`'s appliers, and the report's status)."""

    def ensure(self, body: Mapping[str, Any]) -> bool:
        """Create `body` unless an object of that name exists; True if created."""
        ...

    def replace_role_rules(self, body: Mapping[str, Any]) -> None: ...

    def replace_disruption_budget_spec(self, body: Mapping[str, Any]) -> None: ...

    def apply_by_hash(self, body: Mapping[str, Any]) -> str: ...

    def delete_if_present(self, kind: str, namespace: str, name: str) -> bool: ...

    def resize_volume_claim(self, namespace: str, name: str, size: str) -> None: ...

    def add_owner_reference(
        self, namespace: str, config_map: Mapping[str, Any], reference: Mapping[str, Any]
    ) -> None: ...

    def set_finalizer(
        self,
        namespace: str,
        name: str,
        finalizer: str,
        present: bool,
        resource_version: str | None = None,
    ) -> str | None:
        """Add or remove one finalizer of the pipeline; the resourceVersion after."""
        ...

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> str:
        """Merge `status` into the pipeline's status; the new resourceVersion."""
        ...

    def create_pod(self, body: Mapping[str, Any]) -> bool: ...

    def delete_pod(
        self, namespace: str, name: str, force: bool, uid: str | None = None
    ) -> bool: ...

    def fence_lease(self, namespace: str, name: str, resource_version: str | None) -> bool: ...

    def taint_out_of_service(self, node: str, owner: str) -> bool: ...

    def release_out_of_service(self, node: str, owner: str) -> bool: ...


class Cluster(ClusterReads, ClusterWrites, Protocol):
    """Both: what a whole pass (`reconcile.reconcile`) is given."""
