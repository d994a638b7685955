"""A real local SparkSession reads a topic with Spark's Kafka source (batch), read
committed, and sees exactly what was committed: count, keys, values and headers. And
the session settings the jobs rely on hold in it (placement keys, the V2 reader, lean
Python workers), and the content digest the audit compares records by."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from dedup_contract.ids import ID_HEADER
from dedup_local.kafka import KafkaBroker
from dedup_spark.placement import slot_keys, spark_hash_int
from dedup_spark.source import KafkaSource, content_digest, read_topic
from support.kafka_fixtures import NewTopic

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]


def test_spark_reads_exactly_the_committed_records(
    spark: SparkSession, kafka: KafkaBroker, new_topic: NewTopic
) -> None:
    topic = new_topic(partitions=3)
    committed = {
        f"id-{i}": (f"key-{i}".encode(), f'{{"id": "id-{i}", "n": {i}}}'.encode())
        for i in range(300)
    }
    producer = Producer(
        kafka.client_config(**{"transactional.id": f"spark-smoke-{uuid.uuid4().hex}"})
    )
    producer.init_transactions(30)
    # An aborted transaction in the middle, so the committed records have gaps to skip.
    items = list(committed.items())
    for chunk, commit in ((items[:150], True), (items[:100], False), (items[150:], True)):
        producer.begin_transaction()
        for i, (mid, (key, value)) in enumerate(chunk):
            headers = [("id", mid.encode()), ("source", b"aborted" if not commit else b"smoke")]
            producer.produce(topic, key=key, value=value, headers=headers, partition=i % 3)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)

    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .load()
    )
    assert df.count() == len(committed)

    rows = df.selectExpr("key", "value", "headers", "partition").collect()
    assert {r["partition"] for r in rows} == {0, 1, 2}
    seen: dict[str, tuple[bytes, bytes]] = {}
    for r in rows:
        got = {h["key"]: bytes(h["value"]) for h in r["headers"]}
        assert got["source"] == b"smoke"
        mid = got["id"].decode()
        assert mid not in seen, f"{mid} read twice"
        seen[mid] = (bytes(r["key"]), bytes(r["value"]))
    assert seen == committed

    # And a grouped query over the same source: each id once.
    dupes = (
        df.selectExpr("CAST(key AS STRING) AS k").groupBy("k").count().where("count > 1").count()
    )
    assert dupes == 0


def test_placement_keys_land_in_their_tasks(spark: SparkSession) -> None:
    values = [*range(-50, 500), 2**31 - 1, -(2**31)]
    rows = spark.createDataFrame([(v,) for v in values], "k INT").selectExpr("k", "hash(k) AS h")
    assert {r["k"]: r["h"] for r in rows.collect()} == {v: spark_hash_int(v) for v in values}
    for slots in (1, 3, 8, 37):
        keys = slot_keys(slots)
        placed = (
            spark.createDataFrame([(k,) for k in keys], "k INT")
            .repartition(slots, "k")
            .rdd.glom()
            .map(lambda rows: [r["k"] for r in rows])
            .collect()
        )
        assert placed == [[k] for k in keys]


def test_jobs_read_kafka_through_the_v2_reader_with_lean_python_workers(
    spark: SparkSession, kafka: KafkaBroker, new_topic: NewTopic
) -> None:
    topic = new_topic(partitions=1)
    plan = read_topic(spark, KafkaSource(kafka.bootstrap), topic)._jdf.queryExecution()
    assert "BatchScan" in plan.executedPlan().toString()

    def importers(_: object) -> object:
        import sys
        import zipimport

        cache = sys.path_importer_cache.items()
        yield [p for p, f in cache if isinstance(f, zipimport.zipimporter)]

    # Spark's zips and jar are neither on the workers' path nor among their importers.
    assert spark.sparkContext.parallelize([0], 1).mapPartitions(importers).collect() == [[]]


def test_content_digest_matches_a_faithful_publication_and_sees_every_change(
    spark: SparkSession, kafka: KafkaBroker, new_topic: NewTopic
) -> None:
    """The JVM's content digest over records read from real topics: an output record that
    publishes its input faithfully (the worker's `dedup.id` header appended last) digests
    like it, with or without other headers; a changed key, value or header, an id header
    that is not the last, or a moved boundary between key and value does not."""
    inputs, outputs = new_topic(partitions=1), new_topic(partitions=1)
    v, t1 = b'{"messageId": "a"}', ("t", b"1")
    ident = (ID_HEADER, b"a")
    input_records = [  # key, value, headers
        (None, v, None),
        (b"k", v, [t1]),
        (b"k", b"v", None),
    ]
    output_records = [
        (None, v, [ident]),  # 0: faithful to input 0
        (b"k", v, [t1, ident]),  # 1: faithful to input 1
        (b"k", b"w", [t1, ident]),  # 2: value changed
        (b"j", v, [t1, ident]),  # 3: key changed
        (b"k", v, [("t", b"2"), ident]),  # 4: header value changed
        (b"k", v, [ident, t1]),  # 5: the id header not last
        (b"kv", b"", None),  # 6: the boundary moved (input 2 is k / v)
        (b"k", v, [t1]),  # 7: no id header at all: digests as it is
    ]
    producer = Producer(kafka.client_config())
    for topic, records in ((inputs, input_records), (outputs, output_records)):
        for key, value, headers in records:
            producer.produce(topic, key=key, value=value, headers=headers, partition=0)
    assert producer.flush(30) == 0

    def digests(topic: str, published: bool) -> list[int]:
        frame = read_topic(spark, KafkaSource(kafka.bootstrap), topic)
        rows = frame.select("offset", content_digest(published=published).alias("d")).collect()
        return [r["d"] for r in sorted(rows, key=lambda r: r["offset"])]

    ins, outs = digests(inputs, False), digests(outputs, True)
    assert outs[0] == ins[0] and outs[1] == ins[1]
    assert outs[7] == ins[1]
    changed = [outs[i] for i in (2, 3, 4, 5)]
    assert ins[1] not in changed and len(set(changed)) == len(changed)
    assert outs[6] != ins[2]
    assert len({ins[0], ins[1], ins[2]}) == 3
    # read as input (nothing left out), a publication keeps its id header in the digest
    assert digests(outputs, False)[1] != ins[1]
