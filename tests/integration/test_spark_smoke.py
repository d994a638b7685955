"""A real local SparkSession reads a topic with Spark's Kafka source (batch), read
committed, and sees exactly what was committed: count, keys, values and headers."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from dedup_local.kafka import KafkaBroker
from support.kafka_fixtures import NewTopic

pytestmark = pytest.mark.integration


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
