"""`dedup-reconcile` against a real broker and a real local SparkSession.

Topics filled with known content and planted defects (duplicates in the output, missing
ids, reorderings, dead letters, ids repeated beyond the window): the report's counts
equal the planted ones, per partition. And on a real worker's output the audit passes
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
from confluent_kafka import Producer
from kubernetes.client import CoreV1Api
from pyspark.sql import SparkSession

from dedup_local.kafka import KafkaBroker
from dedup_spark import reconcile
from dedup_spark.audit import AuditRange
from dedup_spark.source import KafkaSource
from dedup_worker.ids import ID_HEADER, IdSpec
from dedup_worker.loop import DLQ_OFFSET, DLQ_PARTITION, DLQ_REASON, DLQ_TOPIC, DedupWorker
from support.kube_fixtures import KubeNamespace
from support.worker_helpers import event, produce, run_until_consumed, unique, worker_config

pytestmark = pytest.mark.integration

HOUR = 3_600_000
PARTITIONS = 4


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


def job(name: str, kafka: KafkaBroker, tmp: Path, **overrides: Any) -> reconcile.AuditJob:
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
    }
    settings.update(overrides)
    return reconcile.AuditJob(**settings)


def test_planted_defects_are_counted_per_partition(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    name = unique("audit")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", PARTITIONS)
    base = int(time.time() * 1000) - 6 * HOUR
    inputs: list[Rec] = []
    outputs: dict[int, list[Rec]] = {p: [] for p in range(PARTITIONS)}
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
                outputs[p].append(Rec(p, ts, value, [(ID_HEADER, mid.encode())]))
            offset += 1

        for i in range(200):
            ts = base + i * 1000
            arrive(f"p{p}-{i}", ts)
            if i % 10 == 0:
                arrive(f"p{p}-{i}", ts + 500)  # a repeat within the window: dropped
            if i % 70 == 5:
                arrive(None, ts + 600)  # not JSON: dead-lettered
        arrive(f"p{p}-0", base + 2 * HOUR)  # beyond the window: published again

    # Plant: p0 three duplicates; p1 three missing + the beyond-window republication
    # missing; p2 two reorderings; p3 one unexpected id and one missing dead letter.
    for i in (3, 4, 5):
        outputs[0].append(outputs[0][i])
    outputs[1] = [o for o in outputs[1] if o.value not in {event(f"p1-{i}") for i in (7, 8, 9)}]
    outputs[1].pop()  # p1-0 at +2h
    for i in (20, 40):
        outputs[2][i], outputs[2][i + 1] = outputs[2][i + 1], outputs[2][i]
    outputs[3].insert(50, Rec(3, base + 50_000, event("ghost"), [(ID_HEADER, b"ghost")]))
    assert dict(dead[-1].headers)[DLQ_PARTITION] == b"3"
    dead.pop()

    produce_records(kafka, f"{name}-in", inputs, transactional=False)
    produce_records(kafka, f"{name}-out", [o for p in outputs.values() for o in p])
    produce_records(kafka, f"{name}-dlq", dead)

    summary = reconcile.run(spark, job(name, kafka, tmp_path))

    parts = {p["partition"]: p for p in summary["partitions"]}
    assert sorted(parts) == list(range(PARTITIONS))
    planted = {
        0: {"duplicates": 3},
        1: {"missing": 4},
        2: {"orderViolations": 2},
        3: {"unexpected": 1, "missingDeadLetters": 1},
    }
    failing = ("duplicates", "missing", "missingDeadLetters", "unexpected", "orderViolations")
    for p, counts in parts.items():
        assert {k: counts[k] for k in failing} == {k: planted[p].get(k, 0) for k in failing}, p
        assert counts["input"] == 200 + 20 + 3 + 1
        assert counts["valid"] == 221 and counts["distinct"] == 200
        assert counts["inputDuplicateRate"] == pytest.approx(21 / 221, abs=1e-6)
        assert counts["deadLettered"] == (2 if p == 3 else 3)
        assert counts["deadLetteredByReason"] == {"not_json": counts["deadLettered"]}
    assert parts[0]["published"] == 201 + 3
    assert summary["passed"] is False
    assert summary["totals"]["duplicates"] == 3 and summary["totals"]["missing"] == 4

    report = Path(summary["report"])
    assert json.loads((report / "summary.json").read_text())["runId"] == summary["runId"]
    findings = pq.read_table(report / "findings").to_pylist()
    assert sum(1 for f in findings if f["kind"] == "missing") == 4
    assert {f["id"] for f in findings if f["kind"] == "missing"} == {
        "p1-7",
        "p1-8",
        "p1-9",
        "p1-0",
    }
    assert [f["id"] for f in findings if f["kind"] == "unexpected"] == ["ghost"]


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

    summary = reconcile.run(
        spark,
        job(
            name,
            kafka,
            tmp_path,
            window_ms=24 * HOUR,
            audit_range=AuditRange(int(time.time() * 1000) - HOUR, int(time.time() * 1000) + HOUR),
            consumer_group=cfg.group,
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

    summary = reconcile.run(spark, job(name, kafka, tmp_path))

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
    strict = reconcile.run(spark, job(name, kafka, tmp_path, audit_range=rng))
    assert strict["passed"] is False and strict["unverifiable"] == "fail"
    assert strict["totals"]["unverifiable"] == 4 and strict["totals"]["missing"] == 0
    assert strict["totals"]["input"] == 6
    findings = pq.read_table(Path(strict["report"]) / "findings").to_pylist()
    assert [(f["kind"], f["offset"], f["detail"]) for f in findings] == [
        ("unverifiable", 0, "input offsets 0-3 deleted by retention")
    ]
    lenient = reconcile.run(
        spark,
        job(name, kafka, tmp_path, audit_range=rng, fail_on_unverifiable=False),
    )
    assert lenient["passed"] is True and lenient["totals"]["unverifiable"] == 4


def run_cli(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("dedup-reconcile")
    return subprocess.run(
        [str(exe), "--log-format", "text", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


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
    # Everything published once, id-7 twice (partition 1).
    published = [Rec(i % 2, now + i, event(mid)) for i, mid in enumerate(ids)]
    produce_records(kafka, f"{name}-out", [*published, published[7]])

    result = run_cli(
        *("--pipeline", name, "--namespace", kube_namespace.name),
        *("--bootstrap-servers", kafka.bootstrap),
        *("--input-topic", f"{name}-in", "--output-topic", f"{name}-out"),
        *("--dead-letter-topic", f"{name}-dlq", "--window", "1h", "--lookback", "1h"),
        *("--to", datetime.fromtimestamp(now / 1000 + 3600, UTC).isoformat()),
        *("--all-input", "--report-dir", str(tmp_path / "report"), "--configmap"),
        *("--kubeconfig", str(kube_namespace.kubeconfig_path), "--master", "local[2]"),
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "audit FAILED" in result.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["totals"]["duplicates"] == 1 and summary["totals"]["input"] == 100
    assert [p["duplicates"] for p in summary["partitions"]] == [0, 1]

    core = CoreV1Api(kube_namespace.cluster.api_client)
    cm = core.read_namespaced_config_map(f"{name}-reconciliation", kube_namespace.name)
    assert json.loads(cm.data["summary.json"])["runId"] == summary["runId"]
    assert cm.metadata.labels["dedup.io/pipeline"] == name


def test_an_unreachable_broker_ends_in_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli(
        *("--pipeline", "p", "--bootstrap-servers", "127.0.0.1:1"),
        *("--input-topic", "i", "--output-topic", "o", "--window", "1h"),
        *("--report-dir", str(tmp_path)),
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
        *("--report-dir", str(tmp_path)),
    )
    assert result.returncode == 2
    assert "bad arguments: not a duration: 'soon'" in result.stderr
    assert "Traceback" not in result.stderr
