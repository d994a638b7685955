"""The real Kafka broker does what the worker's exactly-once contract relies on.

Transactions on one broker: aborted records never reach a read_committed reader,
committed ones do, an open transaction stays invisible until it commits, and consumer
offsets sent inside a transaction commit or abort with it. Also: a broker that is killed
and restarted keeps what was committed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from dedup_local.kafka import KafkaBroker
from support.kafka_fixtures import NewTopic

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]


def txn_producer(kafka: KafkaBroker, **extra: Any) -> Producer:
    producer = Producer(
        kafka.client_config(
            **{
                "transactional.id": f"smoke-{uuid.uuid4().hex}",
                "enable.idempotence": True,
                "linger.ms": 5,
                **extra,
            }
        )
    )
    producer.init_transactions(30)
    return producer


@contextmanager
def consumer(kafka: KafkaBroker, **extra: Any) -> Iterator[Consumer]:
    c = Consumer(
        kafka.client_config(
            **{
                "group.id": f"smoke-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **extra,
            }
        )
    )
    try:
        yield c
    finally:
        c.close()


def read_all(
    c: Consumer, topic: str, partitions: list[int], expect: int, timeout_s: float = 30
) -> list[Message]:
    """Assign from the beginning and poll until `expect` records came (then 0.5 s more)."""
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    quiet_until: float | None = None
    while time.monotonic() < deadline:
        msg = c.poll(0.1)
        if msg is not None and msg.error() is None:
            out.append(msg)
        if len(out) >= expect:
            quiet_until = quiet_until or time.monotonic() + 0.5
            if time.monotonic() > quiet_until:
                break
    return out


def values(msgs: list[Message]) -> list[bytes]:
    return [m.value() for m in msgs]


def test_produce_and_read_committed_roundtrip(kafka: KafkaBroker, new_topic: NewTopic) -> None:
    topic = new_topic(partitions=3)
    records = [(f"k{i}".encode(), f"v{i}".encode(), [("id", f"m{i}".encode())]) for i in range(30)]
    kafka.produce(topic, records[:20])
    kafka.produce(topic, records[20:], partition=2)

    got = kafka.read_committed(topic)
    assert sorted(values(got)) == sorted(v for _, v, _ in records)
    for m in got:
        i = int(m.value()[1:])
        assert m.key() == f"k{i}".encode()
        assert m.headers() == [("id", f"m{i}".encode())]
    # Per partition, in offset order; one partition alone.
    assert [(m.partition(), m.offset()) for m in got] == sorted(
        (m.partition(), m.offset()) for m in got
    )
    only2 = kafka.read_committed(topic, partition=2)
    assert {m.partition() for m in only2} == {2}
    assert {f"v{i}".encode() for i in range(20, 30)} <= set(values(only2))


def test_aborted_is_invisible_committed_is_visible(kafka: KafkaBroker, new_topic: NewTopic) -> None:
    topic = new_topic(partitions=2)
    producer = txn_producer(kafka)

    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=b"a", value=f"aborted-{i}".encode(), partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)

    producer.begin_transaction()
    for i in range(40):
        producer.produce(topic, key=b"c", value=f"committed-{i}".encode(), partition=i % 2)
    producer.commit_transaction(30)

    # Still open: written to the log, but past the last stable offset.
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key=b"o", value=f"open-{i}".encode(), partition=i % 2)
    producer.flush(30)

    expected = sorted(f"committed-{i}".encode() for i in range(40))
    # The open transaction never settles: give the committed one's markers 2 s, not 10.
    assert sorted(values(kafka.read_committed(topic, settle_s=2))) == expected

    # The aborted and open records are really in the log: read_uncommitted sees them.
    with consumer(kafka, **{"isolation.level": "read_uncommitted"}) as c:
        raw = values(read_all(c, topic, [0, 1], expect=100))
    assert sum(v.startswith(b"aborted-") for v in raw) == 50
    assert sum(v.startswith(b"open-") for v in raw) == 10

    producer.commit_transaction(30)
    after = values(kafka.read_committed(topic))
    assert sorted(after) == sorted(expected + [f"open-{i}".encode() for i in range(10)])
    assert not any(v.startswith(b"aborted-") for v in after)


def test_send_offsets_to_transaction(kafka: KafkaBroker, new_topic: NewTopic) -> None:
    """Consume-transform-produce: the input offsets commit and abort with the output."""
    src = new_topic(partitions=1, prefix="smoke-src")
    dst = new_topic(partitions=1, prefix="smoke-dst")
    kafka.produce(src, [(None, f"r{i}".encode(), None) for i in range(100)])
    group = f"smoke-group-{uuid.uuid4().hex[:8]}"
    producer = txn_producer(kafka)

    def process_batch(c: Consumer, n: int, commit: bool) -> None:
        batch: list[Message] = []
        while len(batch) < n:
            batch.extend(m for m in c.consume(n - len(batch), timeout=1) if m.error() is None)
        producer.begin_transaction()
        for m in batch:
            producer.produce(dst, value=m.value().upper())
        producer.send_offsets_to_transaction(
            c.position(c.assignment()), c.consumer_group_metadata(), 30
        )
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    def committed(c: Consumer) -> int:
        (tp,) = c.committed([TopicPartition(src, 0)], timeout=30)
        return int(tp.offset)

    with consumer(kafka, **{"group.id": group, "isolation.level": "read_committed"}) as c:
        c.subscribe([src])
        process_batch(c, 60, commit=True)
        assert committed(c) == 60
        process_batch(c, 40, commit=False)
        assert committed(c) == 60  # aborted with its transaction

    assert values(kafka.read_committed(dst)) == [f"R{i}".encode() for i in range(60)]

    # A new member of the group resumes from the committed offset, not the aborted one.
    with consumer(kafka, **{"group.id": group, "isolation.level": "read_committed"}) as c:
        c.subscribe([src])
        process_batch(c, 40, commit=True)
        assert committed(c) == 100
    assert values(kafka.read_committed(dst)) == [f"R{i}".encode() for i in range(100)]


def test_zombie_producer_is_fenced(kafka: KafkaBroker, new_topic: NewTopic) -> None:
    """init_transactions() with the same transactional.id fences the older producer."""
    topic = new_topic()
    txn_id = f"smoke-zombie-{uuid.uuid4().hex}"
    old = txn_producer(kafka, **{"transactional.id": txn_id})
    old.begin_transaction()
    old.produce(topic, value=b"zombie")
    old.flush(30)
    new = txn_producer(kafka, **{"transactional.id": txn_id})  # aborts old's open txn
    new.begin_transaction()
    new.produce(topic, value=b"fresh")
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as info:
        old.produce(topic, value=b"zombie-2")
        old.commit_transaction(30)
    err = info.value.args[0]
    assert isinstance(err, KafkaError)
    assert err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)
    assert values(kafka.read_committed(topic)) == [b"fresh"]


def test_killed_broker_restarts_with_committed_data(
    kafka_broker_factory: Callable[..., KafkaBroker],
) -> None:
    broker = kafka_broker_factory()
    port = broker.port
    broker.create_topic("chaos", 2)
    producer = txn_producer(broker)
    producer.begin_transaction()
    for i in range(100):
        producer.produce("chaos", value=f"c{i}".encode(), partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce("chaos", value=b"left-open", partition=0)
    producer.flush(30)
    del producer

    broker.kill()
    assert not broker.is_running()
    broker.start()
    assert broker.port == port

    got = values(broker.read_committed("chaos", timeout_s=60))
    assert sorted(got) == sorted(f"c{i}".encode() for i in range(100))
    # The broker still takes new transactions after the crash.
    producer = txn_producer(broker)
    producer.begin_transaction()
    producer.produce("chaos", value=b"after", partition=1)
    producer.commit_transaction(30)
    assert b"after" in values(broker.read_committed("chaos", partition=1))
