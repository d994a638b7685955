"""The cluster-wide objects every pass looks at, kept by watching instead of listing.

Each reconcile pass of each pipeline needs every Node, every node's heartbeat Lease (in
`kube-node-lease`) and every VolumeAttachment. Listing them on every pass makes the
operator's load on the API server grow with nodes times pipelines over the interval. A
`WatchedKind` lists a kind once and then follows its watch stream (as client-go's
informers do), so a pass reads them from memory: the requests a pass makes do not grow
with the number of nodes.

The protocol, per kind, in one daemon thread:

1. list (raw JSON), keep the items by name and the list's resourceVersion: *synced*;
2. watch from that version, applying ADDED/MODIFIED/DELETED and moving the version on
   with each event and bookmark; the server ends each watch after `WATCH_S` and the
   thread watches again from the version it holds (no relist);
3. a watch refused with 410 Gone (the version is too old) → relist; any other error
   (the API server unreachable, a connection cut) → *not synced* until the next list
   succeeds, retried with capped backoff.

`items()` returns None when the kind is not synced, *or when nothing has been heard from
the server for `STALE_S`* (a connection silently hung: the watch read times out after
`READ_TIMEOUT_S`; the server ends each watch after `WATCH_S` < `STALE_S`, so a healthy
stream is heard from at least that often). A caller given None lists directly: it never
decides on data older than it could know. During a control-plane outage both fail alike,
so the pass is abandoned.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("dedup_operator.cache")

Obj = dict[str, Any]

WATCH_S = 60  # the server ends each watch after this; the thread watches again
READ_TIMEOUT_S = 90.0  # a watch silent this long is a hung connection
STALE_S = 120.0  # nothing heard this long: not trusted (WATCH_S plus margin)
BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
DENIED_S = 300.0  # a kind not granted is asked again this rarely


class WatchedKind:
    """One kind's objects, by name, kept by list + watch (see the module docstring).

    `list_call` is the generated client's list function (e.g. `CoreV1Api.list_node`,
    or `list_namespaced_lease` with `namespace` given)."""

    def __init__(
        self,
        what: str,
        list_call: Callable[..., Any],
        namespace: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[Obj], None] | None = None,
    ) -> None:
        self.what = what
        self._list = list_call
        self._args: tuple[Any, ...] = (namespace,) if namespace is not None else ()
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        self._synced = False
        self._heard = 0.0  # monotonic: the last list, event, bookmark or watch start
        self._synced_since = 0.0  # monotonic: when the current unbroken view began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0  # how many times the kind was listed (relists included)
        # called with each object as it is listed, added or modified (in this thread):
        # e.g. the Lease clock sees a node's renewal when it happens, not at the next pass
        self._on_change = on_change

    # ----------------------------------------------------------------- readers
    def items(self) -> dict[str, Obj] | None:
        """A copy of the objects by name; None when not synced or not heard from lately."""
        with self._lock:
            if not self._synced or self._monotonic() - self._heard > STALE_S:
                return None
            return dict(self._items)

    def synced_since(self) -> float | None:
        """When the current unbroken view began (the list after the last failure), on
        the monotonic clock; None while not synced. Nothing that happened before it was
        seen: a Lease's age is counted from it at most (`lease_clock.ContinuousView`)."""
        with self._lock:
            if not self._synced or self._monotonic() - self._heard > STALE_S:
                return None
            return self._synced_since

    # --------------------------------------------------------------- lifecycle
    def start(self) -> WatchedKind:
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.what}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = self._monotonic() + timeout_s
        while self._monotonic() < deadline:
            if self.items() is not None:
                return True
            time.sleep(0.05)
        return False

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        failures = 0
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._relist()
                version = self._follow(version)
                failures = 0
            except ApiException as exc:
                version = None
                if exc.status == 410:  # too old to watch from: list again
                    continue
                if exc.status in (401, 403, 404):  # not granted (or no such kind): rarely
                    failures = self._failed(exc, len(BACKOFF_S) - 1, wait_s=DENIED_S)
                    continue
                failures = self._failed(exc, failures)
            except Exception as exc:  # unreachable, cut, timed out: list again later
                failures = self._failed(exc, failures)
                version = None

    def _failed(self, exc: Exception, failures: int, wait_s: float | None = None) -> int:
        with self._lock:
            was_synced, self._synced = self._synced, False
        if was_synced or failures == 0:
            log.warning(
                "watching %s: %s: %s (listing directly meanwhile)",
                self.what,
                type(exc).__name__,
                exc,
            )
        self._stop.wait(wait_s or BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
        return failures + 1

    def _changed(self, obj: Obj) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(obj)
        except Exception as exc:  # the callback's problem must not break the watch
            log.warning("watching %s: on_change: %s: %s", self.what, type(exc).__name__, exc)

    def _relist(self) -> str:
        response = self._list(*self._args, _preload_content=False, _request_timeout=30)
        body = json.loads(response.data)
        items = {o["metadata"]["name"]: o for o in body.get("items") or []}
        for obj in items.values():
            self._changed(obj)
        with self._lock:
            now = self._monotonic()
            if not self._synced:
                self._synced_since = now
            self._items, self._synced, self._heard = items, True, now
            self.lists += 1
        return str(body["metadata"]["resourceVersion"])

    def _follow(self, version: str) -> str:
        """One watch from `version` until the server ends it; returns the version reached."""
        response = self._list(
            *self._args,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_S,
            _preload_content=False,
            _request_timeout=(10, READ_TIMEOUT_S),
        )
        with self._lock:
            self._heard = self._monotonic()
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str(obj["metadata"]["resourceVersion"])
                with self._lock:
                    self._heard = self._monotonic()
                    if kind in ("ADDED", "MODIFIED"):
                        self._items[obj["metadata"]["name"]] = obj
                    elif kind == "DELETED":
                        self._items.pop(obj["metadata"]["name"], None)
                if kind in ("ADDED", "MODIFIED"):
                    self._changed(obj)
        finally:
            response.close()
            response.release_conn()
        return version
