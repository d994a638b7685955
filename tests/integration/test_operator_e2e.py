"""The operator end to end on the local cluster: real nodes (kubelet, containerd) that run
worker pods as containers of the project's image, with disks through real CSI, the real
Kafka broker, `dedup-operator` as a real
process, and an independent reader of the output (read_committed).

- a 4-partition pipeline runs on >= 2 nodes and deduplicates live traffic exactly;
- node loss during traffic: the partition moves to another node on the same volume,
  store intact, output exact;
- the operator killed in the middle of a failover and restarted: the failover completes
  once;
- never harm a neighbour: a lost node that runs another workload is not tainted (the
  partition waits for the detach instead); a node healed after its worker was fenced is
  released gracefully, never tainted.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_local.pod_health import log_problems, unhealthy
from dedup_local.real_cluster import RealCluster
from support.cluster_fixtures import RESERVED_NODE, ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.neighbour_scenario import NEIGHBOUR, NeighbourScenario
from support.operator_helpers import (
    events,
    get_pipeline,
    reasons_once_posted,
    running_operator,
    wait_for,
)
from support.pipeline_traffic import (
    Traffic,
    assert_output_exact,
    create_pipeline,
    dump_pipeline,
    lose_a_node_during_traffic,
    partition_entry,
    pipeline_body,
    ready_pipeline,
    topics,
    wait_untainted,
)
from support.worker_helpers import output_ids

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("local_crds"),
    pytest.mark.cluster_group("local-cluster"),
]


def test_four_partitions_run_on_nodes_and_deduplicate_live_traffic(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = cluster_namespace.name
    api = local_cluster.api_client()
    topic = topics(kafka, new_topic, 4)
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log") as op:
        t0 = time.monotonic()
        create_pipeline(
            api, ns, pipeline_body("events", kafka.bootstrap, topic, 4, local_cluster.storage_class)
        )
        found = ready_pipeline(api, ns, "events", 4)
        print(f"pipeline Ready after {time.monotonic() - t0:.1f}s")
        core = client.CoreV1Api(api)
        selector = f"{names.LABEL_PIPELINE}=events"
        pvcs = core.list_namespaced_persistent_volume_claim(ns, label_selector=selector).items
        assert sorted(p.metadata.name for p in pvcs) == [f"events-p{i}" for i in range(4)]
        assert all(p.status.phase == "Bound" for p in pvcs)
        leases = client.CoordinationV1Api(api).list_namespaced_lease(ns, label_selector=selector)
        holders = {lease.metadata.name: lease.spec.holder_identity for lease in leases.items}
        assert holders == {f"events-p{i}": f"events-p{i}-e1" for i in range(4)}
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        assert sorted(p.metadata.name for p in pods) == [f"events-p{i}-e1" for i in range(4)]
        assert all(p.status.phase == "Running" for p in pods)
        nodes = {p.spec.node_name for p in pods}
        assert len(nodes) >= 2, f"all workers on {nodes}"

        traffic = Traffic(kafka.bootstrap, topic, 4)
        for _ in range(6):
            traffic.batch()
        traffic.close()
        assert_output_exact(kafka.bootstrap, topic, traffic)

        def counted() -> dict[str, Any] | None:
            p = get_pipeline(api, ns, "events")
            status = (p or {}).get("status") or {}
            return status if status.get("duplicatesDropped") == traffic.duplicates else None

        status = wait_for(counted, 60, f"{traffic.duplicates} duplicates in status")
        assert status["phase"] == "Running"
        assert status["recordsIn"] == traffic.sent
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions == {
            "Ready": "True",
            "Progressing": "False",
            "Degraded": "False",
            "FailingOver": "False",
            "TopicReady": "True",
        }
        assert found["status"]["observedGeneration"] == 1
        table = local_cluster.kubectl("get", "dp", "-n", ns).stdout
        header, row = table.splitlines()[:2]
        assert header.split() == ["NAME", "PHASE", "READY", "PARTITIONS", "DUPLICATES", "AGE"]
        assert row.split()[:5] == ["events", "Running", "4", "4", str(traffic.duplicates)]
        wide = local_cluster.kubectl("get", "dp", "-n", ns, "-o", "wide").stdout
        assert wide.splitlines()[0].split()[4:7] == ["DUPLICATES", "LAG", "FAILOVERS"]
        reasons = {e[1] for e in events(api, ns, "events")}
        assert {"VolumeCreated", "WorkerCreated", "PipelineReady"} <= reasons
        assert (
            f'dedup_operator_partitions_not_running{{namespace="{ns}",pipeline="events"}} 0.0'
            in op.metrics()
        )
        # a run without faults: healthy workers and operator, not only exact output
        assert unhealthy(local_cluster, ns, selector) == []
        assert log_problems(op.log()) == []


def test_node_loss_moves_the_partition_with_its_volume(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    topic = topics(kafka, new_topic, 2)
    lose_a_node_during_traffic(local_cluster, cluster_namespace.name, kafka, topic, tmp_path, None)
    # Every worker that ran, the replacement included, ran in a container of the image
    # (what test_containers_e2e.py checked on the podman stand-in, now retired).
    pods = client.CoreV1Api(cluster_namespace.api_client).list_namespaced_pod(
        cluster_namespace.name, label_selector=f"{names.LABEL_PIPELINE}=events"
    )
    statuses = [s for pod in pods.items for s in pod.status.container_statuses or []]
    assert statuses and all(
        (s.container_id or "").startswith("containerd://") and "dedup-operator:" in s.image
        for s in statuses
    ), [(s.container_id, s.image) for s in statuses]


@pytest.mark.parametrize("step", ["fenced", "released", "started"])
def test_operator_killed_mid_failover_completes_it_once(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
    step: str,
) -> None:
    """SIGKILL the operator as soon as the handover records `step`, start a new one:
    the failover completes exactly once (one FailoverCompleted Event, epoch + 1)."""
    topic = topics(kafka, new_topic, 2)
    lose_a_node_during_traffic(local_cluster, cluster_namespace.name, kafka, topic, tmp_path, step)


def _log_lines(local_cluster: RealCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    lines = []
    for line in local_cluster.pod_log(ns, pod).splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def _log_time(line: dict[str, Any]) -> float:
    """The logging module's `time` field ("2026-11-22 11:47:17,811", local time)."""
    stamp, millis = str(line["time"]).split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def test_split_brain_old_worker_stops_before_the_replacement_commits(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """`partition(node)`: the node and its pods lose the API server but keep running and
    keep reaching Kafka. The old worker must stop committing and pause, by its own clock,
    before the Lease runs out for anyone else (and release its store while others may take
    the volume), and the replacement commits only after that: the workers' logs and the
    Lease prove the order; the output is exact. Healed, the old worker finds the next
    epoch holding the Lease and stops as fenced."""
    ns = cluster_namespace.name
    api = local_cluster.api_client()
    topic = topics(kafka, new_topic, 2)
    cut: str | None = None
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log"):
        create_pipeline(
            api, ns, pipeline_body("events", kafka.bootstrap, topic, 2, local_cluster.storage_class)
        )
        ready_pipeline(api, ns, "events", 2)
        traffic = Traffic(kafka.bootstrap, topic, 2)
        try:
            with traffic.running():
                wait_for(
                    lambda: len(output_ids(kafka.bootstrap, f"{topic}-out", 0)) >= 300,
                    90,
                    "partition 0's worker to publish some output",
                    every=1,
                )
                before = partition_entry(api, ns, "events", 0)
                cut, old_pod = before["node"], before["pod"]
                cut_at = time.time()
                local_cluster.partition(cut)
                print(f"partitioned {cut} running {old_pod}")

                def moved() -> dict[str, Any] | None:
                    e = partition_entry(api, ns, "events", 0)
                    ok = e.get("ready") and e.get("node") not in (None, cut)
                    return e if ok and not e.get("handover") else None

                after = wait_for(moved, 120, "partition 0 to run on another node", every=0.5)
                sent = traffic.sent
                wait_for(lambda: traffic.sent > sent + 400, 60, "traffic after the move")
            new_pod = after["pod"]
            assert new_pod == f"events-p0-e{before['epoch'] + 1}"

            old_lines = _log_lines(local_cluster, ns, old_pod)
            paused = [line for line in old_lines if str(line["message"]).startswith("paused: the")]
            assert paused, f"{old_pod} did not pause: {old_lines[-5:]}"
            old_stopped = _log_time(paused[0])
            old_last_commit = float(paused[0]["last_commit"])

            def first_commit() -> dict[str, Any] | None:
                return next(
                    (
                        line
                        for line in _log_lines(local_cluster, ns, new_pod)
                        if line["message"] == "first transaction committed"
                    ),
                    None,
                )

            new_first_commit = float(
                wait_for(first_commit, 60, "the replacement's commit")["commit_sent"]
            )
            lease = client.CoordinationV1Api(api).read_namespaced_lease("events-p0", ns)
            assert lease.spec.holder_identity == new_pod
            assert lease.spec.lease_transitions == before["epoch"] + 1
            taken = lease.spec.acquire_time.timestamp()
            print(
                f"after the cut: old last commit {old_last_commit - cut_at:+.2f}s, old paused "
                f"{old_stopped - cut_at:+.2f}s, Lease taken by {new_pod} "
                f"{taken - cut_at:+.2f}s, new first commit sent {new_first_commit - cut_at:+.2f}s"
            )
            assert old_last_commit < old_stopped < taken <= new_first_commit
            assert_output_exact(kafka.bootstrap, topic, traffic)
        finally:
            if cut is not None:
                local_cluster.heal(cut)
        if cut is not None:
            # Healed and Ready, holding none of the pipeline's volumes: the operator takes
            # its out-of-service taint off again.
            wait_untainted(local_cluster, cut)


def _taints(local_cluster: RealCluster, node_name: str) -> set[str]:
    node = client.CoreV1Api(local_cluster.api_client()).read_node(node_name)
    return {t.key for t in node.spec.taints or []}


class TaintWatch:
    """Polls a node's taints in a thread: was it ever tainted out-of-service?"""

    def __init__(self, local_cluster: RealCluster, node_name: str) -> None:
        self.local_cluster, self.node_name = local_cluster, node_name
        self.seen = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                if OUT_OF_SERVICE in _taints(self.local_cluster, self.node_name):
                    self.seen = True
            except Exception:  # a failed read is no evidence either way
                continue

    def __enter__(self) -> TaintWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


@pytest.mark.background_scenario("begins")
def test_a_worker_and_another_teams_pod_share_the_node_that_is_lost(
    neighbour_scenario: NeighbourScenario,
) -> None:
    """The group's 7-minute failover begins (support/neighbour_scenario.py): its worker
    runs on the session's reserved node beside another team's pod, with exact output,
    and the node is killed. It goes on beside the group's other tests; the group's last
    test sees it through."""
    scenario = neighbour_scenario
    assert scenario.killed.wait(300), "the scenario did not reach the kill in 300 s"
    if scenario.error is not None:
        raise scenario.error
    assert scenario.found.lost == RESERVED_NODE == scenario.found.before["node"]


@pytest.mark.slow
@pytest.mark.background_scenario("ends")
def test_lost_node_with_another_workload_is_not_tainted_the_partition_waits_for_detach(
    neighbour_scenario: NeighbourScenario,
) -> None:
    """The default `releaseVolume: OutOfServiceTaint` on a lost node that also runs
    another workload (a plain pod): the operator does not taint the node (the taint would
    evict that pod and force-detach its volumes), says so naming the node and the pod,
    force-deletes only its own pod and waits out the attach/detach controller's own
    force-detach: its maxWaitForUnmountDuration, 6 minutes hard-coded in
    kube-controller-manager (no flag; ClusterTimings has no setting for it). Then the
    partition moves, the output is exact, and the other pod was never evicted. This is
    also the `WaitForDetach` path (the same action). Slow by nature (about 7 minutes):
    it runs in the background of the group, begun by its first test."""
    scenario = neighbour_scenario
    assert scenario.done.wait(900), "the scenario did not end in 900 s"
    if scenario.error is not None:
        raise scenario.error
    found = scenario.found
    assert found.failing is not None
    print(f"FailingOver: {found.failing['message']}")
    assert f"node {found.lost}" in found.failing["message"]
    assert f"{found.namespace}/{NEIGHBOUR}" in found.failing["message"]
    assert any(
        f"{found.namespace}/{NEIGHBOUR}" in m and str(found.lost) in m for m in found.warned
    ), found.warned
    after = found.after
    assert after is not None and found.took_s is not None
    last = after.get("lastHandover") or {}
    print(f"moved to {after['node']} after {found.took_s:.0f}s; steps {last.get('steps')}")
    assert not found.tainted, f"{found.lost} was tainted out-of-service"
    assert last["release"] == "TaintBlocked", last
    assert after["epoch"] == found.before["epoch"] + 1
    assert last["steps"]["detached"] > 300  # the controller's own 6 minutes
    other = found.neighbour
    assert other.metadata.deletion_timestamp is None, "the neighbour was evicted"
    assert other.spec.node_name == found.lost
    assert found.exact


def test_node_healed_after_its_worker_fenced_is_released_gracefully_never_tainted(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """`partition(node)` during traffic until the operator has fenced the old worker (its
    Lease ran out), then `heal`: the node is Ready again, so the volume is released the
    normal way (graceful delete, the node unmounts, the volume detaches) and the node is
    never tainted. `releaseVolume: External` (never taint; wait for someone else's taint)
    holds the handover at the release step, so the heal lands after fencing every time."""
    ns = cluster_namespace.name
    api = local_cluster.api_client()
    topic = topics(kafka, new_topic, 2)
    body = pipeline_body("events", kafka.bootstrap, topic, 2, local_cluster.storage_class)
    body["spec"]["failover"]["releaseVolume"] = "External"
    cut: str | None = None
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log"):
        create_pipeline(api, ns, body)
        ready_pipeline(api, ns, "events", 2)
        traffic = Traffic(kafka.bootstrap, topic, 2)
        try:
            with traffic.running():
                wait_for(
                    lambda: len(output_ids(kafka.bootstrap, f"{topic}-out", 0)) >= 300,
                    90,
                    "partition 0's worker to publish some output",
                    every=1,
                )
                before = partition_entry(api, ns, "events", 0)
                cut = before["node"]
                with TaintWatch(local_cluster, cut) as watch:
                    local_cluster.partition(cut)
                    t0 = time.monotonic()

                    def fenced() -> dict[str, Any] | None:
                        h = partition_entry(api, ns, "events", 0).get("handover") or {}
                        return h if "fenced" in (h.get("steps") or {}) else None

                    h = wait_for(fenced, 90, "the operator to fence the old worker", every=0.2)
                    assert h.get("release") == "External", h
                    local_cluster.heal(cut)
                    print(f"healed {cut} {time.monotonic() - t0:.1f}s after the cut: {h}")

                    def moved() -> dict[str, Any] | None:
                        e = partition_entry(api, ns, "events", 0)
                        ok = e.get("ready") and e.get("epoch") == before["epoch"] + 1
                        return e if ok and not e.get("handover") else None

                    try:
                        after = wait_for(moved, 120, "partition 0's replacement", every=0.5)
                    except AssertionError:
                        dump_pipeline(local_cluster, ns)
                        raise
                    sent = traffic.sent
                    wait_for(lambda: traffic.sent > sent + 400, 60, "traffic after the move")
            last = after.get("lastHandover") or {}
            print(f"moved to {after['node']}; handover {last}")
            assert not watch.seen, f"{cut} was tainted out-of-service"
            assert OUT_OF_SERVICE not in _taints(local_cluster, cut)
            assert last["release"] == "Graceful", last
            assert f"node {cut} is Ready again" in last["releaseWhy"]
            assert set(last["steps"]) == {"fenced", "released", "detached", "started", "ready"}
            reasons = reasons_once_posted(
                api, ns, "events", "ReleasedGracefully", "FailoverCompleted"
            )
            assert "ReleasedGracefully" in reasons and "NodeOutOfService" not in reasons
            assert reasons.count("FailoverCompleted") == 1, reasons
            assert_output_exact(kafka.bootstrap, topic, traffic)
        finally:
            if cut is not None:
                local_cluster.heal(cut)
