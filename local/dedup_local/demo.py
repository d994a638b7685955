"""`make demo`: the main job on the embedded local default, shown as it happens.

1. starts the local cluster on real nodes (`RealCluster`: control plane, three kubelets
   with containerd and the project's image, kube-proxy, CSI volumes) with the CRD, and a
   Kafka broker its pods reach, and shows an invalid pipeline refused by the API server;
2. creates the pipeline's topics with 3 partitions and produces a backlog of events keyed
   by message id, with duplicates near and far (a retry lands on any partition: its owner
   gets it forwarded) and a few malformed records;
3. installs the operator with Helm from charts/dedup-operator, as a user would, and
   applies `examples/events-pipeline.yaml` with kubectl (pointed at the local broker,
   image and storage class, with short failover timings and a scheduled audit);
4. streams more events while a monitor prints, every two seconds, what `dedupctl status`
   reads (the pipeline's phase, records in/out, duplicates, dead letters, each
   partition's lag and input rate);
5. mid-stream, kills the node running partition 0 (reported shut down, as a cloud
   does) and prints each step of the handover as the operator records it;
6. runs the audit through the operator's schedule (`dedupctl audit --now`), reads the
   output back with an independent read_committed consumer, prints the final table and
   writes a PNG of throughput and lag per partition with the failover marked.

Ctrl-C at any moment stops everything it started (the monitor and producer threads, the
operator, the cluster's nodes with their containers and mounts, kube-proxy's rules, the
control plane, the broker) and exits 130; a second Ctrl-C during that cleanup is ignored so it completes.
What a run shows, and its timings: docs/development.md, "The demo".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from dedup_contract.handover import STEPS
from dedup_contract.ids import ID_HEADER
from dedup_contract.ownership import owner
from dedup_contract.timefmt import parse_time
from dedup_local.chart import CHART, LOCAL_CLUSTER_VALUES, helm
from dedup_local.chart import NAMESPACE as OPERATOR_NAMESPACE
from dedup_local.chart import RELEASE as OPERATOR_RELEASE
from dedup_local.cluster import ClusterTimings
from dedup_local.demo_plot import Handover, Point, plot
from dedup_local.image import DEV_TAG, ensure_image
from dedup_local.kafka import KafkaBroker, committed_offsets
from dedup_local.paths import REPO_ROOT, cache_dir
from dedup_local.pod_health import unhealthy
from dedup_local.real_cluster import RealCluster
from dedup_worker.loop import DLQ_REASON
from dedupctl import cli as ctl
from dedupctl import view as ctl_view

PARTITIONS = 3
BACKLOG = 6_000  # produced before the operator is installed
STREAM = 24_000  # produced while the pipeline runs, the node kill among them
STREAM_RATE = 400  # events per second
KILL_AFTER_S = 20.0  # into the stream
DUPLICATE_SHARE = 0.05
MALFORMED = 12
NAMESPACE = "default"
PIPELINE = "events"
OPERATOR_SELECTOR = f"app.kubernetes.io/name={OPERATOR_RELEASE}"
EXAMPLE = REPO_ROOT / "examples" / "events-pipeline.yaml"
DEDUPCTL = str(Path(sys.executable).parent / "dedupctl")

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
    short enough to watch (the example keeps production defaults) and an audit that
    runs when asked (`dedupctl audit --now`; its schedule is once a year)."""
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
    spec["reconciliation"] = {
        "schedule": "0 0 1 1 *",
        "lookback": "2h",
        "spark": {"executors": 1},
    }
    return doc


def show_api(cluster: RealCluster) -> None:
    say(
        "nodes:\n"
        + cluster.kubectl("get", "nodes", "-o", "wide", "-L", "topology.kubernetes.io/zone").stdout
    )
    bad = EXAMPLE.read_text().replace("partitions: 3", "partitions: 0")
    bad = bad.replace("name: events", "name: broken")
    refused = cluster.kubectl("apply", "-f", "-", input=bad, check=False)
    say(
        "an invalid pipeline is refused by the API server:\n  "
        + refused.stderr.strip().replace("\n", "\n  ")
    )


class Events:
    """The demo's producer: ids keyed by message id, 5% client retries of a recent id
    sent to any partition (a retry path keyed by something else: the worker that reads
    it forwards it to the id's owner)."""

    def __init__(self, bootstrap: str, rng: random.Random) -> None:
        self.rng = rng
        self.sent: list[str] = []
        self.malformed = 0
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 10, "enable.idempotence": True}
        )

    def produce(self, count: int) -> None:
        for _ in range(count):
            sent = self.sent
            if sent and self.rng.random() < DUPLICATE_SHARE:
                message_id = sent[-self.rng.randint(1, min(len(sent), 5000))]  # a retry
                partition = self.rng.randrange(PARTITIONS)
            else:
                message_id = f"order-{len(sent):06d}"  # new: its position is unique
                partition = owner(message_id, PARTITIONS)
            sent.append(message_id)
            value = json.dumps({"messageId": message_id, "amount": self.rng.randint(1, 500)})
            self._producer.produce(
                "events",
                value=value.encode(),
                key=message_id.encode(),
                partition=partition,
            )
        self._producer.poll(0)

    def produce_malformed(self, count: int) -> None:
        for i in range(count):
            self._producer.produce(
                "events",
                value=b'{"amount": 3, "no-id": true' if i % 2 else b"\xff\xfe",
                partition=i % PARTITIONS,
            )
        self.malformed += count

    def flush(self) -> None:
        self._producer.flush(60)

    def close(self) -> None:
        """Flushed and let go, before the broker stops (no reconnect attempts after)."""
        if hasattr(self, "_producer"):
            self._producer.flush(10)
            del self._producer

    def stream(self, total: int, rate: float, stop: threading.Event) -> None:
        """`total` events at `rate` per second (in 10 steps a second) until `stop`."""
        step = max(1, int(rate / 10))
        start, done = time.monotonic(), 0
        while done < total and not stop.is_set():
            n = min(step, total - done)
            self.produce(n)
            done += n
            stop.wait(max(0.0, start + done / rate - time.monotonic()))
        self.flush()


class Monitor:
    """Samples the pipeline every second: as `dedupctl status` does (its status and the
    workers' /metrics: phase, records in/out, duplicates, dead letters, handover steps)
    and from Kafka (each partition's committed offset and end: records/s and lag, true
    while a worker is gone). Prints a progress line every two seconds and each handover
    step as the operator records it; keeps the series for the picture."""

    def __init__(self, kubeconfig: Path, bootstrap: str, t0: float) -> None:
        self.cluster = ctl.Cluster(str(kubeconfig), None, NAMESPACE)
        self.kafka = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "dedup-events",
                "enable.auto.commit": False,
            }
        )
        self._committed: dict[int, tuple[float, int]] = {}
        self.t0 = t0  # monotonic time 0 of the demo's clock
        self.wall0 = time.time() - (time.monotonic() - t0)
        self.points: list[Point] = []
        self.handovers: dict[tuple[int, str], Handover] = {}
        self.per_pod: dict[str, ctl_view.WorkerSample] = {}  # last counters of every worker
        self.last_doc: dict[str, Any] = {}
        self.last_progress: dict[int, tuple[float | None, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-monitor", daemon=True)
        self._told_steps: dict[tuple[int, str], set[str]] = {}
        self._last_print = 0.0
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.kafka.close()

    def _kafka_progress(self) -> dict[int, tuple[float | None, int]]:
        """Per partition: records committed per second since the last sample and the
        consumer group's lag (input end minus committed offset), read from Kafka: true
        through a handover, when the lost worker answers nothing."""
        tps = [TopicPartition("events", p) for p in range(PARTITIONS)]
        out: dict[int, tuple[float | None, int]] = {}
        committed = self.kafka.committed(tps, timeout=5)
        now = time.monotonic()
        for tp in committed:
            _, high = self.kafka.get_watermark_offsets(TopicPartition("events", tp.partition), 5)
            offset = max(0, int(tp.offset))
            before = self._committed.get(tp.partition)
            rate = None if before is None else (offset - before[1]) / (now - before[0])
            self._committed[tp.partition] = (now, offset)
            out[tp.partition] = (rate, max(0, int(high) - offset))
        return out

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _demo_time(self, rfc3339: str | None) -> float | None:
        t = parse_time(rfc3339) if rfc3339 else None
        return None if t is None else t.timestamp() - self.wall0

    def _run(self) -> None:
        before: dict[tuple[str, str, int], ctl_view.WorkerSample] | None = None
        while not self._stop.is_set():
            try:
                doc, before = ctl.status_document(self.cluster, PIPELINE, False, before, 0)
            except ctl.CtlError as exc:
                self.error = str(exc)
                self._stop.wait(1.0)
                continue
            try:
                progress = self._kafka_progress()
            except KafkaException as exc:
                self.error = str(exc)
                progress = {}
            (pipeline,) = doc["pipelines"]
            self.last_doc = pipeline
            t = self.now()
            for p, (rate, lag) in progress.items():
                self.points.append(Point(t, p, rate, lag))
            self.last_progress = progress
            for q in pipeline["partitionStatus"]:
                self._handover(q)
            for q in pipeline["partitionStatus"]:
                key = (NAMESPACE, PIPELINE, q["partition"])
                if q["pod"] and key in (before or {}):
                    self.per_pod[q["pod"]] = (before or {})[key]
            if t - self._last_print >= 2.0:
                self._last_print = t
                print(self.progress_line(pipeline, t), flush=True)
            self._stop.wait(1.0)

    def totals(self) -> dict[str, int]:
        """Every worker's last counters added up (a replacement starts from 0)."""
        s = self.per_pod.values()
        return {
            "in": int(sum(x.records_in for x in s)),
            "out": int(sum(x.records_out for x in s)),
            "duplicates": int(sum(x.duplicates for x in s)),
            "deadLetters": int(sum(x.dead_letters for x in s)),
        }

    def progress_line(self, p: dict[str, Any], t: float) -> str:
        tot = self.totals()
        progress = self.last_progress
        lags = " ".join(f"p{n} {lag:>5}" for n, (_, lag) in sorted(progress.items())) or "—"
        rates = (
            " ".join(
                f"p{n} {ctl_view.show(None if r is None else round(r)):>4}"
                for n, (r, _) in sorted(progress.items())
            )
            or "—"
        )
        return (
            f"[demo] {t:6.1f}s  {ctl_view.show(p['phase']):<8} in {tot['in']:>6}  "
            f"out {tot['out']:>6}  duplicates dropped {tot['duplicates']:>5}  "
            f"dead letters {tot['deadLetters']:>3}  |  lag {lags}  |  in/s {rates}"
        )

    def _handover(self, q: dict[str, Any]) -> None:
        for h in (q["handover"], q["lastHandover"]):
            if not h or not h.get("started"):
                continue
            key = (q["partition"], str(h["started"]))
            decided = self._demo_time(h["started"])
            if decided is None:
                continue
            told = self._told_steps.setdefault(key, set())
            if "begun" not in told:
                told.add("begun")
                say(
                    f"partition {q['partition']}: handover started ({h['reason']}): moving "
                    f"from {h['fromPod']} on {h['fromNode'] or '—'}, decided at {decided:.1f}s"
                )
            for step in STEPS:
                if step in h["steps"] and step not in told:
                    told.add(step)
                    say(
                        f"partition {q['partition']}: {step:<8} at +{h['steps'][step]:5.1f}s "
                        f"after the decision ({decided + h['steps'][step]:.1f}s)"
                    )
            self.handovers[key] = Handover(q["partition"], str(h["reason"]), decided, h["steps"])


def install_operator(cluster: RealCluster) -> None:
    """`helm install` of the chart, with the local cluster's image and a 1 s pass."""
    sets = [a for v in (*LOCAL_CLUSTER_VALUES, "operator.interval=1") for a in ("--set", v)]
    helm(
        "install", OPERATOR_RELEASE, str(CHART), "--take-ownership", "--namespace", OPERATOR_NAMESPACE,
        "--create-namespace", *sets, "--wait", "--timeout", "600s",
        "--kubeconfig", str(cluster.kubeconfig_path), timeout=660,
    )  # fmt: skip


def operator_logs(cluster: RealCluster) -> str:
    pods = cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "name").stdout.split()
    return "".join(
        f"--- {pod}\n{cluster.pod_log(OPERATOR_NAMESPACE, pod.split('/')[-1])[-3000:]}"
        for pod in pods
    )


def worker_logs(cluster: RealCluster) -> str:
    pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name", check=False).stdout.split()
    return "".join(
        f"--- {pod}\n{cluster.pod_log(NAMESPACE, pod.split('/')[-1])[-1500:]}" for pod in pods
    )


def diagnosis(cluster: RealCluster) -> str:
    """What the pipeline waits for, in a few lines: its conditions, each partition's
    entry, the pods and the namespace's latest events (printed last on a failure, so a
    truncated log still shows it)."""
    status = pipeline_status(cluster)
    lines = [
        f"condition {c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
        for c in status.get("conditions") or []
    ]
    lines += [f"partition {json.dumps(entry)}" for entry in status.get("partitions") or []]
    for args in (
        ("get", "pods,pvc", "-n", NAMESPACE, "-o", "wide"),
        ("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide"),
        ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
    ):
        out = cluster.kubectl(*args, check=False)
        lines.append(f"$ kubectl {' '.join(args)}\n{(out.stdout + out.stderr)[-2500:]}")
    return "\n".join(lines)


def pipeline_status(cluster: RealCluster) -> dict[str, Any]:
    out = cluster.kubectl("get", "dp", PIPELINE, "-n", NAMESPACE, "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    status: dict[str, Any] = json.loads(out.stdout).get("status") or {}
    return status


def ready(cluster: RealCluster) -> bool:
    conditions = {c["type"]: c["status"] for c in pipeline_status(cluster).get("conditions") or []}
    return conditions.get("Ready") == "True"


def partition_entry(cluster: RealCluster, partition: int) -> dict[str, Any]:
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


def dedupctl(cluster: RealCluster, *args: str, timeout: float = 120) -> int:
    """dedupctl as a person runs it, its output on the demo's terminal."""
    cmd = [DEDUPCTL, *args, "-n", NAMESPACE, "--kubeconfig", str(cluster.kubeconfig_path)]
    say("$ dedupctl " + " ".join(args))
    # Its own session: a Ctrl-C reaches the demo alone, whose subprocess.run kills it
    # (no KeyboardInterrupt traceback from a Python child caught mid-import).
    return subprocess.run(cmd, timeout=timeout, check=False, start_new_session=True).returncode


def png_path() -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return cache_dir() / "demo" / f"demo-{stamp}.png"


@contextlib.contextmanager
def cleanup_uninterrupted() -> Iterator[contextlib.ExitStack]:
    """An ExitStack whose unwinding a second Ctrl-C cannot cut short."""
    with contextlib.ExitStack() as stack:
        try:
            yield stack
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if sys.stdout.isatty():
                say("stopping everything the demo started ...")


def run(png: Path) -> int:
    rng = random.Random(42)
    with cleanup_uninterrupted() as stack:
        image = ensure_image()  # each node starts with it (dedup_local.node_images)
        cluster = RealCluster(
            nodes=3,
            timings=ClusterTimings.fast(),
            crds=sorted((REPO_ROOT / "crds").glob("*.yaml")),
            image=image,
        )
        stack.enter_context(cluster)
        kafka = KafkaBroker(host=cluster.broker_host)  # where the nodes' pods reach it
        stack.callback(kafka.close)
        kafka.start()
        dirs = " ".join(str(n.data_dir) for n in cluster.nodes.values())
        say(
            f"local cluster up on real nodes, KUBECONFIG={cluster.kubeconfig_path}"
            f" (node directories: {dirs}); Kafka broker at {kafka.bootstrap}"
        )
        show_api(cluster)
        for topic in ("events", "events-dlq"):
            kafka.create_topic(topic, PARTITIONS)
        # the output keeps the window (672h): a lost store is rebuilt from it (TopicReady)
        kafka.create_topic("events-deduped", PARTITIONS, {"retention.ms": "-1"})
        events = Events(kafka.bootstrap, rng)
        stack.callback(events.close)
        events.produce(BACKLOG)
        events.produce_malformed(MALFORMED)
        events.flush()
        say(f"produced a backlog of {len(events.sent)} events and {MALFORMED} malformed records")

        say(f"installing the operator with Helm ({image}, two replicas)")
        install_operator(cluster)
        say(cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide").stdout)
        try:
            manifest = yaml.safe_dump(pipeline_manifest(kafka.bootstrap, cluster.storage_class))
            cluster.kubectl("apply", "-f", "-", input=manifest)
            t0 = time.monotonic()
            monitor = Monitor(cluster.kubeconfig_path, kafka.bootstrap, t0)
            stack.callback(monitor.stop)
            monitor.start()
            wait_for(lambda: ready(cluster), 420, "the pipeline to be Ready")
            say(f"pipeline Ready after {time.monotonic() - t0:.1f}s")
            say(cluster.kubectl("get", "pods,pvc,leases", "-n", NAMESPACE, "-o", "wide").stdout)
            dedupctl(cluster, "status", PIPELINE)

            stop_stream = threading.Event()
            streamer = threading.Thread(
                target=events.stream, args=(STREAM, STREAM_RATE, stop_stream), daemon=True
            )
            say(f"streaming {STREAM} more events at {STREAM_RATE}/s")
            streamer.start()
            stack.callback(streamer.join, 60)  # second: the producer is closed after it
            stack.callback(stop_stream.set)  # first, on the way out
            time.sleep(KILL_AFTER_S)

            victim = partition_entry(cluster, 0)
            lost_node = str(victim["node"])
            say(
                f"killing node {lost_node}, which runs partition 0 ({victim['pod']}), mid-stream"
                " (the cloud reports the instance shut down)"
            )
            cluster.kill(lost_node, shutdown=True)
            killed_at = time.monotonic()

            def moved() -> dict[str, Any] | None:
                entry = partition_entry(cluster, 0)
                done = entry.get("lastHandover")
                if (
                    done
                    and done.get("fromNode") == lost_node
                    and entry.get("node") not in (None, lost_node)
                    and entry.get("ready")
                ):
                    return entry
                return None

            entry = wait_for(moved, 240, "partition 0 to move to another node")
            moved_after = time.monotonic() - killed_at
            say(
                f"partition 0 moved to {entry['node']} as {entry['pod']} {moved_after:.1f}s after "
                f"the node was killed ({entry['lastHandover']['steps']['ready']:.1f}s after the "
                "operator's decision)"
            )
            streamer.join()
            total = len(events.sent) + MALFORMED
            wait_for(lambda: committed(kafka.bootstrap) >= total, 300, "every record committed")
            time.sleep(2)  # one more sample with the lag at 0
            monitor.stop()
            dedupctl(cluster, "status", PIPELINE)
            dedupctl(cluster, "failovers", PIPELINE)
            audit_rc = dedupctl(cluster, "audit", PIPELINE, "--now", timeout=1200)
            # healthy, not only working: 0 restarts, no ERROR line, no permission warning
            operator_problems = unhealthy(cluster, OPERATOR_NAMESPACE, OPERATOR_SELECTOR)
            for problem in operator_problems:
                say(f"operator pod not healthy: {problem}")
        except Exception:
            say("operator logs (tail):\n" + operator_logs(cluster))
            say("worker logs (tail):\n" + worker_logs(cluster))
            say("diagnosis:\n" + diagnosis(cluster))
            raise

        out = kafka.read_committed("events-deduped")
        dead = kafka.read_committed("events-dlq")
        ids = [header(m, ID_HEADER) for m in out]
        expected = set(events.sent)
        in_output_twice = len(ids) - len(set(ids))
        missing = len(expected - set(ids))
        reasons = sorted({header(m, DLQ_REASON) for m in dead})
        handover = entry["lastHandover"]
        rows = [
            ("produced", f"{len(events.sent) + MALFORMED}", f"{MALFORMED} of them malformed"),
            ("unique ids", f"{len(expected)}", ""),
            ("published", f"{len(ids)}", "read back with read_committed"),
            ("duplicates dropped", f"{len(events.sent) - len(ids)}", ""),
            ("dead-lettered", f"{len(dead)}", ", ".join(reasons)),
            (
                "misrouted share",
                ctl_view.show(
                    None
                    if monitor.last_doc.get("misroutedShare") is None
                    else f"{monitor.last_doc['misroutedShare']:.1%}"
                ),
                "retries on another partition, forwarded to the id's owner",
            ),
            ("duplicates in output", f"{in_output_twice}", "must be 0"),
            ("missing", f"{missing}", "must be 0"),
            (
                "failover seconds",
                f"{handover['steps']['ready']:.1f}",
                f"decision to Ready; {moved_after:.1f}s from the kill "
                f"({ctl_view.steps_text(handover['steps'])})",
            ),
            ("audit (Spark)", "passed" if audit_rc == 0 else f"exit {audit_rc}", "dedupctl audit"),
            (
                "operator pods",
                "healthy" if not operator_problems else f"{len(operator_problems)} problems",
                "0 restarts, no ERROR line, no permission warning",
            ),
        ]
        say("result:\n" + ctl_view.table(("", "COUNT", ""), rows))
        ok = (
            in_output_twice == 0
            and missing == 0
            and set(ids) == expected
            and len(dead) == MALFORMED
            and audit_rc == 0
            and not operator_problems
        )
        kill_t = killed_at - t0
        plot(
            monitor.points,
            png,
            killed=(kill_t, lost_node),
            handovers=list(monitor.handovers.values()),
            title=f"dedup-operator demo: {PARTITIONS} partitions, node {lost_node} killed",
        )
        say(f"throughput and lag per partition: {png}")
        say("exactly once: " + ("YES, every id once, nothing lost" if ok else "NO"))
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n")[0])
    parser.add_argument("--png", type=Path, default=None, help="where to write the picture")
    args = parser.parse_args(argv)
    try:
        return run(args.png or png_path())
    except KeyboardInterrupt:
        say("interrupted: everything it started is stopped")
        return 130
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
