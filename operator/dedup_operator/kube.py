"""The operator's Kubernetes API calls: the thin shell around the Kubernetes API (Kafka's
admin API is `kafka_admin`, the workers' metrics `dedup_contract.worker_metrics`).
Objects go in and come out as JSON dicts (the API's camelCase form), which is what the
pure modules (desired/, observed, failover) use."""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_contract import kube_client, names
from dedup_contract.timefmt import format_time
from dedup_operator.cache import WatchedKind, by_namespace_and_name
from dedup_operator.desired.scheduled_audit import (
    SCHEDULED_APP_LABEL,
    SCHEDULED_SPARK_APPLICATIONS,
    SPARK_APPLICATIONS,
    SPARK_OPERATOR_GROUP,
    SPARK_OPERATOR_VERSION,
)
from dedup_operator.event_poster import EventPoster
from dedup_operator.failover import OUT_OF_SERVICE_TAINT
from dedup_operator.node_marks import NodeMarkBatches
from dedup_operator.wakeups import pipeline_of

CONFLICT_RETRIES = 12  # a node's mark written by this many passes at once, at least
CONFLICT_BACKOFF_S = 0.02  # the n-th retry waits up to n times this (random)

log = logging.getLogger("dedup_operator.kube")

NODE_LEASE_NAMESPACE = "kube-node-lease"  # the kubelets' heartbeats

Obj = dict[str, Any]


def api_client(
    kubeconfig: str | None = None,
    qps: float = kube_client.DEFAULT_QPS,
    burst: int = kube_client.DEFAULT_BURST,
) -> ApiClient:
    """The operator's client (`kube_client.api_client`): from a kubeconfig, else the pod's
    service account in a cluster, else the default kubeconfig; `qps` requests a second,
    bursts of `burst` (qps 0: no client-side limit)."""
    return kube_client.api_client(kubeconfig or None, qps=qps, burst=burst)


def _absent(exc: ApiException) -> bool:
    return bool(exc.status == 404)


class Conflict(Exception):
    """The pipeline changed since this pass read it (409 on a write carrying the
    resourceVersion it saw): nothing written; the next pass re-reads and re-decides."""


class NotLeader(Exception):
    """This replica can no longer prove it leads (its leader Lease, on its own monotonic
    clock): the pass stops before the mutating call it was about to make."""


# The kinds a pass reads from a pipeline watch, by the kind `ensure` creates.
WRITTEN_THROUGH = {"PersistentVolumeClaim": "volumeclaims", "Lease": "leases"}


def attached_volume(va: Mapping[str, Any]) -> str | None:
    """The PersistentVolume a VolumeAttachment attaches (None: an inline volume)."""
    return ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName")


def _watched_key(kind: str, namespace: str | None) -> str:
    return f"{kind}@{namespace}" if namespace is not None else kind


WatchEvent = Callable[[str, str, Obj | None, Obj | None], None]
"""(kind, event, held, obj): see `Kube.watch_cluster`."""


class Kube:
    """Synchronous calls, one ApiClient (kopf runs sync handlers in threads)."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.dynamic_kinds: dict[str, Any] = {}
        self._crds: dict[str, tuple[float, bool]] = {}  # name -> (monotonic time, found)
        self._node_leases_denied_until = 0.0  # monotonic: node Leases refused until then
        self._acting = threading.local()  # per thread: the leadership check of its pass
        # Nodes, node Leases, VolumeAttachments (and the pipelines with their worker pods,
        # volume claims and partition Leases) followed by watches once `watch_cluster()`
        # ran (dedup_operator.cache); each read falls back to a list while one is not synced.
        self._watched: dict[str, WatchedKind] = {}
        self._events: EventPoster | None = None  # Events posted from a thread, once set
        self._on_event: WatchEvent | None = None  # watch events, to wake passes
        # How many node taint writes this process made: nodes judged before the last one
        # are not judged again from memory (`memory.LeaseWatch.node_views`).
        self._node_writes = 0
        self._node_writes_lock = threading.Lock()
        self._mark_batches = NodeMarkBatches()

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
        self._watched[_watched_key("pipelines", namespace)] = WatchedKind(
            f"{names.PLURAL} in {namespace or 'every namespace'}",
            custom.list_cluster_custom_object if every else custom.list_namespaced_custom_object,
            args=(names.GROUP, names.VERSION, *([] if every else [namespace]), names.PLURAL),
            key=by_namespace_and_name,
            on_event=self._events_of("pipelines"),
        )
        for kind, list_call, selector, on_change in kinds:
            self._watched[_watched_key(kind, namespace)] = WatchedKind(
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

    def _pipeline_watch(self, kind: str, namespace: str) -> WatchedKind | None:
        return self._watched.get(_watched_key(kind, namespace)) or self._watched.get(
            _watched_key(kind, None)
        )

    def _pipeline_objects(self, kind: str, namespace: str, pipeline: str) -> dict[str, Obj] | None:
        """The pipeline's objects of `kind` by name, from its watch; None while not synced."""
        watched = self._pipeline_watch(kind, namespace)
        return watched.select((namespace, pipeline)) if watched is not None else None

    def _held(self, kind: str, namespace: str, name: str) -> tuple[bool, Obj | None]:
        """(the watch of `kind` is in sync, the object it holds or None); (False, None)
        when the kind is not watched there."""
        watched = self._pipeline_watch(kind, namespace)
        return watched.get(f"{namespace}/{name}") if watched is not None else (False, None)

    def _wrote(self, kind: str, obj: Any) -> None:
        """Hold what the operator just wrote in the watch that follows it (if any)."""
        data = obj if isinstance(obj, dict) else self._json(obj)
        watched = self._pipeline_watch(kind, str(data["metadata"].get("namespace") or ""))
        if watched is not None:
            watched.wrote(data)

    def leases_watched_since(self, namespace: str) -> float | None:
        """Since when (monotonic) the partition Leases of `namespace` have been followed
        by an unbroken watch; None when they are not watched or the watch is not synced."""
        watched = self._pipeline_watch("leases", namespace)
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

    def _cached(self, kind: str) -> dict[str, Obj] | None:
        watched = self._watched.get(kind)
        return watched.items() if watched is not None else None

    @contextlib.contextmanager
    def acting(self, may_act: Callable[[], bool]) -> Iterator[None]:
        """Within the block, in this thread, every mutating call first asks `may_act()`
        (the replica's leadership, a monotonic-clock comparison) and raises NotLeader
        instead of calling the API when it says no."""
        outer = getattr(self._acting, "check", None)
        self._acting.check = may_act
        try:
            yield
        finally:
            self._acting.check = outer

    def _may_act(self, what: str) -> None:
        check = getattr(self._acting, "check", None)
        if check is not None and not check():
            raise NotLeader(f"no longer the leader; not doing: {what}")

    def _json(self, obj: Any) -> Obj:
        data = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        assert isinstance(data, dict)
        return data

    @staticmethod
    def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        """`call`'s answer as JSON, parsed by orjson: not through the client's models (a
        node's pods listed for each of 20 pipelines handing over off it spent more in the
        models than on the wire). Errors raise ApiException as they otherwise do."""
        data = orjson.loads(call(*args, **kwargs, _preload_content=False).data)
        assert isinstance(data, dict)
        return data

    # ------------------------------------------------------------------ generic
    def ensure(self, body: Mapping[str, Any]) -> bool:
        """Create `body` unless an object of that name exists; True if created. Kinds
        the operator keeps in step with the spec are updated by their own methods."""
        self._may_act(f"create {body['kind']} {body['metadata']['name']}")
        kind, ns, name = body["kind"], body["metadata"]["namespace"], body["metadata"]["name"]
        create, read = self._create_read(kind)
        trusted, held = (
            self._held(WRITTEN_THROUGH[kind], ns, name)
            if kind in WRITTEN_THROUGH
            else (False, None)
        )
        if held is not None:
            return False
        try:
            if not trusted:  # a watched kind the watch says is absent: no read
                read(name, ns)
                return False
        except ApiException as exc:
            if not _absent(exc):
                raise
        try:
            created = create(ns, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        if kind in WRITTEN_THROUGH:
            self._wrote(WRITTEN_THROUGH[kind], created)
        log.info("created %s %s/%s", kind, ns, name)
        return True

    def _create_read(self, kind: str) -> tuple[Any, Any]:
        rbac = client.RbacAuthorizationV1Api(self.api)
        policy = client.PolicyV1Api(self.api)
        table = {
            "ServiceAccount": (
                self.core.create_namespaced_service_account,
                self.core.read_namespaced_service_account,
            ),
            "Role": (rbac.create_namespaced_role, rbac.read_namespaced_role),
            "RoleBinding": (rbac.create_namespaced_role_binding, rbac.read_namespaced_role_binding),
            "Service": (self.core.create_namespaced_service, self.core.read_namespaced_service),
            "PodDisruptionBudget": (
                policy.create_namespaced_pod_disruption_budget,
                policy.read_namespaced_pod_disruption_budget,
            ),
            "PersistentVolumeClaim": (
                self.core.create_namespaced_persistent_volume_claim,
                self.core.read_namespaced_persistent_volume_claim,
            ),
            "Lease": (
                self.coordination.create_namespaced_lease,
                self.coordination.read_namespaced_lease,
            ),
            "Pod": (self.core.create_namespaced_pod, self.core.read_namespaced_pod),
        }
        return table[kind]

    def replace_role_rules(self, body: Mapping[str, Any]) -> None:
        self._may_act("update the Role")
        rbac = client.RbacAuthorizationV1Api(self.api)
        meta = body["metadata"]
        rbac.patch_namespaced_role(meta["name"], meta["namespace"], {"rules": body["rules"]})

    def replace_disruption_budget_spec(self, body: Mapping[str, Any]) -> None:
        """Keep the workers' PodDisruptionBudget in step with the spec (its minAvailable
        follows spec.partitions; budgets made before it was a number are corrected)."""
        self._may_act("update the PodDisruptionBudget")
        meta = body["metadata"]
        client.PolicyV1Api(self.api).patch_namespaced_pod_disruption_budget(
            meta["name"], meta["namespace"], {"spec": body["spec"]}
        )

    def create_pod(self, body: Mapping[str, Any]) -> bool:
        self._may_act(f"create pod {body['metadata']['name']}")
        meta = body["metadata"]
        try:
            created = self._raw(self.core.create_namespaced_pod, meta["namespace"], body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self._wrote("pods", created)
        log.info("created pod %s/%s", meta["namespace"], meta["name"])
        return True

    # ---------------------------------------------------------- scheduled audit
    def has_crd(self, name: str, max_age_s: float = 60.0) -> bool:
        """Is the CustomResourceDefinition `name` installed? (remembered for max_age_s)"""
        now = time.monotonic()
        cached = self._crds.get(name)
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        try:
            client.ApiextensionsV1Api(self.api).read_custom_resource_definition(name)
            found = True
        except ApiException as exc:
            if not _absent(exc):
                raise
            found = False
        self._crds[name] = (now, found)
        return found

    def _scheduler_calls(self, kind: str) -> tuple[Any, Any, Any, Any]:
        """(read, create, replace, delete) of a kind the operator keeps in step by its
        spec-hash annotation, each called as (namespace, name[, body])."""
        if kind == "CronJob":
            batch = client.BatchV1Api(self.api)
            return (
                lambda ns, n: self._json(batch.read_namespaced_cron_job(n, ns)),
                lambda ns, b: batch.create_namespaced_cron_job(ns, b),
                lambda ns, n, b: batch.replace_namespaced_cron_job(n, ns, b),
                lambda ns, n: batch.delete_namespaced_cron_job(
                    n, ns, propagation_policy="Background"
                ),
            )
        if kind == "ScheduledSparkApplication":
            g, v, plural = (
                SPARK_OPERATOR_GROUP,
                SPARK_OPERATOR_VERSION,
                SCHEDULED_SPARK_APPLICATIONS,
            )
            custom = self.custom
            return (
                lambda ns, n: custom.get_namespaced_custom_object(g, v, ns, plural, n),
                lambda ns, b: custom.create_namespaced_custom_object(g, v, ns, plural, b),
                lambda ns, n, b: custom.replace_namespaced_custom_object(g, v, ns, plural, n, b),
                lambda ns, n: custom.delete_namespaced_custom_object(g, v, ns, plural, n),
            )
        rbac = client.RbacAuthorizationV1Api(self.api)
        deletes = {
            "ServiceAccount": self.core.delete_namespaced_service_account,
            "Role": rbac.delete_namespaced_role,
            "RoleBinding": rbac.delete_namespaced_role_binding,
        }
        return (None, None, None, lambda ns, n: deletes[kind](n, ns))

    def apply_by_hash(self, body: Mapping[str, Any]) -> str:
        """Create `body` (a CronJob or ScheduledSparkApplication), or replace it when its
        `dedup.io/spec-hash` annotation differs; returns created|updated|unchanged."""
        self._may_act(f"apply {body['kind']}")
        kind, meta = body["kind"], body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        read, create, replace, _ = self._scheduler_calls(kind)
        try:
            current = read(ns, name)
        except ApiException as exc:
            if not _absent(exc):
                raise
            create(ns, dict(body))
            log.info("created %s %s/%s", kind, ns, name)
            return "created"
        want = (meta.get("annotations") or {}).get(names.ANNOTATION_SPEC_HASH)
        have = ((current.get("metadata") or {}).get("annotations") or {}).get(
            names.ANNOTATION_SPEC_HASH
        )
        if want == have:
            return "unchanged"
        updated = {
            **body,
            "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        replace(ns, name, updated)
        log.info("updated %s %s/%s", kind, ns, name)
        return "updated"

    def delete_if_present(self, kind: str, namespace: str, name: str) -> bool:
        """Delete a scheduled-audit object; False if it (or its kind) is not there."""
        self._may_act(f"delete {kind} {name}")
        delete = self._scheduler_calls(kind)[3]
        try:
            delete(namespace, name)
        except ApiException as exc:
            if _absent(exc):
                return False
            raise
        log.info("deleted %s %s/%s", kind, namespace, name)
        return True

    def config_map(self, namespace: str, name: str) -> Obj | None:
        try:
            return self._json(self.core.read_namespaced_config_map(name, namespace))
        except ApiException as exc:
            if _absent(exc):
                return None
            raise

    def add_owner_reference(
        self, namespace: str, config_map: Mapping[str, Any], reference: Mapping[str, Any]
    ) -> None:
        """Give a ConfigMap (as read) the pipeline's owner reference; compare-and-set."""
        self._may_act("add an owner reference")
        meta = config_map["metadata"]
        refs = list(meta.get("ownerReferences") or [])
        if any(r.get("uid") == reference["uid"] for r in refs):
            return
        try:
            self.core.patch_namespaced_config_map(
                meta["name"],
                namespace,
                {
                    "metadata": {
                        "resourceVersion": meta["resourceVersion"],
                        "ownerReferences": [*refs, dict(reference)],
                    }
                },
            )
        except ApiException as exc:
            if exc.status not in (404, 409):  # replaced or gone meanwhile: next pass
                raise

    def spark_applications(self, namespace: str, scheduled: str) -> list[Obj]:
        """The SparkApplications the Spark operator started for ScheduledSparkApplication
        `scheduled` (its scheduled-app-name label)."""
        try:
            found: Any = self.custom.list_namespaced_custom_object(
                SPARK_OPERATOR_GROUP,
                SPARK_OPERATOR_VERSION,
                namespace,
                SPARK_APPLICATIONS,
                label_selector=f"{SCHEDULED_APP_LABEL}={scheduled}",
            )
        except ApiException as exc:
            if _absent(exc):
                return []
            raise
        return list(found.get("items") or [])

    # ----------------------------------------------------------------- observe
    # The pipeline's objects come from their watches (read-only: shared with the watch
    # thread); listed directly while a watch is not synced.
    def pods(self, namespace: str, pipeline: str) -> list[Obj]:
        cached = self._pipeline_objects("pods", namespace, pipeline)
        if cached is not None:
            return list(cached.values())
        selector = (
            f"{names.LABEL_PIPELINE}={pipeline},{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}"
        )
        found = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self._json(p) for p in found.items]

    def leases(self, namespace: str, pipeline: str) -> dict[str, Obj]:
        cached = self._pipeline_objects("leases", namespace, pipeline)
        if cached is not None:
            return cached
        found = self.coordination.list_namespaced_lease(
            namespace, label_selector=f"{names.LABEL_PIPELINE}={pipeline}"
        )
        return {o["metadata"]["name"]: o for o in (self._json(lease) for lease in found.items)}

    def volume_claims(self, namespace: str, pipeline: str) -> dict[str, Obj]:
        cached = self._pipeline_objects("volumeclaims", namespace, pipeline)
        if cached is not None:
            return cached
        found = self.core.list_namespaced_persistent_volume_claim(
            namespace, label_selector=f"{names.LABEL_PIPELINE}={pipeline}"
        )
        return {o["metadata"]["name"]: o for o in (self._json(pvc) for pvc in found.items)}

    def pipeline_of_volume(self, volume: str | None) -> tuple[str, str] | None:
        """(namespace, pipeline) whose volume claim is bound to PersistentVolume `volume`,
        from the claims' watches; None: no such claim held (not ours, or not in sync)."""
        if not volume:
            return None
        for key, watched in self._watched.items():
            if key.split("@")[0] != "volumeclaims":
                continue
            for claim in (watched.items() or {}).values():
                if (claim.get("spec") or {}).get("volumeName") == volume:
                    return pipeline_of(claim)
        return None

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

    def heartbeats_watched_since(self) -> float | None:
        """Since when (monotonic) the node Leases have been followed by an unbroken watch;
        None when they are not watched or the watch is not synced."""
        watched = self._watched.get("node-leases")
        return watched.synced_since() if watched is not None else None

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

    def volume_attachments(self, volumes: Iterable[str | None]) -> list[Obj]:
        """The VolumeAttachments of these PersistentVolumes, from the watch (held by
        volume: a pass reads its own volumes', not the cluster's thousand)."""
        wanted = {v for v in volumes if v}
        watched = self._watched.get("volumeattachments")
        if watched is not None:
            found: list[Obj] = []
            for volume in wanted:
                held = watched.select(volume)
                if held is None:  # not in sync: listed below
                    break
                found.extend(held.values())
            else:
                return found
        listed = (self._json(va) for va in self.storage.list_volume_attachment().items)
        return [va for va in listed if attached_volume(va) in wanted]

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        import base64

        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if _absent(exc):
                return None
            raise
        raw = (secret.data or {}).get(key)
        return base64.b64decode(raw).decode() if raw is not None else None

    # ------------------------------------------------------------------- act
    def delete_pod(self, namespace: str, name: str, force: bool, uid: str | None = None) -> bool:
        """Delete the pod the pass observed: only that incarnation (`uid`, a precondition
        the API server checks), never a successor of the same name created since.
        False when it is gone or is another pod now (409)."""
        self._may_act(f"delete pod {name}")
        body = client.V1DeleteOptions(
            grace_period_seconds=0 if force else None,
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                body=body,
                grace_period_seconds=0 if force else None,
                _preload_content=False,  # the answer is not read
            )
        except ApiException as exc:
            if _absent(exc) or exc.status == 409:
                return False
            raise
        return True

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

    def _retry_conflicts(self, attempt: Any) -> Any:
        """`attempt()` (a read, then a write conditional on what it read) again after a
        409, up to CONFLICT_RETRIES times, each after a random wait that grows: the passes
        of several pipelines marking one node at once (a crowded node lost) take turns
        instead of colliding again at once (client-go's RetryOnConflict waits too)."""
        for n in range(CONFLICT_RETRIES):
            try:
                return attempt()
            except ApiException as exc:
                if exc.status != 409:
                    raise
            time.sleep(random.uniform(0.0, CONFLICT_BACKOFF_S * (n + 1)))
        return attempt()

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
                if _absent(exc):
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

    def lease(self, namespace: str, name: str) -> Obj | None:
        trusted, held = self._held("leases", namespace, name)
        if trusted:
            return held
        try:
            return self._json(self.coordination.read_namespaced_lease(name, namespace))
        except ApiException as exc:
            if _absent(exc):
                return None
            raise

    def set_finalizer(
        self,
        namespace: str,
        name: str,
        finalizer: str,
        present: bool,
        resource_version: str | None = None,
    ) -> str | None:
        """Add or remove one finalizer of a pipeline (compare-and-set on its list). With
        `resource_version` (what the pass read, or its own last write), only on that
        version of the pipeline: raises Conflict if it changed. Returns the pipeline's
        resourceVersion afterwards (None if it is gone)."""
        self._may_act(f"set finalizer {finalizer}")

        def attempt() -> str | None:
            body = self.pipeline(namespace, name, fresh=True)  # read: a retry must see more
            if body is None:
                return None
            meta = body["metadata"]
            if resource_version is not None and meta["resourceVersion"] != resource_version:
                raise Conflict(f"{namespace}/{name} changed since this pass read it")
            current = list(meta.get("finalizers") or [])
            if (finalizer in current) == present:
                return str(meta["resourceVersion"])
            wanted = [*current, finalizer] if present else [f for f in current if f != finalizer]
            out: Any = self.custom.patch_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace,
                names.PLURAL,
                name,
                {"metadata": {"resourceVersion": meta["resourceVersion"], "finalizers": wanted}},
                _content_type="application/merge-patch+json",
            )
            self._wrote("pipelines", out)
            return str(out["metadata"]["resourceVersion"])

        try:
            if resource_version is not None:
                try:
                    return attempt()
                except ApiException as exc:
                    if exc.status == 409:
                        raise Conflict(
                            f"{namespace}/{name} changed since this pass read it"
                        ) from None
                    raise
            return self._retry_conflicts(attempt)  # type: ignore[no-any-return]
        except ApiException as exc:
            if not _absent(exc):
                raise
            return None

    def release_volume_claims(self, namespace: str, pipeline: str) -> list[str]:
        """Remove the pipeline's owner reference from its PVCs, so deleting the pipeline
        keeps them (retainOnDelete)."""
        kept = []
        for name, pvc in self.volume_claims(namespace, pipeline).items():
            refs = pvc["metadata"].get("ownerReferences") or []
            others = [r for r in refs if r.get("kind") != names.KIND]
            if len(others) != len(refs):
                self.core.patch_namespaced_persistent_volume_claim(
                    name,
                    namespace,
                    [{"op": "replace", "path": "/metadata/ownerReferences", "value": others}],
                )
            kept.append(name)
        return kept

    def resize_volume_claim(self, namespace: str, name: str, size: str) -> None:
        self._may_act(f"resize {name}")
        self.core.patch_namespaced_persistent_volume_claim(
            name, namespace, {"spec": {"resources": {"requests": {"storage": size}}}}
        )

    def pipeline(self, namespace: str, name: str, fresh: bool = False) -> Obj | None:
        """The pipeline from its watch; read when `fresh`, when the watch is not in sync,
        or when it does not hold it (created a moment ago: only a read says it is gone)."""
        trusted, held = (False, None) if fresh else self._held("pipelines", namespace, name)
        if trusted and held is not None:
            return held
        try:
            found = self.custom.get_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, name
            )
        except ApiException as exc:
            if _absent(exc):
                return None
            raise
        assert isinstance(found, dict)
        return found

    def pipelines(self, namespaces: Sequence[str]) -> list[Obj]:
        """Every DedupPipeline in `namespaces` (all namespaces if empty): from the watches
        when every one is in sync, else listed."""
        scopes: list[str | None] = list(namespaces) or [None]
        watches = [self._watched.get(_watched_key("pipelines", ns)) for ns in scopes]
        held = [w.items() if w is not None else None for w in watches]
        if all(h is not None for h in held):
            return [o for h in held if h is not None for o in h.values()]
        if not namespaces:
            found: Any = self.custom.list_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL
            )
            return list(found.get("items") or [])
        items: list[Obj] = []
        for ns in namespaces:
            in_ns: Any = self.custom.list_namespaced_custom_object(
                names.GROUP, names.VERSION, ns, names.PLURAL
            )
            items += in_ns.get("items") or []
        return items

    def event(self, pipeline: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about the pipeline (what `kubectl describe dp` shows)."""
        self._may_act(f"post Event {reason}")
        meta = pipeline["metadata"]
        now = datetime.now(UTC)
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": names.MANAGER},
            "reportingComponent": names.MANAGER,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": format_time(now),  # Time: whole seconds
            "lastTimestamp": format_time(now),
            "count": 1,
        }
        if self._events is not None:
            self._events.submit(meta["namespace"], body)
            return
        try:
            self.core.create_namespaced_event(meta["namespace"], body)  # type: ignore[arg-type]
        except ApiException as exc:  # an Event is worth a log line, not a failed pass
            log.warning("could not post event %s: %s", reason, exc.reason)

    def post_events_from_thread(self, api: ApiClient) -> EventPoster:
        """From now on `event` queues each Event for one thread that posts them through
        `api` (a client with its own request bucket: `kube_client.sibling`)."""
        core = client.CoreV1Api(api)
        self._events = EventPoster(
            lambda ns, body: core.create_namespaced_event(ns, body)  # type: ignore[arg-type]
        ).start()
        return self._events

    def stop_posting_events(self) -> None:
        """Post the queued Events (a few seconds at most), then post synchronously."""
        events, self._events = self._events, None
        if events is not None:
            events.stop()

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> str:
        """Merge `status` into the pipeline's status. With `resource_version` (what the
        pass read at its start, or its own last write) the API server applies it only to
        that version: 409 raises Conflict, and nothing is overwritten. Returns the new
        resourceVersion."""
        self._may_act("write status")
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            out: Any = self.custom.patch_namespaced_custom_object_status(
                names.GROUP,
                names.VERSION,
                namespace,
                names.PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 409 and resource_version is not None:
                raise Conflict(
                    f"{namespace}/{name} changed since this pass read it "
                    f"(resourceVersion {resource_version})"
                ) from None
            raise
        self._wrote("pipelines", out)
        return str(out["metadata"]["resourceVersion"])
