"""`make demo`: the main job on the embedded local default.

1. starts a real Kafka broker and the local cluster (etcd, kube-apiserver, the real
   controllers and scheduler, three nodes whose agents run pods in containers from the
   project's image built from the Dockerfile, volumes from a pool that outlive nodes),
   with the DedupPipeline CRD installed, and shows an invalid pipeline refused by the
   API server;
2. creates the pipeline's topics with 3 partitions and produces events keyed by message
   id, with duplicates near and far and a few malformed records;
3. installs the operator with Helm from charts/dedup-operator, as a user would (two
   operator pods from the image, the chart's ServiceAccount and RBAC), and applies
   `examples/events-pipeline.yaml` with kubectl (pointed at the local broker, image and
   storage class, with short failover timings): the operator creates a volume, a Lease
   and a worker pod per partition;
4. while more traffic arrives, kills the node running partition 0: the operator fences
   the old worker, releases its volume (out-of-service taint) and starts the replacement
   on another node with the same volume;
5. reads the output back with an independent read_committed consumer and checks that
   every valid id is there exactly once and every malformed record is dead-lettered.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml
from confluent_kafka import Message, Producer

from dedup_local.chart import CHART, LOCAL_CLUSTER_VALUES, helm
from dedup_local.chart import NAMESPACE as OPERATOR_NAMESPACE
from dedup_local.chart import RELEASE as OPERATOR_RELEASE
from dedup_local.cluster import ClusterTimings, LocalCluster
from dedup_local.image import DEV_TAG, ensure_image
from dedup_local.kafka import KafkaBroker, committed_offsets
from dedup_local.paths import REPO_ROOT
from dedup_worker.ids import ID_HEADER, partition_for
from dedup_worker.loop import DLQ_REASON

PARTITIONS = 3
EVENTS = 30_000
DUPLICATE_SHARE = 0.05
MALFORMED = 12
NAMESPACE = "default"
EXAMPLE = REPO_ROOT / "examples" / "events-pipeline.yaml"

T = TypeVar("T")


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def pipeline_manifest(bootstrap: str, storage_class: str) -> dict[str, Any]:
    """The example pipeline, pointed at the local broker and pool, with failover timings
    short enough to watch (the example keeps production defaults)."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    spec["kafka"]["bootstrapServers"] = bootstrap
    spec["storage"] = {**spec["storage"], "size": "1Gi", "storageClassName": storage_class}
    spec["failover"] = {**spec["failover"], "nodeLostAfter": "5s", "leaseDuration": "5s"}
    spec["worker"]["image"] = DEV_TAG
    spec["worker"]["resources"] = {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    return doc


def show_api(cluster: LocalCluster) -> None:
    say("nodes:\n" + cluster.kubectl("get", "nodes", "-L", "topology.kubernetes.io/zone").stdout)
    bad = EXAMPLE.read_text().replace("partitions: 3", "partitions: 0")
    bad = bad.replace("name: events", "name: broken")
    refused = cluster.kubectl("apply", "-f", "-", input=bad, check=False)
    say(
        "an invalid pipeline is refused by the API server:\n  "
        + refused.stderr.strip().replace("\n", "\n  ")
    )


def produce_events(
    bootstrap: str, rng: random.Random, sent: list[str], count: int, malformed: int
) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 10, "enable.idempotence": True}
    )
    for n in range(count):
        if sent and rng.random() < DUPLICATE_SHARE:
            message_id = sent[-rng.randint(1, min(len(sent), 5000))]  # a client retry
        else:
            message_id = f"order-{len(sent):06d}"  # new: its position is unique
        sent.append(message_id)
        value = json.dumps({"messageId": message_id, "amount": rng.randint(1, 500)})
        producer.produce(
            "events",
            value=value.encode(),
            key=message_id.encode(),
            partition=partition_for(message_id, PARTITIONS),
        )
        if n % 10_000 == 0:
            producer.poll(0)
    for i in range(malformed):
        producer.produce(
            "events",
            value=b'{"amount": 3, "no-id": true' if i % 2 else b"\xff\xfe",
            partition=i % PARTITIONS,
        )
    producer.flush(60)


def install_operator(cluster: LocalCluster) -> None:
    """`helm install` of the chart, with the local cluster's image and a 1 s pass."""
    sets = [a for v in (*LOCAL_CLUSTER_VALUES, "operator.interval=1") for a in ("--set", v)]
    helm(
        "install", OPERATOR_RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
        "--create-namespace", *sets, "--wait", "--timeout", "240s",
        "--kubeconfig", str(cluster.kubeconfig_path),
    )  # fmt: skip


def operator_logs(cluster: LocalCluster) -> str:
    pods = cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "name").stdout.split()
    return "".join(
        f"--- {pod}\n{cluster.pod_log(OPERATOR_NAMESPACE, pod.split('/')[-1])[-3000:]}"
        for pod in pods
    )


def pipeline_status(cluster: LocalCluster) -> dict[str, Any]:
    out = cluster.kubectl("get", "dp", "events", "-n", NAMESPACE, "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    status: dict[str, Any] = json.loads(out.stdout).get("status") or {}
    return status


def ready(cluster: LocalCluster) -> bool:
    conditions = {c["type"]: c["status"] for c in pipeline_status(cluster).get("conditions") or []}
    return conditions.get("Ready") == "True"


def partition_entry(cluster: LocalCluster, partition: int) -> dict[str, Any]:
    for entry in pipeline_status(cluster).get("partitions") or []:
        if entry.get("partition") == partition:
            return dict(entry)
    return {}


def header(msg: Message, name: str) -> str:
    value: bytes = dict(msg.headers() or [])[name]
    return value.decode()


def committed(bootstrap: str) -> int:
    offsets = committed_offsets(bootstrap, "dedup-events", "events", range(PARTITIONS))
    return sum(max(0, offset) for offset in offsets)


def main() -> int:
    rng = random.Random(42)
    with (
        KafkaBroker() as kafka,
        LocalCluster(
            nodes=3,
            timings=ClusterTimings.fast(),
            crds=sorted((REPO_ROOT / "crds").glob("*.yaml")),
            containers=True,
        ) as cluster,
    ):
        say(
            f"Kafka broker at {kafka.bootstrap}; local cluster up, KUBECONFIG={cluster.kubeconfig_path}"
        )
        show_api(cluster)
        for topic in ("events", "events-deduped", "events-dlq"):
            kafka.create_topic(topic, PARTITIONS)
        sent: list[str] = []
        produce_events(kafka.bootstrap, rng, sent, EVENTS // 2, MALFORMED)
        say(f"produced {len(sent)} events and {MALFORMED} malformed records")

        say(f"installing the operator with Helm ({ensure_image()}, two replicas)")
        install_operator(cluster)
        say(cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide").stdout)
        try:
            manifest = yaml.safe_dump(pipeline_manifest(kafka.bootstrap, cluster.storage_class))
            cluster.kubectl("apply", "-f", "-", input=manifest)
            t0 = time.monotonic()
            wait_for(lambda: ready(cluster), 240, "the pipeline to be Ready")
            say(f"pipeline Ready after {time.monotonic() - t0:.1f}s")
            say(cluster.kubectl("get", "dp", "-n", NAMESPACE).stdout)
            say(cluster.kubectl("get", "pods,pvc,leases", "-n", NAMESPACE, "-o", "wide").stdout)

            victim = partition_entry(cluster, 0)
            lost_node = str(victim["node"])
            produce_events(kafka.bootstrap, rng, sent, EVENTS // 2, 0)
            say(f"killing node {lost_node}, which runs partition 0 ({victim['pod']}), mid-stream")
            cluster.kill(lost_node)
            killed_at = time.monotonic()

            def moved() -> dict[str, Any] | None:
                entry = partition_entry(cluster, 0)
                done = entry.get("lastHandover")
                if done and entry.get("node") not in (None, lost_node) and entry.get("ready"):
                    return entry
                return None

            entry = wait_for(moved, 240, "partition 0 to move to another node")
            say(
                f"partition 0 moved to {entry['node']} as {entry['pod']} "
                f"{time.monotonic() - killed_at:.1f}s after the node was killed; handover steps "
                f"(seconds after the decision): {entry['lastHandover'].get('steps')}"
            )
            total = len(sent) + MALFORMED
            wait_for(lambda: committed(kafka.bootstrap) >= total, 300, "every record committed")
        except Exception:
            say("operator logs (tail):\n" + operator_logs(cluster))
            raise

        out = kafka.read_committed("events-deduped")
        dead = kafka.read_committed("events-dlq")
        ids = [header(m, ID_HEADER) for m in out]
        expected = set(sent)
        ok = len(ids) == len(set(ids)) and set(ids) == expected and len(dead) == MALFORMED
        say(f"input records           {len(sent) + MALFORMED}")
        say(f"distinct valid ids      {len(expected)}")
        say(f"published               {len(ids)}")
        say(f"duplicates dropped      {len(sent) - len(ids)}")
        reasons = sorted({header(m, DLQ_REASON) for m in dead})
        say(f"dead-lettered           {len(dead)} (reasons: {reasons})")
        say("exactly once: " + ("YES, every id once, nothing lost" if ok else "NO"))
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
