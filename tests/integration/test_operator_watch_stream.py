"""The operator's watches read the real API server's stream with their own reader
(dedup_operator.watch_stream), events gathered: a burst of Lease renewals arrives
whole and in order, the last one held by the cache, with the fast path taken (not the
client's fallback reader). Real kube-apiserver."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from dedup_contract.timefmt import format_micro_time
from dedup_operator import watch_stream
from dedup_operator.cache import WatchedKind
from support.kube_fixtures import KubeNamespace
from support.operator_helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]

LEASES = 20
RENEWALS = 10


def test_a_burst_of_renewals_is_followed_whole_through_the_watchs_own_reader(
    kube_namespace: KubeNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = client.CoordinationV1Api(kube_namespace.api_client)
    ns = kube_namespace.name
    now = format_micro_time(datetime.now(UTC))
    for i in range(LEASES):
        body: Any = {
            "metadata": {"name": f"l{i}", "labels": {"dedup.io/pipeline": "p"}},
            "spec": {"holderIdentity": f"w{i}", "leaseDurationSeconds": 15, "renewTime": now},
        }
        leases.create_namespaced_lease(ns, body)

    fast_paths: list[bool] = []
    body_reader = watch_stream._body_reader

    def noted(response: Any) -> Any:
        reader = body_reader(response)
        fast_paths.append(reader is not None)
        return reader

    monkeypatch.setattr(watch_stream, "_body_reader", noted)
    changes: list[tuple[str, str]] = []
    lock = threading.Lock()

    def changed(obj: dict[str, Any]) -> None:
        with lock:
            changes.append((obj["metadata"]["name"], obj["spec"]["holderIdentity"]))

    watched = WatchedKind(
        "leases",
        leases.list_namespaced_lease,
        ns,
        label_selector="dedup.io/pipeline",
        on_change=changed,
    )
    watched.start()
    try:
        assert watched.wait_synced(30)
        with lock:
            changes.clear()
        for round_ in range(RENEWALS):
            for i in range(LEASES):
                patch = {"spec": {"holderIdentity": f"w{i}-{round_}"}}
                leases.patch_namespaced_lease(f"l{i}", ns, patch)
        last = {f"l{i}": f"w{i}-{RENEWALS - 1}" for i in range(LEASES)}

        def all_seen() -> bool:
            items = watched.items() or {}
            held = {
                obj["metadata"]["name"]: obj["spec"]["holderIdentity"] for obj in items.values()
            }
            return held == last

        wait_for(all_seen, timeout=30, what="the cache holding every Lease's last renewal")
        with lock:
            seen = list(changes)
        for i in range(LEASES):  # every renewal of each Lease, in order
            assert [h for n, h in seen if n == f"l{i}"] == [f"w{i}-{r}" for r in range(RENEWALS)]
        assert fast_paths and all(fast_paths), "the real server's watch is read by watch_stream"
        assert watched.lists == 1
    finally:
        watched.stop()
