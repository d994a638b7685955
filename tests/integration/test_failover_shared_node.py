"""Fast failover off a shared node that the cloud reports shut down (issue 27).

On a node that also runs another team's pod, the default `releaseVolume:
OutOfServiceTaint` does not taint while the node is merely lost (the taint would evict
that pod and force-detach its volumes: tests/integration/test_operator_e2e.py, about 7
minutes). The cloud provider's `node.cloudprovider.kubernetes.io/shutdown` taint says the
instance is stopped, nothing runs there: then the operator taints (once the old worker's
Lease has run out), and the partition moves in seconds. The local cluster plays the
cloud's node lifecycle controller for the killed node (`kill(node, shutdown=True)`, a
simulation): it taints only after the node is NotReady, as the real one does.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_local.kafka import KafkaBroker
from dedup_local.real_cluster import RealCluster
from support.cluster_fixtures import ClusterNamespace
from support.foreign_workload import foreign_pod
from support.kafka_fixtures import NewTopic
from support.operator_helpers import (
    events,
    reasons_once_posted,
    running_operator,
    wait_for,
    wait_for_event,
)
from support.pipeline_traffic import (
    Traffic,
    assert_output_exact,
    create_pipeline,
    partition_entry,
    pipeline_body,
    ready_pipeline,
    topics,
    wait_moved_off,
    wait_published,
    wait_untainted,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("local_crds"),
    pytest.mark.cluster_group("local-cluster"),
]

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
SHUTDOWN = "node.cloudprovider.kubernetes.io/shutdown"


class NodeWatch:
    """Polls a node in a thread: when (monotonic) it was first seen NotReady, with the
    shutdown taint, with the out-of-service taint."""

    def __init__(self, local_cluster: RealCluster, node_name: str) -> None:
        self.core = client.CoreV1Api(local_cluster.api_client())
        self.node_name = node_name
        self.first: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                node = self.core.read_node(self.node_name)
            except Exception:  # a failed read is no evidence either way
                continue
            at = time.monotonic()
            ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "")
            keys = {t.key for t in node.spec.taints or []}
            for what, seen in (
                ("not ready", ready != "True"),
                ("shutdown", SHUTDOWN in keys),
                ("out-of-service", OUT_OF_SERVICE in keys),
            ):
                if seen:
                    self.first.setdefault(what, at)

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _pod_or_none(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    try:
        return core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_shut_down_shared_node_is_tainted_and_the_partition_moves_fast(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """A foreign pod (another namespace, not a dedup worker) on the worker's node; the node
    killed during traffic with `shutdown=True`. The shutdown taint comes only after the
    node is NotReady; the operator taints the node out-of-service only after that signal
    (and after the old worker was fenced), and says so in the handover's release; the
    partition moves with its volume, store intact, output exact, in seconds rather than
    the 6-minute force-detach. The foreign pod is evicted by Kubernetes' own controllers
    (the taint-eviction controller), never deleted by the operator. After the restart the
    operator lifts its out-of-service taint and the simulation the shutdown taint."""
    ns = cluster_namespace.name
    api = local_cluster.api_client()
    core = client.CoreV1Api(api)
    other_ns = f"{ns}-team"[:63]
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other_ns)))
    topic = topics(kafka, new_topic, 1)
    body = pipeline_body("events", kafka.bootstrap, topic, 1, local_cluster.storage_class)
    lost: str | None = None
    try:
        with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log"):
            create_pipeline(api, ns, body)
            ready_pipeline(api, ns, "events", 1)
            before = partition_entry(api, ns, "events", 0)
            lost = before["node"]
            foreign = foreign_pod(api, other_ns, lost)
            foreign_ref = f"{other_ns}/{foreign}"
            traffic = Traffic(kafka.bootstrap, topic, 1)
            with traffic.running(), NodeWatch(local_cluster, lost) as watch:
                wait_published(kafka.bootstrap, topic, 0, 300)
                killed_at = time.monotonic()
                local_cluster.kill(lost, shutdown=True)
                print(f"killed {lost} (shut down) running {before['pod']} next to {foreign_ref}")

                after = wait_moved_off(local_cluster, ns, "events", 0, lost)
                took = time.monotonic() - killed_at
                sent = traffic.sent
                wait_for(lambda: traffic.sent > sent + 200, 60, "traffic after the move")
            seen = {k: round(v - killed_at, 1) for k, v in watch.first.items()}
            last = after.get("lastHandover") or {}
            print(f"moved to {after['node']} as {after['pod']} {took:.1f}s after the kill")
            print(f"seconds after the kill: {seen}; handover steps {last.get('steps')}")
            print(f"release {last.get('release')}: {last.get('releaseWhy')}")

            # the cloud's signal only after NotReady; the operator's taint only after it
            assert {"not ready", "shutdown", "out-of-service"} <= set(seen), seen
            assert seen["not ready"] <= seen["shutdown"] <= seen["out-of-service"], seen
            assert seen["out-of-service"] - seen["shutdown"] <= 30, seen
            # the handover says which signal made the taint safe
            assert last["release"] == "OutOfServiceTaint", last
            why = last["releaseWhy"]
            assert f"node {lost} is shut down ({SHUTDOWN})" in why, why
            assert foreign_ref in why, why
            assert last["steps"]["detached"] < 60, last  # not the 6-minute force-detach
            # the partition moved with its volume (store intact), epoch + 1, exactly once
            assert after["epoch"] == before["epoch"] + 1
            pod = core.read_namespaced_pod(after["pod"], ns)
            claims = [v.persistent_volume_claim.claim_name for v in pod.spec.volumes
                      if v.persistent_volume_claim]  # fmt: skip
            assert claims == ["events-p0"]
            assert_output_exact(kafka.bootstrap, topic, traffic)
            reasons = reasons_once_posted(api, ns, "events", "FailoverCompleted")
            assert reasons.count("FailoverCompleted") == 1, reasons
            tainted = wait_for_event(api, ns, "events", "Warning", "NodeOutOfService")
            assert any("is shut down" in m for m in tainted), tainted

            # the foreign pod: evicted by the taint-eviction controller (Kubernetes' own
            # reaction to the out-of-service taint), never by the operator
            def evicted() -> list[str]:
                found = core.list_namespaced_event(
                    other_ns, field_selector=f"involvedObject.name={foreign}"
                ).items
                return [f"{e.source.component}: {e.reason}" for e in found
                        if e.reason == "TaintManagerEviction"]  # fmt: skip

            print(f"{foreign_ref}: {wait_for(evicted, 60, 'the taint-eviction Event')}")
            wait_for(
                lambda: (
                    (p := _pod_or_none(core, other_ns, foreign)) is None
                    or p.metadata.deletion_timestamp is not None
                ),
                60,
                f"{foreign_ref} evicted",
            )
            ours = [m for _, r, m in events(api, ns, "events") if r == "WorkerDeleted"]
            assert ours and not any(foreign in m for m in ours), ours
            # only its own taint is the operator's: the shutdown taint stays while down
            node = core.read_node(lost)
            assert SHUTDOWN in {t.key for t in node.spec.taints or []}

            local_cluster.restart(lost)
            restarted = lost
            lost = None
            wait_untainted(local_cluster, restarted)  # the operator lifts its own taint
            keys = {t.key for t in core.read_node(restarted).spec.taints or []}
            assert SHUTDOWN not in keys, keys  # the (simulated) cloud lifted its own
            print(f"test body {time.monotonic() - killed_at:.1f}s from the kill")
    finally:
        if lost is not None:
            local_cluster.restart(lost)
        try:
            core.delete_namespace(other_ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
