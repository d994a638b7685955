"""Throughput of the reconciliation audit (`dedup-audit`), against a plain Python reader.

    python bench/audit.py [--records 1000000 5000000] [--partitions 8]
                          [--masters local[2]] [--skip-baseline]

Workload per size: an input topic of 300-byte JSON records over 8 partitions with 10%
repeats within the window and 0.1% invalid records, the output topic correct workers
under ownership would write (as many workers as partitions; first occurrences, each on
output partition owner(id), in input order per input partition; transactional) and the
dead letters. Filled once per size (not timed).

Ours: `dedup_spark.audit_job.run` on Spark (`local[2]`, or `k8s` with two executors
when run inside a driver pod, see bench/README.md, "Reconciliation audit"), timed twice:
reading alone (the three topics through Spark's Kafka source and the worker's id rules,
to a no-op sink) and the whole audit; computing = audit - reading. A first run on the
fresh JVM (JIT, Python workers) is printed as `cold`; then three runs, of which the
median is reported.
Baseline: one Python process reading the same topics with confluent-kafka (read
committed), extracting ids with the same `dedup_contract.ids` and content digests of its own
(BLAKE2b; Spark's are the JVM's xxhash64), and running the same rules in one process
(`dedup_spark.audit_rules.audit_records`, across partitions). Both must report the same counts.
Prints input records audited per second of wall time, records read per second (input,
output and dead letters: every record the audit reads and checks), and the ratio.
Target: >= 200,000 input records/s on `local[2]`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from hashlib import blake2b
from pathlib import Path
from typing import Any

import results as bench_results
from confluent_kafka import Consumer, Producer, TopicPartition

from dedup_contract.batch import DLQ_OFFSET, DLQ_PARTITION, DLQ_REASON, DLQ_TOPIC
from dedup_contract.ids import ID_HEADER, IdSpec, InvalidRecord, extract_id
from dedup_contract.ownership import owner_reference
from dedup_local.kafka import KafkaBroker, produce_all
from dedup_spark import audit_job, audit_model, audit_rules
from dedup_spark.source import KafkaSource, read_topic, with_ids

REPEAT_SHARE = 0.10
INVALID_SHARE = 0.001
WINDOW_MS = 24 * 3_600_000
TARGET = 200_000  # input records/s on local[2]
SPEC = IdSpec("jsonField", "messageId")


def records(
    total: int, partitions: int, seed: int = 11
) -> Iterator[tuple[int, bytes | None, bytes]]:
    """(partition, id or None for invalid, value) in input order."""
    rng = random.Random(seed)
    recent: list[list[bytes]] = [[] for _ in range(partitions)]
    for n in range(total):
        p = n % partitions
        roll = rng.random()
        if roll < INVALID_SHARE:
            yield p, None, b'{"messageId": null, "pad": "' + b"x" * 250 + b'"}'
            continue
        if roll < INVALID_SHARE + REPEAT_SHARE and recent[p]:
            mid = recent[p][rng.randrange(len(recent[p]))]
        else:
            mid = f"evt-{n:012d}".encode()
            recent[p].append(mid)
            if len(recent[p]) > 1000:
                recent[p].pop(0)
        body = b'{"messageId": "' + mid + b'", "seq": ' + str(n).encode() + b', "pad": "'
        yield p, mid, body + b"x" * max(0, 297 - len(body)) + b'"}'


def fill(kafka: KafkaBroker, name: str, total: int, partitions: int) -> None:
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", partitions)
    now = int(time.time() * 1000)
    plain = Producer(
        kafka.client_config(**{"linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4"})
    )
    out = Producer(
        kafka.client_config(
            **{
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "compression.type": "lz4",
                "transactional.id": f"bench-{uuid.uuid4().hex}",
            }
        )
    )
    out.init_transactions(30)
    offsets = [0] * partitions
    published: set[bytes] = set()
    ins: list[dict[str, Any]] = []
    outs: list[dict[str, Any]] = []
    for p, mid, value in records(total, partitions):
        ins.append({"value": value, "partition": p, "timestamp": now})
        if mid is None:
            outs.append(
                {
                    "topic": f"{name}-dlq",
                    "value": value,
                    "partition": p,
                    "timestamp": now,
                    "headers": [
                        (DLQ_REASON, b"id_null"),
                        (DLQ_TOPIC, f"{name}-in".encode()),
                        (DLQ_PARTITION, str(p).encode()),
                        (DLQ_OFFSET, str(offsets[p]).encode()),
                    ],
                }
            )
        elif mid not in published:
            published.add(mid)
            outs.append(
                {
                    "topic": f"{name}-out",
                    "value": value,
                    "partition": owner_reference(mid, partitions),
                    "timestamp": now,
                    "headers": [(ID_HEADER, mid)],
                }
            )
        offsets[p] += 1
        if len(ins) >= 100_000:
            _flush(plain, out, name, ins, outs)
    _flush(plain, out, name, ins, outs)


def _flush(
    plain: Producer, out: Producer, name: str, ins: list[dict[str, Any]], outs: list[dict[str, Any]]
) -> None:
    produce_all(plain, f"{name}-in", iter(ins), timeout_s=300)
    out.begin_transaction()
    for r in outs:
        topic = r.pop("topic")
        while True:
            try:
                out.produce(topic, **r)
                break
            except BufferError:
                out.poll(0.1)
    out.commit_transaction(120)
    ins.clear()
    outs.clear()


def job(bootstrap: str, name: str, report: Path, partitions: int) -> audit_job.AuditJob:
    return audit_job.AuditJob(
        pipeline=name,
        namespace="bench",
        kafka=KafkaSource(bootstrap),
        input_topic=f"{name}-in",
        output_topic=f"{name}-out",
        dead_letter_topic=f"{name}-dlq",
        id_spec=SPEC,
        window_ms=WINDOW_MS,
        slack_ms=WINDOW_MS // 4,
        audit_range=audit_model.AuditRange(),
        report_dir=str(report),
        consumer_group=None,
        workers=partitions,
    )


def run_spark(
    spark: Any, bootstrap: str, name: str, report: Path, partitions: int
) -> dict[str, Any]:
    src = KafkaSource(bootstrap)
    start = time.perf_counter()
    for suffix in ("in", "out"):
        with_ids(read_topic(spark, src, f"{name}-{suffix}"), SPEC).write.format("noop").mode(
            "overwrite"
        ).save()
    read_topic(spark, src, f"{name}-dlq").write.format("noop").mode("overwrite").save()
    reading = time.perf_counter() - start
    start = time.perf_counter()
    summary = audit_job.run(spark, job(bootstrap, name, report, partitions))
    total = time.perf_counter() - start
    return {"reading_s": reading, "total_s": total, "totals": summary["totals"]}


def plain_digest(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]] | None
) -> int:
    """The plain reader's own content digest (Spark's jobs use the JVM's `xxhash64`,
    `source.content_digest`): 64 bits of BLAKE2b over the parts, each length-prefixed."""
    parts = [b"-" if key is None else b"%d:%s" % (len(key), key)]
    parts.append(b"-" if value is None else b"%d:%s" % (len(value), value))
    for name, data in headers or ():
        raw = name.encode()
        parts.append(b"%d:%s" % (len(raw), raw))
        parts.append(b"-" if data is None else b"%d:%s" % (len(data), data))
    digest = blake2b(b"".join(parts), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def run_plain(kafka: KafkaBroker, name: str, partitions: int) -> dict[str, Any]:
    start = time.perf_counter()
    inputs: list[audit_model.InputRecord] = []
    outputs: list[audit_model.OutputRecord] = []
    dead: list[audit_model.DeadLetter] = []
    for msg in _read(kafka, f"{name}-in", partitions):
        digest = plain_digest(msg.key(), msg.value(), msg.headers())
        try:
            rec = audit_model.InputRecord(
                msg.offset(),
                msg.timestamp()[1],
                extract_id(SPEC, msg.key(), msg.value(), msg.headers()),
                digest=digest,
                partition=msg.partition(),
            )
        except InvalidRecord as bad:
            rec = audit_model.InputRecord(
                msg.offset(), msg.timestamp()[1], None, bad.reason, digest, msg.partition()
            )
        inputs.append(rec)
    for msg in _read(kafka, f"{name}-out", partitions):
        headers = msg.headers()
        own = headers[:-1] if headers and headers[-1][0] == ID_HEADER else headers
        try:
            mid: str | None = extract_id(SPEC, msg.key(), msg.value(), headers)
        except InvalidRecord:
            mid = None
        outputs.append(
            audit_model.OutputRecord(
                msg.offset(),
                msg.timestamp()[1],
                mid,
                plain_digest(msg.key(), msg.value(), own),
                msg.partition(),
            )
        )
    for msg in _read(kafka, f"{name}-dlq", partitions):
        headers = {k: v for k, v in msg.headers() or []}
        origin = int(headers[DLQ_PARTITION] or b"-1")
        reason = (headers.get(DLQ_REASON) or b"").decode() or None
        dead.append(
            audit_model.DeadLetter(
                int(headers[DLQ_OFFSET] or b"-1"), msg.timestamp()[1], reason, origin
            )
        )
    reading = time.perf_counter() - start
    result = audit_rules.audit_records(
        inputs,
        outputs,
        dead,
        workers=partitions,
        audit_range=audit_model.AuditRange(),
        window_ms=WINDOW_MS,
        slack_ms=WINDOW_MS // 4,
    )
    total = time.perf_counter() - start
    return {"reading_s": reading, "total_s": total, "totals": result.totals()}


def _read(kafka: KafkaBroker, topic: str, partitions: int) -> Iterator[Any]:
    consumer = Consumer(
        kafka.client_config(
            **{
                "group.id": f"bench-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    open_parts = set(range(partitions))
    try:
        while open_parts:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is None:
                    yield msg
                elif msg.error().code() == -191:  # _PARTITION_EOF
                    open_parts.discard(msg.partition())
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--masters", nargs="+", default=["local[2]", "k8s"])
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--in-pod", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    if args.in_pod:
        return in_pod(args.bootstrap, args.name, args.executors, args.partitions)

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-audit-")))
        kafka = stack.enter_context(KafkaBroker())
        rows = []
        for total in args.records:
            name = f"bench-{total}-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            fill(kafka, name, total, args.partitions)
            print(f"filled {total:,} records in {time.perf_counter() - t0:.0f}s", flush=True)
            baseline = None if args.skip_baseline else run_plain(kafka, name, args.partitions)
            if baseline:
                print(f"  plain python: {baseline['total_s']:.1f}s", flush=True)
            for master in args.masters:
                if master == "k8s":
                    ours = on_cluster(stack, kafka, name, args.executors, args.partitions)
                    master = f"k8s, {args.executors} executor pods"
                else:
                    spark = _session(master, work)
                    try:
                        ours = timed_runs(spark, kafka.bootstrap, name, work, args.partitions)
                    finally:
                        spark.stop()
                print(
                    f"  spark {master}: {ours['total_s']:.1f}s (runs: "
                    f"{', '.join(f'{t:.1f}' for t in ours['runs_s'])}; first, cold: "
                    f"{ours['cold_s']:.1f}s)",
                    flush=True,
                )
                if baseline and ours["totals"] != baseline["totals"]:
                    print(f"COUNTS DIFFER: spark {ours['totals']} plain {baseline['totals']}")
                    return 1
                rows.append((total, master, ours, baseline))
        _print(rows)
    bench_results.record_figures(args, figures(rows, args.executors))
    return 0


TIMED_RUNS = 3


def timed_runs(
    spark: Any, bootstrap: str, name: str, work: Path, partitions: int
) -> dict[str, Any]:
    """A first run (a cold JVM: JIT, Python workers), then TIMED_RUNS; the median one."""
    cold = spark_run(spark, bootstrap, name, work, partitions)
    runs = sorted(
        (spark_run(spark, bootstrap, name, work, partitions) for _ in range(TIMED_RUNS)),
        key=lambda r: float(r["total_s"]),
    )
    median = runs[len(runs) // 2]
    return {
        **median,
        "cold_s": cold["total_s"],
        "runs_s": [r["total_s"] for r in runs],
    }


def spark_run(spark: Any, bootstrap: str, name: str, work: Path, partitions: int) -> dict[str, Any]:
    return run_spark(spark, bootstrap, name, work / f"report-{uuid.uuid4().hex[:6]}", partitions)


RESULT_MARK = "BENCH-RESULT "
_cluster: dict[str, Any] = {}


def on_cluster(
    stack: ExitStack, kafka: KafkaBroker, name: str, executors: int, partitions: int
) -> dict[str, Any]:
    """The same runs in a driver pod on the local cluster, with executor pods."""
    from kubernetes import client

    from dedup_local.cluster import ClusterTimings, LocalCluster
    from dedup_local.spark_pods import driver_pod, grant_driver, run_driver

    if not _cluster:
        cluster = LocalCluster(nodes=2, timings=ClusterTimings.fast())
        cluster.start()
        stack.callback(cluster.stop)
        api = cluster.api_client()
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "bench"}})
        _cluster.update(cluster=cluster, api=api, account=grant_driver(api, "bench"))
    cluster, api = _cluster["cluster"], _cluster["api"]
    command = [
        "python", str(Path(__file__).resolve()), "--in-pod",
        "--name", name, "--bootstrap", kafka.bootstrap, "--executors", str(executors),
        "--partitions", str(partitions),
    ]  # fmt: skip
    pod = driver_pod(f"bench-{uuid.uuid4().hex[:8]}", command, _cluster["account"])
    phase, log, watch = run_driver(cluster, api, "bench", pod, timeout_s=3600)
    lines = [line for line in log.splitlines() if line.startswith(RESULT_MARK)]
    if phase != "Succeeded" or not lines:
        raise RuntimeError(f"the driver pod ended {phase}:\n{log[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix(RESULT_MARK))
    result["executor_pods"] = len(watch.seen)
    return result


def in_pod(bootstrap: str, name: str, executors: int, partitions: int) -> int:
    """(In the driver pod.) Warm-up run, timed run, result on one line."""
    from dedup_local.spark_pods import PROJECT_IMAGE
    from dedup_spark.session import SparkSettings, spark_session

    spark = spark_session(
        "bench-audit",
        SparkSettings(
            "k8s",
            image=PROJECT_IMAGE,
            executors=executors,
            executor_memory="2g",
            driver_memory="2g",
            conf={"spark.sql.shuffle.partitions": "8"},
        ),
    )
    try:
        work = Path("/reports")
        result = timed_runs(spark, bootstrap, name, work, partitions)
    finally:
        spark.stop()
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


def _session(master: str, work: Path) -> Any:
    from dedup_local.spark import use_cached_kafka_jars
    from dedup_spark.session import SparkSettings, spark_session

    use_cached_kafka_jars()  # the jars the job takes from DEDUP_SPARK_JARS, as in the image
    return spark_session(
        "bench-audit",
        SparkSettings(master, driver_memory="4g", conf={"spark.sql.shuffle.partitions": "8"}),
    )


Rows = list[tuple[int, str, dict[str, Any], dict[str, Any] | None]]
"""(input records, runner, the median Spark run, the plain Python run or None)"""


def figures(rows: Rows, executors: int) -> list[bench_results.Figure]:
    """The results table's rows of this run: one per size on each local master (the
    target is for local[2]), one for the executor pods over all sizes."""
    out: list[bench_results.Figure] = []
    on_pods: list[str] = []
    for total, master, ours, baseline in rows:
        label = bench_results.count_label(total)
        rate = total / ours["total_s"]
        if master.startswith("local"):
            versus = (
                f", {baseline['total_s'] / ours['total_s']:.2f}x plain Python" if baseline else ""
            )
            out.append(
                bench_results.Figure(
                    f"audit.{master}.{label}",
                    f"audit, {label}, `{master}`",
                    f"{ours['total_s']:.1f} s: {rate:,.0f} input records/s{versus}",
                    f">= {TARGET:,}/s: {bench_results.verdict(rate >= TARGET)}",
                )
            )
        elif master.startswith("k8s"):
            unit = "" if on_pods else " input records/s"
            on_pods.append(f"{rate:,.0f}{unit} at {label}")
    if on_pods:
        out.append(
            bench_results.Figure(
                "audit.k8s", f"audit on {executors} executor pods", ", ".join(on_pods), "none"
            )
        )
    return out


def _print(rows: Rows) -> None:
    print()
    print(
        "| input records | runner | reading s | computing s | total s | input records/s "
        "| records read/s | vs plain Python | target (input records/s) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for size in dict.fromkeys(total for total, *_ in rows):
        base = None
        for total, master, ours, baseline in rows:
            if total != size:
                continue
            base = baseline
            t = ours["totals"]
            read = t["input"] + t["published"] + t["deadLettered"]
            rate = total / ours["total_s"]
            # The target is for local[2]; the executor pods' rows are for comparison.
            target = f">= {TARGET:,}: {'met' if rate >= TARGET else 'MISSED'}"
            target = target if master.startswith("local") else ""
            ratio = f"{rate * base['total_s'] / total:.2f}x" if base else ""
            print(
                f"| {total:,} | spark {master} | {ours['reading_s']:.1f} | "
                f"{max(0.0, ours['total_s'] - ours['reading_s']):.1f} | "
                f"{ours['total_s']:.1f} | {rate:,.0f} | {read / ours['total_s']:,.0f} | "
                f"{ratio} | {target} |"
            )
        if base:  # one plain Python row per size, after its Spark rows
            print(
                f"| {size:,} | plain Python | {base['reading_s']:.1f} | "
                f"{base['total_s'] - base['reading_s']:.1f} | {base['total_s']:.1f} | "
                f"{size / base['total_s']:,.0f} | {read / base['total_s']:,.0f} | 1.00x | |"
            )
    totals = rows[-1][2]["totals"] if rows else {}
    print(f"\nlast audit's totals: {json.dumps(totals, sort_keys=True)}")


if __name__ == "__main__":
    sys.exit(main())
