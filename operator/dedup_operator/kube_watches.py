"""The operator's watches (`Kube.watch_cluster`): Nodes, node Leases and
VolumeAttachments, and per watched namespace the DedupPipelines with their worker pods,
volume claims and partition Leases, held in memory (`dedup_operator.cache`) so that a
pass's reads do not grow with the cluster; their events to whoever wakes passes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dedup_contract import names
from dedup_operator.cache import WatchedKind, by_namespace_and_name
from dedup_operator.kube_calls import (
    NODE_LEASE_NAMESPACE,
    KubeCalls,
    Obj,
    WatchEvent,
    attached_volume,
    watched_key,
)
from dedup_operator.wakeups import pipeline_of


class KubeWatches(KubeCalls):
    """Starting, reading the state of and stopping the watches."""

    _on_event: WatchEvent | None  # watch events, to wake passes

    def watch_cluster(
        self,
        wait_s: float = 0.0,
        on_heartbeat: Callable[[Obj], None] | None = None,
        namespaces: Sequence[str] | None = None,
        on_partition_lease: Callable[[Obj], None] | None = None,
        on_event: WatchEvent | None = None,
    ) -> None:
        """Follow by watch from now on, so that a pass reads them from memory (its
        requests do not grow with the cluster): Nodes, node Leases and VolumeAttachments;
        with `namespaces` (empty: every namespace) also the DedupPipelines and their
        worker pods, volume claims and partition Leases there. `on_heartbeat(lease)` and
        `on_partition_lease(lease)` are called as each Lease is renewed; `on_event(kind,
        event, held, obj)` with each watch event (`cache.WatchedKind`), kind being one of
        nodes, node-leases, volumeattachments, pipelines, pods, volumeclaims, leases. Waits up to
        `wait_s` for the first lists; the operator does not wait (a pass lists directly
        until then, and a slow start would delay its leader election)."""
        if self._watched:
            return
        self._on_event = on_event
        self._watched = {
            "nodes": WatchedKind("nodes", self.core.list_node, on_event=self._events_of("nodes")),
            "node-leases": WatchedKind(
                f"leases in {NODE_LEASE_NAMESPACE}",
                self.coordination.list_namespaced_lease,
                NODE_LEASE_NAMESPACE,
                on_change=on_heartbeat,
                on_event=self._events_of("node-leases"),
            ),
            "volumeattachments": WatchedKind(
                "volumeattachments",
                self.storage.list_volume_attachment,
                group=attached_volume,
                on_event=self._events_of("volumeattachments"),
            ),
        }
        if namespaces is not None:
            scopes: list[str | None] = list(namespaces) or [None]
            for ns in scopes:
                self._watch_pipelines(ns, on_partition_lease)
        for kind in self._watched.values():
            kind.start()
        for kind in self._watched.values():
            kind.wait_synced(wait_s)

    def _watch_pipelines(
        self, namespace: str | None, on_lease: Callable[[Obj], None] | None
    ) -> None:
        """The DedupPipelines, and their worker pods, volume claims and partition Leases
        grouped by (namespace, pipeline), in `namespace` (None: every namespace)."""
        every = namespace is None
        kinds = (
            (
                "pods",
                self.core.list_pod_for_all_namespaces if every else self.core.list_namespaced_pod,
                f"{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}",
                None,
            ),
            (
                "volumeclaims",
                self.core.list_persistent_volume_claim_for_all_namespaces
                if every
                else self.core.list_namespaced_persistent_volume_claim,
                names.LABEL_PIPELINE,
                None,
            ),
            (
                "leases",
                self.coordination.list_lease_for_all_namespaces
                if every
                else self.coordination.list_namespaced_lease,
                names.LABEL_PIPELINE,
                on_lease,
            ),
        )
        custom = self.custom
        self._watched[watched_key("pipelines", namespace)] = WatchedKind(
            f"{names.PLURAL} in {namespace or 'every namespace'}",
            custom.list_cluster_custom_object if every else custom.list_namespaced_custom_object,
            args=(names.GROUP, names.VERSION, *([] if every else [namespace]), names.PLURAL),
            key=by_namespace_and_name,
            on_event=self._events_of("pipelines"),
        )
        for kind, list_call, selector, on_change in kinds:
            self._watched[watched_key(kind, namespace)] = WatchedKind(
                f"{kind} in {namespace or 'every namespace'}",
                list_call,
                namespace,
                on_change=on_change,
                label_selector=selector,
                key=by_namespace_and_name,
                group=pipeline_of,
                on_event=self._events_of(kind),
            )

    def _events_of(self, kind: str) -> Callable[[str, Obj | None, Obj | None], None] | None:
        """`kind`'s events, to `on_event` as watch_cluster was given it (None: not wanted)."""
        on_event = self._on_event
        if on_event is None:
            return None
        return lambda event, held, obj: on_event(kind, event, held, obj)

    def leases_watched_since(self, namespace: str) -> float | None:
        """Since when (monotonic) the partition Leases of `namespace` have been followed
        by an unbroken watch; None when they are not watched or the watch is not synced."""
        watched = self._pipeline_watch("leases", namespace)
        return watched.synced_since() if watched is not None else None

    def heartbeats_watched_since(self) -> float | None:
        """Since when (monotonic) the node Leases have been followed by an unbroken watch;
        None when they are not watched or the watch is not synced."""
        watched = self._watched.get("node-leases")
        return watched.synced_since() if watched is not None else None

    def watch_lists(self) -> dict[str, int]:
        """How many times each watched kind was listed (relists included), summed over
        the namespaces it is watched in."""
        lists: dict[str, int] = {}
        for key, watched in self._watched.items():
            kind = key.split("@", 1)[0]
            lists[kind] = lists.get(kind, 0) + watched.lists
        return lists

    def stop_watching(self) -> None:
        for kind in self._watched.values():
            kind.stop()
        self._watched = {}
