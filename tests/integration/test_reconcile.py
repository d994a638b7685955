"""`dedup-audit` against a real broker and a real local SparkSession.

Topics filled with known content and planted defects (duplicates in the output, missing
ids, reorderings, dead letters, ids repeated beyond the window), published as workers
under ownership do (issue 26: each id on output partition owner(id)): the report's counts
equal the planted ones. Topics written as the forwarding workers write them (ids on
several input partitions, forwarded records on the internal topic, one of them not yet
consumed by its owner): the audit passes, reports the waiting one as pending, and fails
on a planted cross-partition duplicate. And on a real worker's output the audit passes
with zeros.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kubernetes.client import CoreV1Api
from pyspark.sql import SparkSession

from dedup_contract.ids import ID_HEADER, IdSpec
from dedup_contract.ownership import owner_reference
from dedup_local.kafka import KafkaBroker
from dedup_spark import audit_job
from dedup_spark.audit_model import AuditRange
from dedup_spark.source import KafkaSource
from dedup_worker.loop import DLQ_OFFSET, DLQ_PARTITION, DLQ_REASON, DLQ_TOPIC, DedupWorker
from support.kube_fixtures import KubeNamespace
from support.worker_helpers import event, produce, run_until_consumed, unique, worker_config

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]

HOUR = 3_600_000
PARTITIONS = 4


def owner(mid: str, workers: int) -> int:
    """The owner as the worker computes it (its pure-Python reference), not the audit's."""
    return owner_reference(mid.encode(), workers)


@dataclass
class Rec:
    partition: int
    timestamp_ms: int
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def produce_records(
    kafka: KafkaBroker, topic: str, records: list[Rec], *, transactional: bool = True
) -> None:
    """In transactions of 500 (their markers take offsets, as a worker's output does), or
    plainly (offsets counted from 0 without gaps, as the test plants dead letters' origins)."""
    if not transactional:
        producer = Producer(kafka.client_config(**{"enable.idempotence": True}))
        for r in records:
            producer.produce(
                topic, r.value, None, r.partition, timestamp=r.timestamp_ms, headers=r.headers
            )
        assert producer.flush(30) == 0
        return
    producer = Producer(kafka.client_config(**{"transactional.id": f"t-{uuid.uuid4().hex}"}))
    producer.init_transactions(30)
    for start in range(0, len(records), 500):
        producer.begin_transaction()
        for r in records[start : start + 500]:
            producer.produce(
                topic, r.value, None, r.partition, timestamp=r.timestamp_ms, headers=r.headers
            )
        producer.commit_transaction(30)


def job(name: str, kafka: KafkaBroker, tmp: Path, **overrides: Any) -> audit_job.AuditJob:
    settings: dict[str, Any] = {
        "pipeline": name,
        "namespace": "default",
        "kafka": KafkaSource(kafka.bootstrap),
        "input_topic": f"{name}-in",
        "output_topic": f"{name}-out",
        "dead_letter_topic": f"{name}-dlq",
        "id_spec": IdSpec("jsonField", "messageId"),
        "window_ms": HOUR,
        "slack_ms": HOUR // 4,
        "audit_range": AuditRange(),
        "report_dir": str(tmp / "report"),
        "consumer_group": None,
        "workers": PARTITIONS,
    }
    settings.update(overrides)
    return audit_job.AuditJob(**settings)


def test_planted_defects_are_counted(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Ids of input partition p are `p<p>-<i>`, published to their owner's output
    partition (4 workers), in input order per (input partition, output partition)."""
    name = unique("audit")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", PARTITIONS)
    base = int(time.time() * 1000) - 6 * HOUR
    inputs: list[Rec] = []
    outputs: dict[int, list[Rec]] = {p: [] for p in range(PARTITIONS)}
    source: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    dead: list[Rec] = []
    for p in range(PARTITIONS):
        offset = 0
        published: dict[str, int] = {}

        def arrive(
            mid: str | None, ts: int, p: int = p, published: dict[str, int] = published
        ) -> None:
            nonlocal offset
            value = b"{not json" if mid is None else event(mid)
            inputs.append(Rec(p, ts, value))
            if mid is None:
                dead.append(
                    Rec(
                        (p + 1) % PARTITIONS,  # dead letters land anywhere; headers say where from
                        ts,
                        value,
                        [
                            (DLQ_REASON, b"not_json"),
                            (DLQ_TOPIC, f"{name}-in".encode()),
                            (DLQ_PARTITION, str(p).encode()),
                            (DLQ_OFFSET, str(offset).encode()),
                        ],
                    )
                )
            elif mid not in published or ts - published[mid] >= HOUR:
                published[mid] = ts
                q = owner(mid, PARTITIONS)
                outputs[q].append(Rec(q, ts, value, [(ID_HEADER, mid.encode())]))
                source[q].append((p, mid))
            offset += 1

        for i in range(200):
            ts = base + i * 1000
            arrive(f"p{p}-{i}", ts)
            if i % 10 == 0:
                arrive(f"p{p}-{i}", ts + 500)  # a repeat within the window: dropped
            if i % 70 == 5:
                arrive(None, ts + 600)  # not JSON: dead-lettered
        arrive(f"p{p}-0", base + 2 * HOUR)  # beyond the window: published again

    def at(mid: str, ts: int | None = None) -> tuple[int, int]:
        q = owner(mid, PARTITIONS)
        for n, rec in enumerate(outputs[q]):
            if rec.value == event(mid) and (ts is None or rec.timestamp_ms == ts):
                return q, n
        raise AssertionError(mid)

    # Plant: three duplicates (of p0 ids), three missing p1 ids + p1-0's republication
    # beyond the window, two reorderings of input partition 2 within one output
    # partition, one unexpected id and one missing dead letter (input partition 3).
    for mid in ("p0-3", "p0-4", "p0-5"):
        q, n = at(mid)
        outputs[q].append(outputs[q][n])
    for mid in ("p1-7", "p1-8", "p1-9"):
        q, n = at(mid)
        del outputs[q][n], source[q][n]
    q, n = at("p1-0", base + 2 * HOUR)
    del outputs[q][n], source[q][n]
    q2 = owner("p2-20", PARTITIONS)
    of_p2 = [n for n, (p, _) in enumerate(source[q2]) if p == 2]
    for k in (10, 30):  # swap consecutive publications of input partition 2
        i, j = of_p2[k], of_p2[k + 1]
        outputs[q2][i], outputs[q2][j] = outputs[q2][j], outputs[q2][i]
    ghost = owner("ghost", PARTITIONS)
    outputs[ghost].insert(50, Rec(ghost, base + 50_000, event("ghost"), [(ID_HEADER, b"ghost")]))
    assert dict(dead[-1].headers)[DLQ_PARTITION] == b"3"
    dead.pop()

    produce_records(kafka, f"{name}-in", inputs, transactional=False)
    produce_records(kafka, f"{name}-out", [o for p in outputs.values() for o in p])
    produce_records(kafka, f"{name}-dlq", dead)

    summary = audit_job.run(spark, job(name, kafka, tmp_path))

    totals = summary["totals"]
    planted = {
        "duplicates": 3,
        "missing": 4,
        "orderViolations": 2,
        "unexpected": 1,
        "missingDeadLetters": 1,
        "misplaced": 0,
        "contentMismatches": 0,
    }
    assert {k: totals[k] for k in planted} == planted
    assert summary["passed"] is False
    assert summary["ownership"] == {"workers": PARTITIONS, "ownedTopic": None}
    parts = {p["partition"]: p for p in summary["partitions"]}
    assert sorted(parts) == list(range(PARTITIONS))
    for p, counts in parts.items():  # the input side, per input partition
        assert counts["input"] == 200 + 20 + 3 + 1
        assert counts["valid"] == 221 and counts["distinct"] == 200
        assert counts["inputDuplicateRate"] == pytest.approx(21 / 221, abs=1e-6)
        assert counts["deadLettered"] == (2 if p == 3 else 3)
        assert counts["deadLetteredByReason"] == {"not_json": counts["deadLettered"]}
        assert counts["missingDeadLetters"] == (1 if p == 3 else 0)
    # the output side, per output partition
    assert [parts[q]["published"] for q in range(PARTITIONS)] == [
        len(outputs[q]) for q in range(PARTITIONS)
    ]
    assert parts[q2]["orderViolations"] == 2
    assert totals["distinct"] == 800 and totals["published"] == 804

    report = Path(summary["report"])
    assert json.loads((report / "summary.json").read_text())["runId"] == summary["runId"]
    findings = pq.read_table(report / "findings").to_pylist()
    assert sorted(f["id"] for f in findings if f["kind"] == "missing") == [
        "p1-0",
        "p1-7",
        "p1-8",
        "p1-9",
    ]
    assert sorted(f["id"] for f in findings if f["kind"] == "duplicate") == [
        "p0-3",
        "p0-4",
        "p0-5",
    ]
    assert {f["partition"] for f in findings if f["kind"] == "order_violation"} == {q2}
    assert [f["id"] for f in findings if f["kind"] == "unexpected"] == ["ghost"]


WORKERS = 3


@dataclass
class Owned:
    """Topics as workers under ownership write them (issue 26), with what the test knows."""

    name: str
    group: str
    inputs: list[Rec]
    published: dict[int, list[Rec]]
    waiting: tuple[str, int, int]  # the forwarded record its owner has not consumed
    repeated: list[tuple[str, int, int]]  # (id, input partition, ts): second occurrences


def write_as_owners(kafka: KafkaBroker) -> Owned:
    """4 input partitions, 3 workers (worker w reads input partitions i with i % 3 == w).
    Each id arrives on input partition n % 4; every third also on the next partition
    500 ms later. The reader of a record its worker does not own forwards it to the
    owner's partition of `<name>-owned` (headers `dedup.id`, `dedup.origin` appended);
    the owner publishes the first occurrence it meets, with those headers stripped.
    Everything is consumed and committed, except one forwarded record left above its
    internal partition's committed offset (and so not yet published)."""
    name = unique("auditown")
    kafka.create_topic(f"{name}-in", PARTITIONS)
    kafka.create_topic(f"{name}-out", WORKERS)
    kafka.create_topic(f"{name}-dlq", 1)
    kafka.create_topic(f"{name}-owned", WORKERS)
    base = int(time.time() * 1000) - HOUR
    inputs: list[Rec] = []
    offsets = [0] * PARTITIONS
    arrivals: list[tuple[str | None, int, int, int]] = []  # id, partition, offset, ts
    repeated = []
    for n in range(300):
        mid, ts = f"id-{n}", base + n * 1000
        for p, t in [(n % PARTITIONS, ts)] + (
            [((n + 1) % PARTITIONS, ts + 500)] if n % 3 == 0 else []
        ):
            inputs.append(Rec(p, t, event(mid)))
            arrivals.append((mid, p, offsets[p], t))
            offsets[p] += 1
            if t != ts:
                repeated.append((mid, p, t))
    inputs.append(Rec(1, base + 777, b"{not json"))
    arrivals.append((None, 1, offsets[1], base + 777))
    offsets[1] += 1
    # The waiting one: an id that occurs once, read by a worker that does not own it.
    waiting_id = next(
        f"id-{n}"
        for n in range(1, 300)
        if n % 3 and owner(f"id-{n}", WORKERS) != (n % PARTITIONS) % WORKERS
    )
    forwarded: dict[int, list[Rec]] = {q: [] for q in range(WORKERS)}
    published: dict[int, list[Rec]] = {q: [] for q in range(WORKERS)}
    seen: set[str] = set()
    waiting: Rec | None = None
    waiting_origin = (0, 0)
    for arrived, p, offset, ts in sorted(arrivals, key=lambda a: a[3]):
        if arrived is None:
            continue
        mid = arrived
        q = owner(mid, WORKERS)
        headers = [(ID_HEADER, mid.encode())]
        if q != p % WORKERS:  # forwarded through the owner's internal partition
            fwd = Rec(
                q,
                ts,
                event(mid),
                [("dedup.id", mid.encode()), ("dedup.origin", f"{p}:{offset}".encode())],
            )
            if mid == waiting_id:
                waiting, waiting_origin = fwd, (p, offset)
                continue
            forwarded[q].append(fwd)
        if mid not in seen:
            seen.add(mid)
            published[q].append(Rec(q, ts, event(mid), headers))
    assert waiting is not None
    produce_records(kafka, f"{name}-in", inputs, transactional=False)
    produce_records(kafka, f"{name}-owned", [r for q in forwarded.values() for r in q])
    produce_records(kafka, f"{name}-out", [r for q in published.values() for r in q])
    produce_records(
        kafka,
        f"{name}-dlq",
        [
            Rec(
                0,
                base + 777,
                b"{not json",
                [
                    (DLQ_REASON, b"not_json"),
                    (DLQ_TOPIC, f"{name}-in".encode()),
                    (DLQ_PARTITION, b"1"),
                    (DLQ_OFFSET, str(offsets[1] - 1).encode()),
                ],
            )
        ],
    )
    # The owners' group has consumed everything: the input, and the internal topic up
    # to (not including) the waiting record, written after the commit.
    group = f"dedup-{name}"
    consumer = Consumer(kafka.client_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        commits = []
        for topic, count in ((f"{name}-in", PARTITIONS), (f"{name}-owned", WORKERS)):
            for part in range(count):
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=30)
                commits.append(TopicPartition(topic, part, high))
        consumer.commit(offsets=commits, asynchronous=False)
    finally:
        consumer.close()
    produce_records(kafka, f"{name}-owned", [waiting])
    return Owned(name, group, inputs, published, (waiting_id, *waiting_origin), repeated)


@pytest.fixture(scope="module")
def owned(kafka: KafkaBroker) -> Owned:
    return write_as_owners(kafka)


def owned_job(owned: Owned, kafka: KafkaBroker, tmp: Path, **overrides: Any) -> audit_job.AuditJob:
    settings: dict[str, Any] = {
        "workers": WORKERS,
        "owned_topic": f"{owned.name}-owned",
        "consumer_group": owned.group,
        "audit_range": AuditRange(
            int(time.time() * 1000) - 2 * HOUR, int(time.time() * 1000) + HOUR
        ),
    }
    settings.update(overrides)
    return job(owned.name, kafka, tmp, **settings)


def test_forwarded_output_passes_and_the_waiting_record_is_pending(
    spark: SparkSession, kafka: KafkaBroker, owned: Owned, tmp_path: Path
) -> None:
    summary = audit_job.run(spark, owned_job(owned, kafka, tmp_path))
    totals = summary["totals"]
    assert summary["passed"], totals
    assert (totals["input"], totals["valid"], totals["pending"]) == (400, 399, 1)
    assert (totals["distinct"], totals["published"]) == (299, 299)
    assert (totals["duplicates"], totals["misplaced"], totals["missing"]) == (0, 0, 0)
    assert totals["deadLettered"] == 1
    mid, p, _ = owned.waiting
    assert {q["partition"]: q["pending"] for q in summary["partitions"]}[p] == 1
    # Without the internal topic, the waiting record's occurrence has no publication.
    blind = audit_job.run(spark, owned_job(owned, kafka, tmp_path, owned_topic=None))
    assert blind["passed"] is False
    assert (blind["totals"]["missing"], blind["totals"]["pending"]) == (1, 0)
    findings = pq.read_table(Path(blind["report"]) / "findings").to_pylist()
    assert [(f["kind"], f["id"], f["partition"]) for f in findings] == [("missing", mid, p)]


def test_a_cross_partition_duplicate_fails_the_audit(
    spark: SparkSession, kafka: KafkaBroker, owned: Owned, tmp_path: Path
) -> None:
    """Both occurrences of an id that arrived on two input partitions are published,
    as a worker reading each partition on its own did before ownership: once by its
    owner, once on the output partition of the second occurrence's reader."""
    name = owned.name
    mid, p, ts = next(r for r in owned.repeated if owner(r[0], WORKERS) != r[1] % WORKERS)
    bad = f"{name}-bad"
    kafka.create_topic(bad, WORKERS)
    copies = [r for q in owned.published.values() for r in q]
    wrong = p % WORKERS
    copies.append(Rec(wrong, ts, event(mid), [(ID_HEADER, mid.encode())]))
    produce_records(kafka, bad, copies)
    summary = audit_job.run(spark, owned_job(owned, kafka, tmp_path, output_topic=bad))
    totals = summary["totals"]
    assert summary["passed"] is False
    assert (totals["duplicates"], totals["misplaced"], totals["missing"]) == (1, 1, 0)
    findings = pq.read_table(Path(summary["report"]) / "findings").to_pylist()
    assert sorted((f["kind"], f["id"], f["partition"]) for f in findings) == [
        ("duplicate", mid, wrong),
        ("misplaced", mid, wrong),
    ]


def test_a_clean_worker_run_passes_with_zeros(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    name = unique("auditw")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    cfg = worker_config(kafka.bootstrap, tmp_path, name, batch_size=200)
    ids = [f"id-{i % 700}" for i in range(1000)]  # 300 repeats within the window
    values = [event(i, n) for n, i in enumerate(ids)] + [b"oops", b"[]"]
    produce(kafka.bootstrap, cfg.input_topic, values)
    run_until_consumed(DedupWorker(cfg), len(values))

    summary = audit_job.run(
        spark,
        job(
            name,
            kafka,
            tmp_path,
            window_ms=24 * HOUR,
            audit_range=AuditRange(int(time.time() * 1000) - HOUR, int(time.time() * 1000) + HOUR),
            consumer_group=cfg.group,
            workers=1,
        ),
    )
    totals = summary["totals"]
    assert summary["passed"], totals
    assert (totals["input"], totals["valid"], totals["distinct"]) == (1002, 1000, 700)
    assert (totals["published"], totals["deadLettered"], totals["pending"]) == (700, 2, 0)
    assert summary["deadLetteredByReason"] == {"not_json": 1, "not_object": 1}


def test_a_lost_occurrence_hidden_by_a_later_publication_fails_the_audit(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Issue 18: `a` at t0 is published only in a transaction the test aborts (the output
    never holds it for read_committed readers); `a` repeats 2 h later, beyond the 1 h
    window, and that repeat is rightly published. The later publication must not account
    for the lost occurrence: the audit fails and names input offset 0. And `b`'s output
    carries a changed value: a content mismatch at its output offset."""
    name = unique("auditlost")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    base = int(time.time() * 1000) - 6 * HOUR
    ids = [("a", base), ("b", base + 1000), ("c", base + 2000), ("a", base + 2 * HOUR)]
    produce_records(
        kafka,
        f"{name}-in",
        [Rec(0, ts, event(mid)) for mid, ts in ids],
        transactional=False,
    )

    def out(mid: str, ts: int, value: bytes | None = None) -> Rec:
        return Rec(0, ts, value or event(mid), [(ID_HEADER, mid.encode())])

    producer = Producer(kafka.client_config(**{"transactional.id": f"t-{uuid.uuid4().hex}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    lost = out("a", base)
    producer.produce(
        f"{name}-out", lost.value, None, 0, timestamp=lost.timestamp_ms, headers=lost.headers
    )
    assert producer.flush(30) == 0  # it reached the broker, inside the transaction
    producer.abort_transaction(30)
    producer.begin_transaction()
    for rec in (
        out("b", base + 1000, event("b", 99)),  # the value changed on the way
        out("c", base + 2000),
        out("a", base + 2 * HOUR),
    ):
        producer.produce(
            f"{name}-out", rec.value, None, 0, timestamp=rec.timestamp_ms, headers=rec.headers
        )
    producer.commit_transaction(30)

    summary = audit_job.run(spark, job(name, kafka, tmp_path, workers=1))

    totals = summary["totals"]
    assert summary["passed"] is False
    assert (totals["missing"], totals["contentMismatches"], totals["duplicates"]) == (1, 1, 0)
    assert totals["published"] == 3 and totals["unverifiable"] == 0
    findings = pq.read_table(Path(summary["report"]) / "findings").to_pylist()
    named = sorted((f["kind"], f["id"], f["offset"]) for f in findings)
    # Output offsets: the aborted record and its abort marker took 0 and 1.
    assert named == [("content_mismatch", "b", 2), ("missing", "a", 0)]


def test_input_deleted_by_retention_is_reported_as_unverifiable(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """The first 4 of 10 input records are deleted (DeleteRecords, as retention does)
    before the audit of offsets 0-10: it cannot verify them and says so, failing by
    default and passing with a warning under `--unverifiable warn`."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    name = unique("auditret")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    now = int(time.time() * 1000)
    records = [Rec(0, now + i, event(f"id-{i}")) for i in range(10)]
    produce_records(kafka, f"{name}-in", records, transactional=False)
    produce_records(
        kafka,
        f"{name}-out",
        [
            Rec(0, r.timestamp_ms, r.value, [(ID_HEADER, f"id-{i}".encode())])
            for i, r in enumerate(records)
        ],
    )
    admin = AdminClient(kafka.client_config())
    for future in admin.delete_records([TopicPartition(f"{name}-in", 0, 4)]).values():
        future.result(60)

    rng = AuditRange(offsets={0: (0, 10)})
    strict = audit_job.run(spark, job(name, kafka, tmp_path, audit_range=rng, workers=1))
    assert strict["passed"] is False and strict["unverifiable"] == "fail"
    assert strict["totals"]["unverifiable"] == 4 and strict["totals"]["missing"] == 0
    assert strict["totals"]["input"] == 6
    findings = pq.read_table(Path(strict["report"]) / "findings").to_pylist()
    assert [(f["kind"], f["offset"], f["detail"]) for f in findings] == [
        ("unverifiable", 0, "input offsets 0-3 deleted by retention")
    ]
    lenient = audit_job.run(
        spark,
        job(name, kafka, tmp_path, audit_range=rng, fail_on_unverifiable=False, workers=1),
    )
    assert lenient["passed"] is True and lenient["totals"]["unverifiable"] == 4


def run_cli(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("dedup-audit")
    return subprocess.run(
        [str(exe), "--log-format", "text", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.mark.cluster_group("control-plane")
def test_the_command_fails_the_audit_with_exit_1_and_publishes_the_summary(
    kafka: KafkaBroker, kube_namespace: KubeNamespace, tmp_path: Path
) -> None:
    name = unique("auditcli")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 2)
    now = int(time.time() * 1000)
    ids = [f"id-{i}" for i in range(100)]
    produce_records(
        kafka,
        f"{name}-in",
        [Rec(i % 2, now + i, event(mid)) for i, mid in enumerate(ids)],
        transactional=False,
    )
    # Everything published once by its owner (2 workers), id-7 twice.
    published = [Rec(owner(mid, 2), now + i, event(mid)) for i, mid in enumerate(ids)]
    produce_records(kafka, f"{name}-out", [*published, published[7]])

    result = run_cli(
        *("--pipeline", name, "--namespace", kube_namespace.name),
        *("--bootstrap-servers", kafka.bootstrap),
        *("--input-topic", f"{name}-in", "--output-topic", f"{name}-out"),
        *("--dead-letter-topic", f"{name}-dlq", "--window", "1h", "--lookback", "1h"),
        *("--workers", "2"),
        *("--to", datetime.fromtimestamp(now / 1000 + 3600, UTC).isoformat()),
        *("--all-input", "--report-dir", str(tmp_path / "report"), "--configmap"),
        *("--kubeconfig", str(kube_namespace.kubeconfig_path), "--master", "local[2]"),
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "audit FAILED" in result.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["totals"]["duplicates"] == 1 and summary["totals"]["input"] == 100
    assert [p["duplicates"] for p in summary["partitions"]] == [
        int(p == owner("id-7", 2)) for p in range(2)
    ]

    core = CoreV1Api(kube_namespace.cluster.api_client)
    cm = core.read_namespaced_config_map(f"{name}-reconciliation", kube_namespace.name)
    assert json.loads(cm.data["summary.json"])["runId"] == summary["runId"]
    assert cm.metadata.labels["dedup.io/pipeline"] == name


def test_an_unreachable_broker_ends_in_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli(
        *("--pipeline", "p", "--bootstrap-servers", "127.0.0.1:1"),
        *("--input-topic", "i", "--output-topic", "o", "--window", "1h"),
        *("--workers", "1", "--report-dir", str(tmp_path)),
        timeout_s=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "could not run" in line]
    assert len(errors) == 1, result.stderr


def test_bad_arguments_end_in_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli(
        *("--pipeline", "p", "--bootstrap-servers", "127.0.0.1:1"),
        *("--input-topic", "i", "--output-topic", "o", "--window", "soon"),
        *("--workers", "2", "--report-dir", str(tmp_path)),
    )
    assert result.returncode == 2
    assert "bad arguments: not a duration: 'soon'" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli(
        *("--pipeline", "p", "--bootstrap-servers", "127.0.0.1:1"),
        *("--input-topic", "i", "--output-topic", "o", "--window", "1h"),
        *("--report-dir", str(tmp_path)),
    )
    assert result.returncode == 2
    assert "bad arguments: --workers is required" in result.stderr
    assert "Traceback" not in result.stderr
