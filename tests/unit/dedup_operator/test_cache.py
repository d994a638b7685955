"""The watch cache's grouping and its hold of the operator's own writes
(dedup_operator.cache.WatchedKind), against a scripted API server: one list, then one
watch stream of events, then empty watches. The real API server's watch is exercised by
tests/integration/test_operator_api_load.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from dedup_operator.cache import WatchedKind, by_namespace_and_name, newer


def lease(ns: str, name: str, pipeline: str | None, rv: int, holder: str = "w") -> dict[str, Any]:
    labels = {"dedup.io/pipeline": pipeline} if pipeline else {}
    return {
        "metadata": {"namespace": ns, "name": name, "labels": labels, "resourceVersion": str(rv)},
        "spec": {"holderIdentity": holder},
    }


class Response:
    def __init__(self, body: bytes) -> None:
        self.data = body

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield self.data

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class ScriptedServer:
    """list → `listed`; the first watch → `events` (then `streamed` is set); later
    watches → nothing. Records the arguments of every call."""

    def __init__(self, listed: list[dict[str, Any]], events: list[tuple[str, Any]]) -> None:
        self.listed, self.events = listed, events
        self.calls: list[dict[str, Any]] = []
        self.streamed = threading.Event()
        self.before_events = threading.Event()  # the test lets the watch begin

    def __call__(self, *args: Any, **kwargs: Any) -> Response:
        self.calls.append({"args": args, **kwargs})
        if not kwargs.get("watch"):
            body = {"metadata": {"resourceVersion": "10"}, "items": self.listed}
            return Response(json.dumps(body).encode())
        if self.streamed.is_set():
            time.sleep(0.05)
            return Response(b"")
        self.before_events.wait(5)
        lines = b"".join(
            json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in self.events
        )
        self.streamed.set()
        return Response(lines)


def soon(done: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until `done()` (the watch thread applies the scripted events), at most
    `timeout_s`; the test's asserts then say what is wrong."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done():
        time.sleep(0.01)


def pipeline_of(obj: dict[str, Any]) -> tuple[str, str] | None:
    meta = obj["metadata"]
    p = (meta.get("labels") or {}).get("dedup.io/pipeline")
    return (meta["namespace"], p) if p else None


def watched(server: ScriptedServer, seen: list[str] | None = None) -> WatchedKind:
    return WatchedKind(
        "leases",
        server,
        "ns",
        label_selector="dedup.io/pipeline",
        key=by_namespace_and_name,
        group=pipeline_of,
        on_change=(lambda o: seen.append(o["metadata"]["name"])) if seen is not None else None,
    )


def test_a_pass_reads_only_its_pipelines_objects_and_nothing_before_the_first_list() -> None:
    server = ScriptedServer(
        [lease("ns", "a-p0", "a", 5), lease("ns", "a-p1", "a", 6), lease("ns", "b-p0", "b", 7)],
        [],
    )
    kind = watched(server)
    assert kind.select(("ns", "a")) is None  # not synced: the caller lists directly
    kind.start()
    try:
        assert kind.wait_synced(5)
        assert sorted(kind.select(("ns", "a")) or {}) == ["a-p0", "a-p1"]
        assert sorted(kind.select(("ns", "b")) or {}) == ["b-p0"]
        assert kind.select(("ns", "c")) == {}
        assert kind.get("ns/b-p0")[0] and kind.get("ns/b-p0")[1] is not None
        assert kind.get("ns/zz") == (True, None)
        assert server.calls[0]["label_selector"] == "dedup.io/pipeline"
        assert server.calls[0]["args"] == ("ns",)
    finally:
        server.before_events.set()
        kind.stop()


def test_events_move_objects_between_groups_and_deletions_remove_them() -> None:
    server = ScriptedServer(
        [lease("ns", "a-p0", "a", 5), lease("ns", "a-p1", "a", 6)],
        [
            ("MODIFIED", lease("ns", "a-p1", "b", 11)),  # relabelled: now pipeline b's
            ("DELETED", lease("ns", "a-p0", "a", 12)),
            ("ADDED", lease("ns", "a-p2", "a", 13)),
            ("BOOKMARK", {"metadata": {"resourceVersion": "14"}}),
        ],
    )
    seen: list[str] = []
    kind = watched(server, seen)
    kind.start()
    try:
        assert kind.wait_synced(5)
        server.before_events.set()
        assert server.streamed.wait(5)
        soon(lambda: "a-p2" in (kind.select(("ns", "a")) or {}))
        assert sorted(kind.select(("ns", "a")) or {}) == ["a-p2"]
        assert sorted(kind.select(("ns", "b")) or {}) == ["a-p1"]
        assert seen == ["a-p0", "a-p1", "a-p1", "a-p2"]  # listed, then as changed
        watches = [c for c in server.calls if c.get("watch")]
        assert watches[0]["resource_version"] == "10"
        assert watches[1]["resource_version"] == "14"  # moved on by the bookmark
    finally:
        kind.stop()


def test_objects_are_held_without_their_managed_fields() -> None:
    fields = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    listed = lease("ns", "a-p0", "a", 5)
    listed["metadata"]["managedFields"] = fields
    changed = lease("ns", "a-p1", "a", 11)
    changed["metadata"]["managedFields"] = fields
    server = ScriptedServer([listed], [("ADDED", changed)])
    kind = watched(server)
    kind.start()
    try:
        assert kind.wait_synced(5)
        server.before_events.set()
        assert server.streamed.wait(5)
        soon(lambda: "a-p1" in (kind.select(("ns", "a")) or {}))
        held = kind.select(("ns", "a")) or {}
        assert sorted(held) == ["a-p0", "a-p1"]
        assert all("managedFields" not in o["metadata"] for o in held.values())
        written = lease("ns", "a-p2", "a", 20)
        written["metadata"]["managedFields"] = fields
        kind.wrote(written)
        assert "managedFields" not in (kind.get("ns/a-p2")[1] or {})["metadata"]
        assert held["a-p0"]["metadata"]["resourceVersion"] == "5"  # the rest kept
    finally:
        kind.stop()


def test_the_operators_write_is_seen_at_once_and_an_older_event_does_not_undo_it() -> None:
    server = ScriptedServer(
        [lease("ns", "a-p0", "a", 5)],
        [
            ("MODIFIED", lease("ns", "a-p0", "a", 20, holder="w")),  # older than the write
            ("MODIFIED", lease("ns", "a-p0", "a", 30, holder="w2")),  # later: taken
        ],
    )
    seen: list[str] = []
    kind = watched(server, seen)
    kind.start()
    try:
        assert kind.wait_synced(5)
        kind.wrote(lease("ns", "a-p0", "a", 25, holder=""))  # e.g. the fence's answer
        kind.wrote(lease("ns", "a-p9", "a", 26))  # e.g. a created Lease
        held = kind.select(("ns", "a")) or {}
        assert held["a-p0"]["spec"]["holderIdentity"] == ""
        assert "a-p9" in held
        server.before_events.set()
        assert server.streamed.wait(5)
        soon(
            lambda: (
                (kind.get("ns/a-p0")[1] or {}).get("metadata", {}).get("resourceVersion") == "30"
            )
        )
        assert (kind.get("ns/a-p0")[1] or {})["spec"]["holderIdentity"] == "w2"
        assert seen == ["a-p0", "a-p0"]  # the older event was not taken, nor told
    finally:
        kind.stop()


def test_resource_versions_compare_as_numbers_and_otherwise_the_incoming_wins() -> None:
    def at(rv: str) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": rv}}

    assert newer(at("100"), at("99"))  # not as strings ("100" < "99")
    assert not newer(at("99"), at("100"))
    assert not newer(at("7"), at("7"))
    assert not newer(at("x1"), at("1"))
    assert not newer(at(""), at("1"))


def test_a_deletion_does_not_undo_an_object_made_again_since() -> None:
    server = ScriptedServer(
        [lease("ns", "a-p0", "a", 5)],
        [("DELETED", lease("ns", "a-p0", "a", 20)), ("ADDED", lease("ns", "a-p1", "a", 40))],
    )
    kind = watched(server)
    kind.start()
    try:
        assert kind.wait_synced(5)
        kind.wrote(lease("ns", "a-p0", "a", 30, holder="again"))  # made again by the operator
        server.before_events.set()
        assert server.streamed.wait(5)
        soon(lambda: "a-p1" in (kind.select(("ns", "a")) or {}))
        held = kind.select(("ns", "a")) or {}
        assert sorted(held) == ["a-p0", "a-p1"]
        assert held["a-p0"]["spec"]["holderIdentity"] == "again"
    finally:
        kind.stop()


def test_events_are_told_with_what_was_held_and_an_echo_of_our_write_is_not() -> None:
    server = ScriptedServer(
        [lease("ns", "a-p0", "a", 5)],
        [
            ("MODIFIED", lease("ns", "a-p0", "a", 11, holder="x")),  # our write's echo
            ("MODIFIED", lease("ns", "a-p0", "a", 12, holder="y")),
            ("DELETED", lease("ns", "a-p0", "a", 13, holder="y")),
        ],
    )
    told: list[tuple[str, str | None, str | None]] = []

    def rv(o: dict[str, Any] | None) -> str | None:
        return None if o is None else str(o["metadata"]["resourceVersion"])

    kind = WatchedKind(
        "leases",
        server,
        "ns",
        key=by_namespace_and_name,
        group=pipeline_of,
        on_event=lambda event, held, obj: told.append((event, rv(held), rv(obj))),
    )
    kind.start()
    try:
        assert kind.wait_synced(5)
        kind.wrote(lease("ns", "a-p0", "a", 11, holder="x"))
        server.before_events.set()
        assert server.streamed.wait(5)
        soon(lambda: len(told) >= 3)
    finally:
        kind.stop()
    assert told == [("SYNCED", None, None), ("MODIFIED", "11", "12"), ("DELETED", "12", "13")]
