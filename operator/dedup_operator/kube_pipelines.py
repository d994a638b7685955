"""The DedupPipelines themselves: read (from their watches, or fresh), their
finalizers and status written compare-and-set on the resourceVersion a pass read
(409: `Conflict`), and the Events about them (posted from a thread once set)."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_contract.timefmt import format_time
from dedup_operator.event_poster import EventPoster
from dedup_operator.kube_calls import Conflict, KubeCalls, Obj, absent, log, watched_key


class KubePipelines(KubeCalls):
    """The pipelines: reads, finalizers, status and Events."""

    _events: EventPoster | None  # Events posted from a thread, once set

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
            if absent(exc):
                return None
            raise
        assert isinstance(found, dict)
        return found

    def pipelines(self, namespaces: Sequence[str]) -> list[Obj]:
        """Every DedupPipeline in `namespaces` (all namespaces if empty): from the watches
        when every one is in sync, else listed."""
        scopes: list[str | None] = list(namespaces) or [None]
        watches = [self._watched.get(watched_key("pipelines", ns)) for ns in scopes]
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

    def stored_versions(self) -> list[str]:
        """The DedupPipeline CRD's status.storedVersions."""
        crd: Any = self._raw(
            client.ApiextensionsV1Api(self.api).read_custom_resource_definition,
            names.CRD_NAME,
        )
        return [str(v) for v in (crd.get("status") or {}).get("storedVersions") or []]

    def set_stored_versions(self, versions: Sequence[str]) -> None:
        """Replace the DedupPipeline CRD's status.storedVersions (the leader only)."""
        self._may_act("prune the CRD's storedVersions")
        client.ApiextensionsV1Api(self.api).patch_custom_resource_definition_status(
            names.CRD_NAME,
            {"status": {"storedVersions": list(versions)}},
            _content_type="application/merge-patch+json",
        )

    def mark_stored_version(self, namespace: str, name: str, version: str) -> None:
        """Rewrite a pipeline (its annotation dedup.io/stored-version set to `version`):
        the API server stores it at the CRD's storage version (the leader only)."""
        self._may_act(f"rewrite {namespace}/{name} at {version}")
        try:
            out: Any = self.custom.patch_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace,
                names.PLURAL,
                name,
                {"metadata": {"annotations": {names.ANNOTATION_STORED_VERSION: version}}},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if absent(exc):
                return  # deleted meanwhile: nothing left to move
            raise
        self._wrote("pipelines", out)

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
            if not absent(exc):
                raise
            return None

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
