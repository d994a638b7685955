"""Pipelines on the local cluster under traffic, shared by the operator's end-to-end tests
(tests/integration/test_operator_e2e.py and the tests that run the same scenario on the
container cluster and through the Helm chart): a pipeline's body with short failover
timings, its topics, live traffic that remembers what it sent, the exactness check of
the output by an independent read_committed reader, the pipeline's and its partitions'
status, and the node-loss scenario itself.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from kubernetes import client

from dedup_contract import names
from dedup_contract.ownership import owner_reference
from dedup_contract.timefmt import parse_time
from dedup_local.kafka import KafkaBroker
from dedup_local.kafka import produce_all as kafka_produce_all
from support.cluster_fixtures import AnyCluster
from support.kafka_fixtures import NewTopic
from support.operator_helpers import (
    condition,
    events,
    get_pipeline,
    running_operator,
    wait_for,
)
from support.pipelines import cluster_pipeline_body
from support.worker_helpers import event, output_ids

NODE_LOST_AFTER_S = 5
LEASE_S = 5


def pipeline_body(
    name: str, bootstrap: str, topic: str, partitions: int, storage_class: str
) -> dict[str, Any]:
    return cluster_pipeline_body(
        name,
        bootstrap,
        topic,
        storage_class,
        partitions,
        worker={"batchSize": 200, "lingerMs": 20},
        failover={"nodeLostAfter": f"{NODE_LOST_AFTER_S}s", "leaseDuration": f"{LEASE_S}s"},
    )


def create_pipeline(api: client.ApiClient, ns: str, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body
    )


def topics(kafka: KafkaBroker, new_topic: NewTopic, partitions: int) -> str:
    topic = new_topic(partitions=partitions)
    kafka.create_topic(f"{topic}-out", partitions)
    kafka.create_topic(f"{topic}-dlq", partitions)
    return topic


class Traffic:
    """Produces ids to every partition, every third one a repeat of an earlier id of the
    same partition, until stopped; remembers the unique ids per partition in order."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, per_batch: int = 50) -> None:
        self.topic, self.partitions = topic, partitions
        self.per_batch = per_batch
        self.unique: dict[int, list[str]] = {p: [] for p in range(partitions)}
        self.sent = 0
        self.duplicates = 0
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._n = 0

    def batch(self) -> None:
        records = []
        for p in range(self.partitions):
            for _ in range(self.per_batch):
                self._n += 1
                ids = self.unique[p]
                if self._n % 3 == 0 and ids:
                    value = event(ids[(self._n * 7) % len(ids)], self._n)
                    self.duplicates += 1
                else:
                    new_id = f"p{p}-{self._n}"
                    ids.append(new_id)
                    value = event(new_id, self._n)
                records.append({"value": value, "partition": p})
        self.sent += kafka_produce_all(self._producer, self.topic, records, timeout_s=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.batch()
            self._stop.wait(0.2)

    @contextmanager
    def running(self) -> Iterator[Traffic]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=60)
            self.close()

    def close(self) -> None:
        if hasattr(self, "_producer"):
            self._producer.flush(10)
            del self._producer  # no reconnect attempts once the broker is gone


def assert_output_exact(bootstrap: str, topic: str, traffic: Traffic, timeout: float = 180) -> None:
    """Every id the traffic sent is published once across the whole output, on its
    owner's partition (the pure-Python reference hash, not the workers' C one), and the
    ids of one input partition keep their order on each output partition. `timeout`:
    generous, since exactness is what this checks, not speed (a redone batch waits out
    librdkafka's 60 s request timeout; docs/development.md, "A stall, understood")."""
    sent_on = {i: p for p, ids in traffic.unique.items() for i in ids}
    partitions = range(traffic.partitions)

    owners = Counter(owner_reference(i.encode(), traffic.partitions) for i in sent_on)
    held: dict[int, int] = {}

    def caught_up() -> dict[int, list[str]] | None:
        got = {q: output_ids(bootstrap, f"{topic}-out", q) for q in partitions}
        held.update({q: len(ids) for q, ids in got.items()})
        return got if sum(map(len, got.values())) >= len(sent_on) else None

    try:
        got = wait_for(caught_up, timeout, "the output to catch up", every=2)
    except AssertionError as exc:  # which partition lags: ids held / ids its owner must publish
        lag = {q: f"{held.get(q, 0)}/{owners[q]}" for q in partitions}
        raise AssertionError(f"{exc}; output partitions, held/expected: {lag}") from None
    published = [i for ids in got.values() for i in ids]
    twice = len(published) - len(set(published))
    missing, unexpected = set(sent_on) - set(published), set(published) - set(sent_on)
    assert not (twice or missing or unexpected), (
        f"{len(published)} output ids, {len(sent_on)} expected; duplicates {twice}, "
        f"missing {len(missing)}, unexpected {len(unexpected)}"
    )
    for q, ids in got.items():
        misplaced = [i for i in ids if owner_reference(i.encode(), traffic.partitions) != q]
        assert not misplaced, f"output partition {q} holds ids of other owners: {misplaced[:5]}"
        for p, sent in traffic.unique.items():
            order = {i: n for n, i in enumerate(sent)}
            mine = [i for i in ids if sent_on[i] == p]
            assert mine == sorted(mine, key=order.__getitem__), (
                f"ids of input partition {p} out of order on output partition {q}"
            )


def ready_pipeline(api: client.ApiClient, ns: str, name: str, partitions: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        p = get_pipeline(api, ns, name)
        c = condition(p, "Ready")
        if p and c and c["status"] == "True" and p["status"].get("readyPartitions") == partitions:
            return p
        return None

    try:
        return wait_for(ready, 180, f"{name} to be Ready with {partitions} partitions", every=1)
    except AssertionError:  # what a person would look at: the pods and the namespace's Events
        core = client.CoreV1Api(api)
        for pod in core.list_namespaced_pod(ns).items:
            states = [(c.name, c.ready, c.restart_count, c.state.to_dict())
                      for c in pod.status.container_statuses or []]  # fmt: skip
            print(f"--- {pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase} {states}")
        for e in core.list_namespaced_event(ns).items:
            print(f"{e.last_timestamp} {e.type} {e.reason} {e.involved_object.kind}/"
                  f"{e.involved_object.name}: {e.message}")  # fmt: skip
        raise


def partition_entry(api: client.ApiClient, ns: str, name: str, p: int) -> dict[str, Any]:
    found = get_pipeline(api, ns, name) or {}
    for entry in (found.get("status") or {}).get("partitions") or []:
        if entry["partition"] == p:
            return dict(entry)
    return {}


def wait_published(bootstrap: str, topic: str, partition: int, at_least: int) -> int:
    """Wait until output partition `partition` of `topic` holds `at_least` ids (read
    committed); how many it holds then. Up to 180 s: room for one batch redone after
    librdkafka's 60 s request timeout (docs/development.md, "A stall, understood")."""
    count: int = wait_for(
        lambda: (n := len(output_ids(bootstrap, f"{topic}-out", partition))) >= at_least and n,
        180,
        f"partition {partition}'s worker to publish {at_least} ids",
        every=1,
    )
    return count


def wait_moved_off(
    local_cluster: AnyCluster,
    ns: str,
    name: str,
    partition: int,
    node: str,
    timeout: float = 120,
    every: float = 0.5,
) -> dict[str, Any]:
    """The partition's status entry once it runs Ready on a node other than `node` with
    no handover in progress; the pipeline's state printed if it does not."""
    api = local_cluster.api_client()

    def moved() -> dict[str, Any] | None:
        e = partition_entry(api, ns, name, partition)
        ok = e.get("ready") and e.get("node") not in (None, node) and not e.get("handover")
        return e if ok else None

    try:
        return wait_for(moved, timeout, f"partition {partition} to run on another node", every)
    except AssertionError:
        dump_pipeline(local_cluster, ns)
        raise


def worker_ready_line(local_cluster: AnyCluster, ns: str, pod: str) -> dict[str, Any] | None:
    for line in local_cluster.pod_log(ns, pod).splitlines():
        if '"worker ready"' in line:
            parsed: dict[str, Any] = json.loads(line)
            return parsed
    return None


def wait_untainted(local_cluster: AnyCluster, node_name: str) -> None:
    def untainted() -> bool:
        node = client.CoreV1Api(local_cluster.api_client()).read_node(node_name)
        keys = {t.key for t in node.spec.taints or []}
        return "node.kubernetes.io/out-of-service" not in keys

    try:
        wait_for(untainted, 60, f"the operator to remove {node_name}'s out-of-service taint")
    except AssertionError:  # what the operator reads to decide: the node, its attachments
        for args in (("get", "node", node_name, "-o", "yaml"),
                     ("get", "volumeattachments", "-o", "wide"),
                     ("get", "lease", "-n", "kube-node-lease", node_name, "-o", "yaml"),
                     ("get", "deduppipelines", "-A", "-o", "yaml")):  # fmt: skip
            print(local_cluster.kubectl(*args, check=False).stdout)
        raise


def dump_pipeline(local_cluster: AnyCluster, ns: str) -> None:
    """What a person would look at when a partition does not move."""
    print(
        local_cluster.kubectl("get", "pods,volumeattachments,nodes", "-n", ns, "-o", "wide").stdout
    )
    print(
        json.dumps(
            (get_pipeline(local_cluster.api_client(), ns, "events") or {}).get("status"), indent=1
        )
    )
    pods = client.CoreV1Api(local_cluster.api_client()).list_namespaced_pod(ns).items
    for pod in pods:
        print(f"--- {pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase}")
        print(local_cluster.pod_log(ns, pod.metadata.name)[-1500:])


def lose_a_node_during_traffic(
    local_cluster: AnyCluster,
    ns: str,
    kafka: KafkaBroker,
    topic: str,
    tmp_path: Path,
    kill_operator_at: str | None,
) -> None:
    api = local_cluster.api_client()
    log = tmp_path / "operator.log"
    op_ctx = running_operator(local_cluster.kubeconfig_path, ns, log)
    op = op_ctx.__enter__()
    lost: str | None = None
    try:
        create_pipeline(
            api, ns, pipeline_body("events", kafka.bootstrap, topic, 2, local_cluster.storage_class)
        )
        ready_pipeline(api, ns, "events", 2)
        traffic = Traffic(kafka.bootstrap, topic, 2)
        with traffic.running():
            try:
                published_before = wait_published(kafka.bootstrap, topic, 0, 300)
            except AssertionError:
                print(f"{traffic.sent} records sent")
                dump_pipeline(local_cluster, ns)
                raise
            before = partition_entry(api, ns, "events", 0)
            lost = before["node"]
            killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
            local_cluster.kill(lost)
            print(f"killed {lost} running {before['pod']} ({published_before} ids published)")
            if kill_operator_at is not None:

                def at_step() -> bool:
                    h = partition_entry(api, ns, "events", 0).get("handover") or {}
                    return kill_operator_at in (h.get("steps") or {})

                wait_for(at_step, 60, f"the handover to reach {kill_operator_at}", every=0.2)
                op.kill()
                op_ctx.__exit__(None, None, None)
                print(f"operator killed at {kill_operator_at}; restarting it")
                op_ctx = running_operator(local_cluster.kubeconfig_path, ns, log)
                op = op_ctx.__enter__()

            after = wait_moved_off(local_cluster, ns, "events", 0, lost)
            took = time.monotonic() - killed_at
            sent = traffic.sent
            wait_for(lambda: traffic.sent > sent + 400, 60, "traffic after the move")
        # traffic stopped
        print(f"partition 0 moved to {after['node']} as {after['pod']} after {took:.1f}s")
        last = after.get("lastHandover") or {}
        print(f"handover steps: {last.get('steps')}")
        node = client.CoreV1Api(api).read_node(lost)
        ready_cond = next(c for c in node.status.conditions if c.type == "Ready")
        # When Kubernetes saw the node go; the operator judges by the node's heartbeat
        # Lease and may decide before kube-controller-manager marks Ready Unknown: then
        # the condition still shows an earlier transition, and the kill is the start.
        noticed = max(ready_cond.last_transition_time, killed_wall)
        handover_started = parse_time(last["started"])
        assert handover_started is not None
        detection = (handover_started - noticed).total_seconds()
        after_notice = detection + last["steps"]["ready"]
        print(
            f"node NotReady -> decision {detection:.1f}s, -> replacement Ready "
            f"{after_notice:.1f}s; kill -> Ready {took:.1f}s"
        )
        assert after["epoch"] == before["epoch"] + 1
        assert after["pod"] == f"events-p0-e{before['epoch'] + 1}"
        assert last.get("reason") == "NodeLost"
        pod = client.CoreV1Api(api).read_namespaced_pod(after["pod"], ns)
        claims = [
            v.persistent_volume_claim.claim_name
            for v in pod.spec.volumes
            if v.persistent_volume_claim
        ]
        assert claims == ["events-p0"]
        try:
            ready = wait_for(
                lambda: worker_ready_line(local_cluster, ns, after["pod"]), 60, "worker ready"
            )
        except AssertionError:
            raise AssertionError(
                f"no 'worker ready' line in {after['pod']}'s log: "
                f"{local_cluster.pod_log(ns, after['pod'])[-3000:]}"
            ) from None
        print(f"replacement worker ready: {ready}")
        # Store intact: the replacement re-applied at most the few ids published after the
        # store's last write, not the partition's whole output (a rebuild).
        assert ready["store_keys"] > 0, ready
        assert ready["recovered_ids"] < published_before, ready
        assert_output_exact(kafka.bootstrap, topic, traffic)
        if kill_operator_at is None:
            # from the node being seen NotReady (kube-controller-manager's grace period
            # after the kill comes before that and is the cluster's, not the operator's)
            bound = NODE_LOST_AFTER_S + LEASE_S + 15
            assert after_notice <= bound, f"failover took {after_notice:.1f}s > {bound}s"
        completed = [e for e in events(api, ns, "events") if e[1] == "FailoverCompleted"]
        assert len(completed) == 1, completed
    finally:
        try:
            if lost is not None:
                local_cluster.restart(lost)
                # The operator takes the out-of-service taint off the rebooted node; a
                # node left tainted would leave later tests fewer nodes to schedule on.
                wait_untainted(local_cluster, lost)
        finally:
            op_ctx.__exit__(None, None, None)
