"""`dedup-backfill` against a real broker, a real local SparkSession and the real worker.

- The backfill's output for an input publishes the same ids as the workers' output for
  the same input (the same records, each on its owner's output partition under
  ownership), and the same dead letters; with one partition and one worker, record for
  record.
- A store warmed by the backfill makes a worker start with nothing to recover and still
  drop repeats of the warmed ids.
"""

from __future__ import annotations

import logging
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from dedup_contract.batch import DLQ_OFFSET, DLQ_REASON
from dedup_contract.ids import IdSpec
from dedup_contract.names import default_consumer_group
from dedup_contract.ownership import owner_reference
from dedup_contract.store import StoreOwner
from dedup_contract.window import WindowPolicy
from dedup_local.kafka import KafkaBroker
from dedup_spark import backfill
from dedup_spark.source import KafkaSource
from dedup_worker.loop import DedupWorker
from support.worker_helpers import (
    event,
    output_ids,
    produce,
    read_committed,
    run_until_consumed,
    unique,
    worker_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]

DAY_MS = 24 * 3_600_000


def job(kafka: KafkaBroker, source: str, target: str, **overrides: Any) -> backfill.BackfillJob:
    settings: dict[str, Any] = {
        "kafka": KafkaSource(kafka.bootstrap),
        "input_topic": source,
        "input_files": None,
        "offsets": None,
        "id_spec": IdSpec("jsonField", "messageId"),
        "window": WindowPolicy(DAY_MS),
        "output_topic": f"{target}-out",
        "dead_letter_topic": f"{target}-dlq",
        "output_dir": None,
        "origin_topic": source,
        "run_id": uuid.uuid4().hex[:8],
        "workers": 1,
    }
    settings.update(overrides)
    return backfill.BackfillJob(**settings)


def records(bootstrap: str, topic: str, partition: int) -> list[tuple[Any, ...]]:
    return [
        (m.key(), m.value(), m.headers(), m.timestamp()[1])
        for m in read_committed(bootstrap, topic, partition)
    ]


def dead_letters(bootstrap: str, topic: str, partitions: int) -> list[tuple[Any, ...]]:
    found = []
    for p in range(partitions):
        for m in read_committed(bootstrap, topic, p):
            h = dict(m.headers() or [])
            found.append(
                (int(h["dedup.origin.partition"]), int(h[DLQ_OFFSET]), h[DLQ_REASON], m.value())
            )
    return sorted(found)


def test_backfill_output_equals_the_workers(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    name = unique("bf")
    kafka.create_topic(f"{name}-in", 2)
    for target in ("worker", "backfill"):
        kafka.create_topic(f"{name}-{target}-out", 2)
        kafka.create_topic(f"{name}-{target}-dlq", 2)
    for p in range(2):
        ids = [f"p{p}-{i % 400}" for i in range(500)]  # 100 repeats
        values = [event(mid, n) for n, mid in enumerate(ids)]
        values[10:10] = [b"not json", b'{"messageId": 4.5}', b"[]"]
        produce(kafka.bootstrap, f"{name}-in", values, partition=p)

    for p in range(2):
        cfg = worker_config(
            kafka.bootstrap,
            tmp_path,
            name,
            partition=p,
            input_topic=f"{name}-in",
            output_topic=f"{name}-worker-out",
            dead_letter_topic=f"{name}-worker-dlq",
            store_path=tmp_path / f"store-{p}",
        )
        run_until_consumed(DedupWorker(cfg), 503)

    counts = backfill.run(spark, job(kafka, f"{name}-in", f"{name}-backfill", workers=2))
    assert counts == {p: {"published": 400, "deadLetters": 3, "lastOffset": 502} for p in range(2)}
    # The same ids (and records) published; the backfill's each on its owner's partition.
    theirs = sorted(r for p in range(2) for r in records(kafka.bootstrap, f"{name}-worker-out", p))
    ours = sorted(r for p in range(2) for r in records(kafka.bootstrap, f"{name}-backfill-out", p))
    assert len(ours) == 800 and ours == theirs
    ids = {p: output_ids(kafka.bootstrap, f"{name}-backfill-out", p) for p in range(2)}
    assert set(ids[0]) | set(ids[1]) == {
        mid for p in range(2) for mid in output_ids(kafka.bootstrap, f"{name}-worker-out", p)
    }
    assert all(owner_reference(mid.encode(), 2) == p for p in range(2) for mid in ids[p])
    assert dead_letters(kafka.bootstrap, f"{name}-backfill-dlq", 2) == dead_letters(
        kafka.bootstrap, f"{name}-worker-dlq", 2
    )

    # And to files: the same records, in Parquet.
    files = backfill.run(
        spark,
        job(
            kafka,
            f"{name}-in",
            "unused",
            output_topic=None,
            output_dir=str(tmp_path / "out"),
            workers=2,
        ),
    )
    assert files == {p: {"published": 400, "deadLetters": 3} for p in range(2)}
    rows = pq.read_table(tmp_path / "out" / "published").to_pylist()
    assert {r["id"] for r in rows} == set(ids[0]) | set(ids[1])
    assert all(r["partition"] == owner_reference(r["id"].encode(), 2) for r in rows)
    assert [r["id"] for r in rows if r["partition"] == 0] == ids[0]


def test_backfill_and_worker_agree_where_the_window_expires_inside_the_data(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A 10 s window and maxKeys 36 over 60 s of input (400 records, ids from a pool of
    50): ids expire by time (generations of 2.5 s, kept 10 to 12.5 s) and by count (the
    oldest generation dropped when more than 36 are held) many times inside the data.
    The worker decides per poll; with `batchSize: 1` on both sides the batches are the
    same, and the backfill (the worker's `window` rules, in memory) publishes exactly the
    worker's records, record for record."""
    name = unique("bfexp")
    kafka.create_topic(f"{name}-in", 1)
    for target in ("worker", "backfill"):
        kafka.create_topic(f"{name}-{target}-out", 1)
        kafka.create_topic(f"{name}-{target}-dlq", 1)
    rng = random.Random(18)
    base = int(time.time() * 1000) - 3_600_000
    stamps = [base + i * 150 for i in range(400)]  # 60 s
    ids = [f"id-{rng.randrange(50)}" for _ in stamps]
    produce(
        kafka.bootstrap,
        f"{name}-in",
        [event(mid, n) for n, mid in enumerate(ids)],
        timestamps=stamps,
    )
    window = WindowPolicy(10_000, 36)
    cfg = worker_config(
        kafka.bootstrap,
        tmp_path,
        name,
        input_topic=f"{name}-in",
        output_topic=f"{name}-worker-out",
        dead_letter_topic=f"{name}-worker-dlq",
        store_path=tmp_path / "store-exp",
        window=window,
        batch_size=1,
        linger_ms=200,
    )
    run_until_consumed(DedupWorker(cfg), len(ids), timeout_s=900)

    counts = backfill.run(
        spark, job(kafka, f"{name}-in", f"{name}-backfill", window=window, batch_size=1)
    )
    ours = records(kafka.bootstrap, f"{name}-backfill-out", 0)
    theirs = records(kafka.bootstrap, f"{name}-worker-out", 0)
    assert ours == theirs
    assert counts[0]["published"] == len(theirs)
    # Expiry happened inside the data, by time and by count: ids were published again,
    # and neither bound alone gives the same result.
    assert len(theirs) > len(set(ids))
    source = [
        backfill.SourceRecord(i, ts, None, event(mid, i), None)
        for i, (mid, ts) in enumerate(zip(ids, stamps, strict=True))
    ]
    spec = IdSpec("jsonField", "messageId")
    published_offsets = [
        p.record.offset for p in backfill.first_occurrences(source, spec, window)[0]
    ]
    for alone in (WindowPolicy(10_000), WindowPolicy(None, 36)):
        published, _ = backfill.first_occurrences(source, spec, alone)
        assert [p.record.offset for p in published] != published_offsets, alone


def test_a_store_warmed_by_backfill_starts_the_worker_warm(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique("warm")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    history = [f"old-{i}" for i in range(300)]
    produce(kafka.bootstrap, f"{name}-in", [event(mid) for mid in history])

    # History replayed into the pipeline's output topic, the pipeline's input position
    # set after it, and a warm store from the output.
    cfg = worker_config(kafka.bootstrap, tmp_path, name, store_path=tmp_path / "warm-store")
    counts = backfill.run(spark, job(kafka, cfg.input_topic, name))
    assert counts[0]["published"] == 300
    backfill.commit_input_offsets(
        KafkaSource(kafka.bootstrap), cfg.input_topic, cfg.group, {0: counts[0]["lastOffset"] + 1}
    )
    held = backfill.warm_store(
        spark,
        KafkaSource(kafka.bootstrap),
        cfg.output_topic,
        0,
        cfg.store_path,
        StoreOwner(cfg.namespace, cfg.pipeline, 0),
        cfg.window,
    )
    assert held == 300
    assert cfg.group == default_consumer_group(name)

    # Live input: 100 new ids, and 50 repeats of history the window must drop.
    live = [f"new-{i}" for i in range(100)] + history[:50]
    produce(kafka.bootstrap, cfg.input_topic, [event(mid) for mid in live])
    with caplog.at_level(logging.INFO, logger="dedup_worker.loop"):
        run_until_consumed(DedupWorker(cfg), len(live))
    ready = [r for r in caplog.records if r.getMessage() == "worker ready"]
    assert ready and ready[0].recovered_ids == 0
    assert ready[0].store_keys == 300
    assert output_ids(kafka.bootstrap, cfg.output_topic) == history + live[:100]


def test_warm_store_refuses_a_used_directory(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "CURRENT").write_text("x")
    with pytest.raises(backfill.BackfillError, match="not empty"):
        backfill.warm_store(
            spark,
            KafkaSource(kafka.bootstrap),
            "any",
            0,
            tmp_path / "used",
            StoreOwner("default", "p", 0),
            WindowPolicy(duration_ms=DAY_MS),
        )


def test_the_command_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("dedup-backfill")
    result = subprocess.run(
        [str(exe), "--log-format", "text", "run", "--input-topic", "a", "--output-topic", "b"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "backfill could not run: --input-topic needs --bootstrap-servers" in result.stderr
    assert "Traceback" not in result.stderr
    result = subprocess.run(
        [
            *(str(exe), "--log-format", "text", "run", "--bootstrap-servers", "127.0.0.1:1"),
            *("--input-topic", "a", "--output-topic", "b"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "backfill could not run: --workers is required" in result.stderr
    assert "Traceback" not in result.stderr
