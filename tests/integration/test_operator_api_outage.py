"""A control-plane outage is not a node loss: kube-apiserver really stopped for 30 s
under a running pipeline (the operator, three worker pods on three nodes, live traffic)
→ no pod restarted or replaced, no handover begun, every partition committing again
within seconds of the API's return, and the output exact.

What it exercises: the workers pause instead of dying (their Lease's renew deadline
passes with the API down), the operator's full-disruption rule (every node's heartbeat
stale at once is the control plane, not the nodes), and its view-gap rule (after the
outage each node gets nodeLostAfter from the API's return, so nodes renewing a second
apart do not make the later ones look lost).

The local cluster is this module's own: stopping the session's shared API server would
disturb every other test of its process. Processes, not containers: what is tested is
the control plane's absence, not the image."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dedup_contract import names
from dedup_contract.names import default_consumer_group
from dedup_local.cluster import LocalCluster
from dedup_local.kafka import KafkaBroker, committed_offsets
from support.cluster_fixtures import running_cluster
from support.kafka_fixtures import NewTopic
from support.operator_helpers import events, get_pipeline, running_operator, wait_for
from support.pipeline_traffic import (
    Traffic,
    assert_output_exact,
    create_pipeline,
    pipeline_body,
    ready_pipeline,
    topics,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]

PARTITIONS = 3
OUTAGE_S = 30.0
QUIET_AFTER_S = 20.0  # > nodeLostAfter + leaseDuration of the test pipeline: no late handover
BACK_WITHIN_S = 15.0  # from /readyz answering again to every partition's next commit


@pytest.fixture(scope="module")
def own_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    yield from running_cluster(request)


def worker_pods(api: client.ApiClient, ns: str) -> dict[str, tuple[str, int, str]]:
    """pod name -> (uid, restarts, node)"""
    pods = client.CoreV1Api(api).list_namespaced_pod(
        ns, label_selector=f"{names.LABEL_PIPELINE}=events"
    )
    return {
        p.metadata.name: (
            p.metadata.uid,
            sum(s.restart_count for s in p.status.container_statuses or []),
            p.spec.node_name,
        )
        for p in pods.items
    }


def test_api_server_stopped_30s_no_restart_no_handover_exact_output(
    own_cluster: LocalCluster, kafka: KafkaBroker, new_topic: NewTopic, tmp_path: Path
) -> None:
    plane = own_cluster.control_plane
    assert plane is not None
    api = own_cluster.api_client()
    ns = "outage"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    wait_for(
        lambda: client.CoreV1Api(api).list_namespaced_service_account(ns).items,
        60,
        "the namespace's default ServiceAccount",
    )
    topic = topics(kafka, new_topic, PARTITIONS)
    group = default_consumer_group("events")
    with running_operator(own_cluster.kubeconfig_path, ns, tmp_path / "operator.log") as op:
        create_pipeline(
            api,
            ns,
            pipeline_body("events", kafka.bootstrap, topic, PARTITIONS, own_cluster.storage_class),
        )
        ready_pipeline(api, ns, "events", PARTITIONS)
        before = worker_pods(api, ns)
        assert len({node for _, _, node in before.values()}) >= 2, before
        traffic = Traffic(kafka.bootstrap, topic, PARTITIONS)

        def committed() -> list[int]:
            return committed_offsets(kafka.bootstrap, group, topic, list(range(PARTITIONS)))

        with traffic.running():
            wait_for(lambda: min(committed()) > 200, 90, "every partition committing")
            plane.stop_apiserver()
            stopped = time.monotonic()
            time.sleep(5)
            frozen = committed()
            time.sleep(OUTAGE_S - 5)
            assert committed() == frozen, "a worker committed with the API server down"
            plane.start_apiserver()
            back = time.monotonic()
            print(f"API server down {back - stopped:.1f}s")
            api = own_cluster.api_client()
            resumed = [0.0] * PARTITIONS
            deadline = back + 60
            while not all(resumed) and time.monotonic() < deadline:
                now_committed = committed()
                for p in range(PARTITIONS):
                    if not resumed[p] and now_committed[p] > frozen[p]:
                        resumed[p] = time.monotonic() - back
                time.sleep(0.2)
            print("each partition committing again after the API's return (s): "
                  + ", ".join(f"{s:.1f}" for s in resumed))  # fmt: skip
            assert all(resumed), f"partitions not committing again: {resumed}"
            assert max(resumed) <= BACK_WITHIN_S, resumed
            time.sleep(QUIET_AFTER_S)  # a late, wrong node-loss handover would start here
        assert_output_exact(kafka.bootstrap, topic, traffic)

        after = worker_pods(api, ns)
        if after != before:
            for pod in after:
                print(f"--- {pod}:\n" + "\n".join(own_cluster.pod_log(ns, pod).splitlines()[-40:]))
        assert after == before, f"pods replaced or restarted: {before} -> {after}"
        found: dict[str, Any] = get_pipeline(api, ns, "events") or {}
        status = found.get("status") or {}
        assert int(status.get("failovers") or 0) == 0, status
        assert not any(p.get("handover") for p in status.get("partitions") or []), status
        reasons = {reason for _, reason, _ in events(api, ns, "events")}
        assert not reasons & {"FailoverStarted", "WorkerFenced", "NodeOutOfService"}, reasons
        try:
            ready_pipeline(api, ns, "events", PARTITIONS)
        except AssertionError:
            op.process.send_signal(signal.SIGUSR1)  # every thread's stack into its log
            time.sleep(2)
            print(op.log()[-8000:])
            print(json.dumps((get_pipeline(api, ns, "events") or {}).get("status"), indent=1))
            print(own_cluster.kubectl("get", "pods,nodes", "-n", ns, "-o", "wide").stdout)
            for pod in client.CoreV1Api(api).list_namespaced_pod(ns).items:
                print(pod.metadata.name, [(c.type, c.status) for c in pod.status.conditions or []])
            raise
