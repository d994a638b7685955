"""A STAND-IN for the Kube shell in the unit tests of a reconcile pass: answers reads from
what it holds; records every write (and refuses on demand). It implements the pass's
seams, `dedup_operator.cluster_api.ClusterReads` and `ClusterWrites`; mypy checks it
against them (`_checked_against_the_seams`, this file is in the Makefile's lint target)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dedup_operator.cluster_api import Cluster, ClusterReads, ClusterWrites
from dedup_operator.kube import Conflict


class FakeKube:
    """Only what a reconcile pass calls. Reads answer from `body`, `claims`, `leases_`,
    `pods_` and `nodes_`; each write is appended to `writes` as (name, *what)."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body: dict[str, Any] = copy.deepcopy(dict(body))
        self.claims: dict[str, Any] = {}
        self.leases_: dict[str, Any] = {}
        self.pods_: list[dict[str, Any]] = []
        self.nodes_: list[dict[str, Any]] = [{"metadata": {"name": "n1"}}]
        self.writes: list[tuple[Any, ...]] = []
        self.conflict_on: str | None = None  # a write (by name) that raises Conflict
        self.node_writes = 0  # no node taint written by this stand-in
        self.other_pipelines: list[dict[str, Any]] = []  # beside `body`, in the watch

    def _write(self, what: str, *args: Any) -> None:
        if what == self.conflict_on:
            meta = self.body["metadata"]
            raise Conflict(f"{meta['namespace']}/{meta['name']} changed since this pass read it")
        self.writes.append((what, *args))

    # reads
    def pipeline(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.body)

    def pipelines(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.body), *copy.deepcopy(self.other_pipelines)]

    def volume_claims(self, namespace: str, pipeline: str) -> dict[str, Any]:
        return dict(self.claims)

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        return None

    def leases(self, namespace: str, pipeline: str) -> dict[str, Any]:
        return dict(self.leases_)

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.leases_.get(name)

    def node_leases(self) -> dict[str, Any] | None:
        return None

    def leases_watched_since(self, namespace: str) -> float | None:
        return None

    def heartbeats_watched_since(self) -> float | None:
        return None

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.nodes_)

    def pods(self, namespace: str, pipeline: str) -> list[dict[str, Any]]:
        return list(self.pods_)

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """Refused, as by a shell without RBAC to list every namespace's pods (the node's
        pods stay unknown: no taint); `LostNodeKube` of test_reconcile_pass lists them."""
        raise PermissionError(f"this stand-in lists no pods on node {node}")

    def volume_attachments(self, volumes: Iterable[str | None]) -> list[dict[str, Any]]:
        return []

    def has_crd(self, name: str) -> bool:
        return False

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def spark_applications(self, namespace: str, scheduled: str) -> list[dict[str, Any]]:
        return []

    def nodes_marked_by(self, owner: str) -> list[str]:
        return []

    # writes
    def ensure(self, body: Mapping[str, Any]) -> bool:
        self._write("ensure", body["kind"], body["metadata"]["name"])
        if body["kind"] == "PersistentVolumeClaim":  # read back by the next look
            self.claims[body["metadata"]["name"]] = copy.deepcopy(dict(body))
        return True

    def replace_role_rules(self, body: Mapping[str, Any]) -> None:
        self._write("replace_role_rules", body["metadata"]["name"])

    def replace_disruption_budget_spec(self, body: Mapping[str, Any]) -> None:
        self._write("replace_disruption_budget_spec", body["metadata"]["name"])

    def apply_by_hash(self, body: Mapping[str, Any]) -> str:
        self._write("apply_by_hash", body["kind"], body["metadata"]["name"])
        return "created"

    def delete_if_present(self, kind: str, namespace: str, name: str) -> bool:
        self._write("delete_if_present", kind, name)
        return False

    def resize_volume_claim(self, namespace: str, name: str, size: str) -> None:
        self._write("resize_volume_claim", name, size)

    def add_owner_reference(
        self, namespace: str, config_map: Mapping[str, Any], reference: Mapping[str, Any]
    ) -> None:
        self._write("add_owner_reference", config_map["metadata"]["name"])

    def set_finalizer(
        self,
        namespace: str,
        name: str,
        finalizer: str,
        present: bool,
        resource_version: str | None = None,
    ) -> str | None:
        self._write("set_finalizer", finalizer, present, resource_version)
        return self._moved_on()

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> str:
        self._write("patch_status", dict(status), resource_version)
        return self._moved_on()

    def create_pod(self, body: Mapping[str, Any]) -> bool:
        self._write("create_pod", body["metadata"]["name"])
        return True

    def delete_pod(self, namespace: str, name: str, force: bool, uid: str | None = None) -> bool:
        self._write("delete_pod", name, force, uid)
        return True

    def fence_lease(self, namespace: str, name: str, resource_version: str | None) -> bool:
        self._write("fence_lease", name)
        return True

    def taint_out_of_service(self, node: str, owner: str) -> bool:
        self._write("taint_out_of_service", node)
        return True

    def release_out_of_service(self, node: str, owner: str) -> bool:
        self._write("release_out_of_service", node)
        return True

    def event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self._write("event", reason, message)

    def _moved_on(self) -> str:
        version = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        self.body["metadata"]["resourceVersion"] = version
        return version


def _checked_against_the_seams(kube: FakeKube) -> tuple[ClusterReads, ClusterWrites, Cluster]:
    """mypy's check that the stand-in keeps to the seams (never called)."""
    return kube, kube, kube
