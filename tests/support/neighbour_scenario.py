"""The local-cluster group's 7-minute failover, run in the background of the session.

A lost node that also runs another team's pod is never tainted out-of-service (the taint
would evict that pod and force-detach its volumes): the operator says so, force-deletes
only its own pod, and the partition waits out the attach/detach controller's own
force-detach, its maxWaitForUnmountDuration, 6 minutes hard-coded in
kube-controller-manager. Then it moves, the other pod was never evicted and the output
is exact.

Six of those minutes are waiting, and the group is the suite's longest, so the scenario
runs beside the group's other tests instead of between them: on a node of its own
(`RESERVED_NODE`, the session cluster's fourth, tainted `RESERVED_TAINT` NoSchedule so
that no other test's pod lands there), in a namespace of its own with an operator of its
own. `test_operator_e2e.py` holds its two halves, ordered first and last in the group
(tests/conftest.py): the first starts it and sees the node killed beside the other pod,
the last checks the operator's refusal to taint, the move and the output.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dedup_local.kafka import KafkaBroker
from dedup_local.operator_process import running_operator
from dedup_local.real_cluster import RealCluster
from support.cluster_fixtures import RESERVED_NODE, RESERVED_TAINT
from support.foreign_workload import foreign_pod
from support.kube_fixtures import _wait_for_default_service_account
from support.operator_helpers import (
    condition,
    drop_finalizers,
    get_pipeline,
    wait_for,
    wait_for_event,
)
from support.pipeline_traffic import (
    Traffic,
    assert_output_exact,
    create_pipeline,
    dump_pipeline,
    partition_entry,
    pipeline_body,
    ready_pipeline,
)

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
NEIGHBOUR = "neighbour"
WARNING = "Warning"  # the kind of Event the operator posts (dedup_operator.events)


@dataclass
class Findings:
    """What the scenario saw; the two tests assert on it."""

    namespace: str = ""
    lost: str | None = None
    before: dict[str, Any] = field(default_factory=dict)
    failing: dict[str, Any] | None = None  # FailingOver once the taint was refused
    warned: list[Any] = field(default_factory=list)  # the OutOfServiceTaintBlocked Event
    after: dict[str, Any] | None = None  # the partition's entry once it moved
    took_s: float | None = None  # kill -> moved
    tainted: bool = False  # the lost node was ever tainted out-of-service
    neighbour: Any = None  # the foreign pod as read after the move
    exact: bool = False  # the output exact after the move


class NeighbourScenario:
    """Runs the scenario in a thread; `killed` is set once the node is killed (or the
    scenario failed), `done` when it ended; `error` is what failed."""

    def __init__(self, cluster: RealCluster, kafka: KafkaBroker, tmp: Path) -> None:
        self.cluster, self.kafka, self.tmp = cluster, kafka, tmp
        self.found = Findings(namespace=f"neighbour-{uuid.uuid4().hex[:6]}")
        self.error: BaseException | None = None
        self.killed = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="neighbour-scenario", daemon=True)

    def start(self) -> NeighbourScenario:
        self._thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # re-raised by the tests
            self.error = exc
        finally:
            self.killed.set()
            self.done.set()

    def _run(self) -> None:
        cluster, kafka, found = self.cluster, self.kafka, self.found
        api = cluster.api_client()
        core = client.CoreV1Api(api)
        ns = found.namespace
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        _wait_for_default_service_account(core, ns)
        topic = f"{ns}-events"
        for name in (topic, f"{topic}-out", f"{topic}-dlq"):
            kafka.create_topic(name, 1)
        body = pipeline_body("events", kafka.bootstrap, topic, 1, cluster.storage_class)
        body["spec"]["worker"]["tolerations"] = [{**RESERVED_TAINT, "operator": "Equal"}]
        prefer = {"key": "kubernetes.io/hostname", "operator": "In", "values": [RESERVED_NODE]}
        body["spec"]["worker"]["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [prefer]}}
                ]
            }
        }
        traffic = Traffic(kafka.bootstrap, topic, 1)
        log = self.tmp / "neighbour-operator.log"
        try:
            with running_operator(cluster.kubeconfig_path, ns, log):
                create_pipeline(api, ns, body)
                ready_pipeline(api, ns, "events", 1)
                found.before = partition_entry(api, ns, "events", 0)
                assert found.before["node"] == RESERVED_NODE, found.before
                foreign_pod(api, ns, RESERVED_NODE, NEIGHBOUR)
                for _ in range(4):
                    traffic.batch()
                assert_output_exact(kafka.bootstrap, topic, traffic)
                self._lose_the_node(api, ns, traffic, topic)
        finally:
            traffic.close()
            if found.lost is not None:
                cluster.restart(found.lost)
            drop_finalizers(api, ns, "events")
            core.delete_namespace(ns)

    def _lose_the_node(self, api: Any, ns: str, traffic: Traffic, topic: str) -> None:
        cluster, found = self.cluster, self.found
        killed_at = time.monotonic()
        stop_watching = threading.Event()

        def watch_taints() -> None:
            while not stop_watching.wait(0.25):
                try:
                    node = client.CoreV1Api(api).read_node(RESERVED_NODE)
                except Exception:  # a failed read is no evidence either way
                    continue
                if OUT_OF_SERVICE in {t.key for t in node.spec.taints or []}:
                    found.tainted = True

        watcher = threading.Thread(target=watch_taints, daemon=True)
        watcher.start()
        try:
            found.lost = RESERVED_NODE
            cluster.kill(RESERVED_NODE)
            self.killed.set()

            def blocked() -> dict[str, Any] | None:
                c = condition(get_pipeline(api, ns, "events"), "FailingOver")
                return c if c and "not tainting" in c["message"] else None

            found.failing = wait_for(blocked, 90, "the operator to say the taint is blocked")
            found.warned = wait_for_event(
                api, ns, "events", WARNING, "OutOfServiceTaintBlocked", timeout=60
            )

            def moved() -> dict[str, Any] | None:
                e = partition_entry(api, ns, "events", 0)
                ok = e.get("node") not in (None, RESERVED_NODE) and e.get("ready")
                return e if ok and not e.get("handover") else None

            try:
                found.after = wait_for(moved, 600, "partition 0 to move after the force-detach", 2)
            except AssertionError:
                dump_pipeline(cluster, ns)
                raise
            found.took_s = time.monotonic() - killed_at
        finally:
            stop_watching.set()
            watcher.join(timeout=5)
        found.neighbour = client.CoreV1Api(api).read_namespaced_pod(NEIGHBOUR, ns)
        for _ in range(2):
            traffic.batch()
        traffic.close()
        assert_output_exact(self.kafka.bootstrap, topic, traffic)
        found.exact = True


@pytest.fixture(scope="session")
def neighbour_scenario(
    local_cluster: RealCluster, kafka: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NeighbourScenario]:
    """The scenario, started by the first test that asks for it (the group's first, by
    tests/conftest.py's order); at the session's end its cleanup (the node restarted, the
    namespace deleted) is waited for before the cluster stops."""
    scenario = NeighbourScenario(local_cluster, kafka, tmp_path_factory.mktemp("neighbour"))
    yield scenario.start()
    scenario.join(900)
