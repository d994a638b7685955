"""What every part of the operator's Kubernetes shell (`kube.Kube`, built from the
`kube_*.py` mixins) shares: the API clients and the state `Kube.__init__` sets, declared
on `KubeCalls` so that mypy checks each part's use of them; the leadership check before
a mutating call; answers as JSON; and the reads and writes of the watches that follow
the pipelines' objects (`kube_watches` starts them). Objects are JSON dicts (the API's
camelCase form)."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_operator.cache import WatchedKind

CONFLICT_RETRIES = 12  # a node's mark written by this many passes at once, at least
CONFLICT_BACKOFF_S = 0.02  # the n-th retry waits up to n times this (random)

log = logging.getLogger("dedup_operator.kube")

NODE_LEASE_NAMESPACE = "kube-node-lease"  # the kubelets' heartbeats

Obj = dict[str, Any]


def absent(exc: ApiException) -> bool:
    return bool(exc.status == 404)


class Conflict(Exception):
    """The pipeline changed since this pass read it (409 on a write carrying the
    resourceVersion it saw): nothing written; the next pass re-reads and re-decides."""


class NotLeader(Exception):
    """This replica can no longer prove it leads (its leader Lease, on its own monotonic
    clock): the pass stops before the mutating call it was about to make."""


def attached_volume(va: Mapping[str, Any]) -> str | None:
    """The PersistentVolume a VolumeAttachment attaches (None: an inline volume)."""
    return ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName")


def watched_key(kind: str, namespace: str | None) -> str:
    return f"{kind}@{namespace}" if namespace is not None else kind


WatchEvent = Callable[[str, str, Obj | None, Obj | None], None]
"""(kind, event, held, obj): see `Kube.watch_cluster`."""


class KubeCalls:
    """The base of every part of `Kube`: what `Kube.__init__` sets that several parts
    use, and the calls they share. The pipeline's objects come from their watches
    (read-only: shared with the watch thread); listed directly while a watch is not
    synced."""

    api: ApiClient
    core: client.CoreV1Api
    coordination: client.CoordinationV1Api
    storage: client.StorageV1Api
    custom: client.CustomObjectsApi
    dynamic_kinds: dict[str, Any]
    _acting: threading.local  # per thread: the leadership check of its pass
    # Nodes, node Leases, VolumeAttachments (and the pipelines with their worker pods,
    # volume claims and partition Leases) followed by watches once `watch_cluster()`
    # ran (dedup_operator.cache); each read falls back to a list while one is not synced.
    _watched: dict[str, WatchedKind]

    def _pipeline_watch(self, kind: str, namespace: str) -> WatchedKind | None:
        return self._watched.get(watched_key(kind, namespace)) or self._watched.get(
            watched_key(kind, None)
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
