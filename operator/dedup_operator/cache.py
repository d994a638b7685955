"""What every pass looks at, kept by watching instead of listing (as client-go's informers).

A pass needs every Node, node heartbeat Lease and VolumeAttachment, and its pipeline's
worker pods, volume claims and partition Leases. Listed on every pass, the operator's
load on the API server grows with nodes and partitions times pipelines per interval. A
`WatchedKind` lists a kind once (narrowed by a label selector), then follows its watch:
a pass reads memory, its requests do not grow with the cluster. Per kind, one thread:

1. list (raw JSON), keep the items by key and the list's resourceVersion: *synced*;
2. watch from that version, applying ADDED/MODIFIED/DELETED and moving the version on
   with each event and bookmark; the server ends each watch after `WATCH_S`, and the
   thread watches again from the version it holds (no relist);
3. 410 Gone (the version too old) → relist; any other error (the API server
   unreachable, a connection cut) → *not synced* until a list succeeds (capped backoff).

Objects may be *grouped* (`group(obj)`: e.g. pods by namespace and pipeline), so a pass
reads its own (`select`). The operator's own writes are held at once (`wrote`: what
controller-runtime's expectations make up for), so a pass right after a create sees it;
an event older than what is held (resourceVersions compared as etcd's numbers) is not
taken. `items()`/`select()` return None when not synced, *or nothing was heard for
`STALE_S`* (a silently hung connection: a healthy stream is heard at least every
`WATCH_S`); the caller then lists directly, never deciding on data older than it could
know. During a control-plane outage both fail alike, and the pass is abandoned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from dedup_operator import watch_stream

log = logging.getLogger("dedup_operator.cache")

Obj = dict[str, Any]

WATCH_S = 60  # the server ends each watch after this; the thread watches again
READ_TIMEOUT_S = 90.0  # a watch silent this long is a hung connection
STALE_S = 120.0  # nothing heard this long: not trusted (WATCH_S plus margin)
BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
SYNCED = "SYNCED"  # `on_event` after a list: what happened before it is not known
DENIED_S = 300.0  # a kind not granted is asked again this rarely
GATHER_S = 0.02
"""A watch with nothing more waiting on its connection sleeps this long before reading
on, so that events gather and one wakeup takes several (`watch_stream`): at 1,000
partitions' 200 Lease renewals a second the wakeup per event was most of the watch's CPU
(bench/lease_watch.py). Every event waits this much longer at most."""


def by_name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def by_namespace_and_name(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


def newer(held: Obj, incoming: Obj) -> bool:
    """`held` is a later version than `incoming` (both etcd-issued resourceVersions);
    False when either is not a number (then the incoming one is taken)."""
    a = str(held["metadata"].get("resourceVersion") or "")
    b = str(incoming["metadata"].get("resourceVersion") or "")
    return a.isdigit() and b.isdigit() and int(a) > int(b)


class WatchedKind:
    """One kind's objects, by key (the name unless `key` says otherwise), kept by list +
    watch (see the module docstring).

    `list_call` is the generated client's list function (e.g. `CoreV1Api.list_node`,
    or `list_namespaced_lease` with `namespace` given, or a custom objects' list with
    its `args`); `label_selector` narrows it;
    `group(obj)` names the group `select` reads (None: in no group)."""

    def __init__(
        self,
        what: str,
        list_call: Callable[..., Any],
        namespace: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[Obj], None] | None = None,
        label_selector: str | None = None,
        key: Callable[[Obj], str] = by_name,
        group: Callable[[Obj], Hashable | None] | None = None,
        args: tuple[Any, ...] | None = None,
        on_event: Callable[[str, Obj | None, Obj | None], None] | None = None,
    ) -> None:
        self.what = what
        self._list = list_call
        # the list call's positional arguments: `args` (a custom resource's group,
        # version, [namespace,] plural), else the namespace, if any
        self._args: tuple[Any, ...] = (
            args if args is not None else (namespace,) if namespace is not None else ()
        )
        self._selector: dict[str, str] = (
            {"label_selector": label_selector} if label_selector else {}
        )
        self._key = key
        self._group = group
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        self._groups: dict[Hashable, set[str]] = {}  # group -> keys (with `group`)
        self._synced = False
        self._heard = 0.0  # monotonic: the last list, event, bookmark or watch start
        self._synced_since = 0.0  # monotonic: when the current unbroken view began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0  # how many times the kind was listed (relists included)
        # called with each object as it is listed, added or modified (in this thread):
        # e.g. the Lease clock sees a node's renewal when it happens, not at the next pass
        self._on_change = on_change
        # called (in this thread) with each watch event taken: its type (ADDED, MODIFIED,
        # DELETED), what was held before (None: nothing) and the object; and with SYNCED
        # after each list (what happened before it is not known): what wakes a pass
        self._on_event = on_event

    # ----------------------------------------------------------------- readers
    def _trusted(self) -> bool:  # with the lock held
        return self._synced and self._monotonic() - self._heard <= STALE_S

    def items(self) -> dict[str, Obj] | None:
        """A copy of the objects by key; None when not synced or not heard from lately."""
        with self._lock:
            return dict(self._items) if self._trusted() else None

    def select(self, group: Hashable) -> dict[str, Obj] | None:
        """The objects of one group, by name; None when not trusted (as `items`)."""
        with self._lock:
            if not self._trusted():
                return None
            found = (self._items[k] for k in self._groups.get(group, ()))
            return {o["metadata"]["name"]: o for o in found}

    def get(self, key: str) -> tuple[bool, Obj | None]:
        """(trusted, the object held under `key` or None): not trusted as `items`."""
        with self._lock:
            return (True, self._items.get(key)) if self._trusted() else (False, None)

    def wrote(self, obj: Obj) -> None:
        """The operator created or changed `obj` (the API server's answer): held at once,
        unless a later version is held already."""
        with self._lock:
            self._put(obj)

    def _put(self, obj: Obj) -> bool:
        """Hold `obj` unless a later version is held (lock held); True if held. Held
        without its `metadata.managedFields`, which nothing here reads: a pod's are
        about half its JSON, and the watches hold every worker's pod, claim and Lease."""
        key = self._key(obj)
        held = self._items.get(key)
        if held is not None and newer(held, obj):
            return False
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
        if held is not None:
            self._ungroup(key, held)
        self._items[key] = obj
        if self._group is not None:
            group = self._group(obj)
            if group is not None:
                self._groups.setdefault(group, set()).add(key)
        return True

    def _drop(self, obj: Obj) -> bool:
        """A deletion, unless what is held is later (made again since, by the operator);
        True if dropped."""
        key = self._key(obj)
        held = self._items.get(key)
        if held is None or newer(held, obj):
            return False
        del self._items[key]
        self._ungroup(key, held)
        return True

    def _ungroup(self, key: str, held: Obj) -> None:
        if self._group is None:
            return
        group = self._group(held)
        keys = self._groups.get(group) if group is not None else None
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._groups[group]

    def synced_since(self) -> float | None:
        """When the current unbroken view began (the list after the last failure), on
        the monotonic clock; None while not synced. Nothing that happened before it was
        seen: a Lease's age is counted from it at most (`lease_clock.ContinuousView`)."""
        with self._lock:
            return self._synced_since if self._trusted() else None

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
        if self._stop.is_set():  # stopped: the connection's end is expected, not told
            return failures
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

    def _event(self, event: str, held: Obj | None, obj: Obj | None) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event, held, obj)
        except Exception as exc:  # the callback's problem must not break the watch
            log.warning("watching %s: on_event: %s: %s", self.what, type(exc).__name__, exc)

    def _relist(self) -> str:
        response = self._list(
            *self._args, **self._selector, _preload_content=False, _request_timeout=30
        )
        body = orjson.loads(response.data)
        listed = body.get("items") or []
        for obj in listed:
            self._changed(obj)
        with self._lock:
            now = self._monotonic()
            if not self._synced:
                self._synced_since = now
            self._items, self._groups = {}, {}
            for obj in listed:
                self._put(obj)
            self._synced, self._heard = True, now
            self.lists += 1
        self._event(SYNCED, None, None)
        return str(body["metadata"]["resourceVersion"])

    def _follow(self, version: str) -> str:
        """One watch from `version` until the server ends it; returns the version reached."""
        response = self._list(
            *self._args,
            **self._selector,
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
            for line in watch_stream.lines(response, self._stop, GATHER_S):
                if self._stop.is_set():
                    break
                event = orjson.loads(line)  # (3-4x the standard parser's speed)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str(obj["metadata"]["resourceVersion"])
                taken, held = False, None
                with self._lock:
                    self._heard = self._monotonic()
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        held = self._items.get(self._key(obj))
                    if kind in ("ADDED", "MODIFIED"):
                        taken = self._put(obj)
                    elif kind == "DELETED":
                        taken = self._drop(obj)
                if taken and kind != "DELETED":
                    self._changed(obj)
                echo = held is not None and kind != "DELETED" and not newer(obj, held)
                if taken and not echo:  # (an echo: the operator's own write, held already)
                    self._event(kind, held, obj)
        finally:
            response.close()
            response.release_conn()
        return version
