"""The cluster's nodes: read (from the watch), their heartbeats (node Leases in
kube-node-lease), the out-of-service taint the operator sets on a lost node with its
mark of the pipelines relying on it (compare-and-set, retried on 409, batched by
`node_marks`), and the pods bound to a node."""

from __future__ import annotations

import threading
import time

from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_operator.failover import OUT_OF_SERVICE_TAINT
from dedup_operator.kube_calls import NODE_LEASE_NAMESPACE, KubeCalls, Obj, absent, log
from dedup_operator.node_marks import NodeMarkBatches


class KubeNodes(KubeCalls):
    """Nodes, their heartbeats, and the out-of-service taints and marks."""

    _node_leases_denied_until: float  # monotonic: node Leases refused until then
    # How many node taint writes this process made: nodes judged before the last one
    # are not judged again from memory (`memory.LeaseWatch.node_views`).
    _node_writes: int
    _node_writes_lock: threading.Lock
    _mark_batches: NodeMarkBatches

    def nodes(self) -> list[Obj]:
        cached = self._cached("nodes")
        if cached is not None:
            return list(cached.values())
        return [self._json(n) for n in self.core.list_node().items]

    def node_leases(self) -> dict[str, Obj] | None:
        """The nodes' heartbeats: their Leases in kube-node-lease, by node name. None when
        they cannot be read (no RBAC for them: nodes are then judged by their Ready
        condition); after a refusal, asked again only every 5 minutes."""
        cached = self._cached("node-leases")
        if cached is not None:
            return cached
        if time.monotonic() < self._node_leases_denied_until:
            return None
        try:
            found = self.coordination.list_namespaced_lease(NODE_LEASE_NAMESPACE)
        except ApiException as exc:
            if exc.status not in (401, 403, 404):
                raise
            log.warning(
                "cannot list the node Leases in %s (%s %s): judging nodes by their Ready "
                "condition (slower failover); grant list on leases there",
                NODE_LEASE_NAMESPACE,
                exc.status,
                exc.reason,
            )
            self._node_leases_denied_until = time.monotonic() + 300.0
            return None
        return {o["metadata"]["name"]: o for o in (self._json(lease) for lease in found.items)}

    def _node_taints(self, node: str) -> tuple[str, list[Obj], list[str]]:
        """(resourceVersion, taints, the pipelines in its out-of-service mark)."""
        current = self._raw(self.core.read_node, node)
        taints = list((current.get("spec") or {}).get("taints") or [])
        by = (current["metadata"].get("annotations") or {}).get(names.ANNOTATION_TAINT_BY)
        owners = sorted({o.strip() for o in (by or "").split(",") if o.strip()})
        return str(current["metadata"]["resourceVersion"]), taints, owners

    @property
    def node_writes(self) -> int:
        """How many times this process changed a node's taints (and its mark)."""
        with self._node_writes_lock:
            return self._node_writes

    def _set_taints(self, node: str, version: str, taints: list[Obj], owners: list[str]) -> None:
        """Write the node's taints and mark, and hold the answer in the node watch at once:
        the next pass (often at once: a handover's steps follow each other) must judge
        the node with the mark it just wrote, or it takes the taint for someone else's
        and forgets it (found on real nodes: a taint never lifted)."""
        # resourceVersion makes it a compare-and-set: no one else's taint or mark is lost
        out = self._raw(
            self.core.patch_node,
            node,
            {
                "metadata": {
                    "resourceVersion": version,
                    "annotations": {names.ANNOTATION_TAINT_BY: ",".join(owners) or None},
                },
                "spec": {"taints": taints},
            },
        )
        self._wrote("nodes", out)
        with self._node_writes_lock:
            self._node_writes += 1

    def taint_out_of_service(self, node: str, owner: str) -> bool:
        """Taint `node` out-of-service marked as relied on by pipeline `owner`
        ("namespace/name"), or add `owner` to the mark of a taint the operator added for
        another pipeline. False (node untouched) if the node carries an out-of-service
        taint someone else set: that one is never claimed, so never lifted by us."""
        self._may_act(f"taint node {node}")
        # the marks other passes ask for meanwhile go in one write (node_marks.py)
        return self._mark_batches.add(node, owner, lambda marks: self._add_marks(node, marks))

    def _add_marks(self, node: str, marks: frozenset[str]) -> bool:
        """`taint_out_of_service` for every pipeline of `marks` in one compare-and-set
        (retried on 409)."""

        def attempt() -> bool:
            version, taints, owners = self._node_taints(node)
            has = any(t.get("key") == OUT_OF_SERVICE_TAINT for t in taints)
            if has and not owners:
                return False
            if has and marks <= set(owners):
                return True
            if not has:
                owners = []  # a mark without its taint is stale
                taints.append(
                    {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}
                )
            self._set_taints(node, version, taints, sorted({*owners, *marks}))
            return True

        return bool(self._retry_conflicts(attempt))

    def release_out_of_service(self, node: str, owner: str) -> bool:
        """Take pipeline `owner` off the node's out-of-service mark; with the last mark the
        taint goes too (True). A taint the operator did not add is never removed."""
        self._may_act(f"untaint node {node}")

        def attempt() -> bool:
            try:
                version, taints, owners = self._node_taints(node)
            except ApiException as exc:
                if absent(exc):
                    return False
                raise
            if owner not in owners:
                return False
            owners.remove(owner)
            if not owners:
                taints = [t for t in taints if t.get("key") != OUT_OF_SERVICE_TAINT]
            self._set_taints(node, version, taints, owners)
            return not owners

        return bool(self._retry_conflicts(attempt))

    def nodes_marked_by(self, owner: str) -> list[str]:
        """The nodes whose out-of-service mark names pipeline `owner`."""
        found = []
        for n in self.nodes():
            by = (n["metadata"].get("annotations") or {}).get(names.ANNOTATION_TAINT_BY) or ""
            if owner in {o.strip() for o in by.split(",")}:
                found.append(str(n["metadata"]["name"]))
        return found

    def pods_on_node(self, node: str) -> list[Obj]:
        """Every pod bound to `node`, in any namespace."""
        found = self._raw(
            self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        )
        return list(found.get("items") or [])
