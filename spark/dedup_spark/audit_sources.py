"""The audit's sources (`dedup-audit`, `audit_job.py`): what it learns of the topics
before it starts (`input_state`: partitions, the pipeline's committed offsets, what
retention left) and the topics read with Spark's Kafka source (read committed) into one
frame of packed rows per audit group (`source_frames`): the input and output by id, the
dead letters by the input partition they name, and the forwarded records waiting at
their owners on the internal topic."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from dedup_contract.batch import DLQ_OFFSET, DLQ_PARTITION, DLQ_REASON, DLQ_TOPIC
from dedup_spark import audit_model
from dedup_spark.audit_spec import AuditJob, JobError
from dedup_spark.source import grouped, grouped_ids, read_topic, with_header

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

METADATA_TIMEOUT_S: Final = 20
INPUT, OUTPUT, DEAD, FORWARDED = 0, 1, 2, 3
ID_HEADER_FORWARDED: Final = "dedup.id"
ORIGIN_HEADER: Final = "dedup.origin"
"""The headers a forwarder appends (last) to a record on the internal topic: the id, and
`<input partition>:<input offset>` of the occurrence it forwards."""


@dataclass(frozen=True)
class InputState:
    """What the audit learns of the topics before it starts: the input's partition count,
    the pipeline's committed offset per input partition (empty without a consumer
    group), per internal-topic partition (empty without `--owned-topic` or a group),
    and what retention left of each input and output partition (none listed: nothing
    deleted)."""

    partitions: int
    committed: dict[int, int] = field(default_factory=dict)
    retention: dict[int, audit_model.Retention] = field(default_factory=dict)
    committed_owned: dict[int, int] = field(default_factory=dict)

    def buckets(self, job: AuditJob) -> int:
        """How many id groups (tasks) the audit uses."""
        return max(1, job.workers, self.partitions)


def input_state(job: AuditJob) -> InputState:
    """Check that the topics exist; the input's partition count, and the pipeline's
    committed input offsets per partition (0 where none is committed; none without a
    consumer group)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": job.kafka.bootstrap_servers,
            **job.kafka.settings,
            "group.id": job.consumer_group or f"dedup-reconcile-{job.run_id}",
            "enable.auto.commit": False,
            "logger": logging.getLogger("librdkafka"),
        }
    )
    topics = [
        job.input_topic,
        job.output_topic,
        *filter(None, [job.dead_letter_topic, job.owned_topic]),
    ]
    try:
        meta = consumer.list_topics(timeout=METADATA_TIMEOUT_S)
        absent = [t for t in topics if t not in meta.topics or meta.topics[t].error is not None]
        if absent:
            raise JobError(
                f"topic(s) {', '.join(absent)} not found at {job.kafka.bootstrap_servers}"
            )
        partitions = sorted(meta.topics[job.input_topic].partitions)
        outputs = sorted(meta.topics[job.output_topic].partitions)
        if len(outputs) < job.workers:
            raise JobError(
                f"output topic {job.output_topic} has {len(outputs)} partition(s), fewer "
                f"than the {job.workers} workers that publish to it"
            )
        retention = _retention(consumer, job, partitions, outputs)
        if job.consumer_group is None:
            return InputState(len(partitions), retention=retention)
        wanted = [TopicPartition(job.input_topic, p) for p in partitions]
        got = consumer.committed(wanted, timeout=METADATA_TIMEOUT_S)
        owned: dict[int, int] = {}
        if job.owned_topic:
            internal = sorted(meta.topics[job.owned_topic].partitions)
            for tp in consumer.committed(
                [TopicPartition(job.owned_topic, q) for q in internal], timeout=METADATA_TIMEOUT_S
            ):
                owned[tp.partition] = max(0, tp.offset)
    except KafkaException as exc:
        raise JobError(f"Kafka at {job.kafka.bootstrap_servers}: {exc.args[0]}") from None
    finally:
        consumer.close()
    return InputState(
        len(partitions), {tp.partition: max(0, tp.offset) for tp in got}, retention, owned
    )


def _retention(
    consumer: Any, job: AuditJob, partitions: Sequence[int], outputs: Sequence[int]
) -> dict[int, audit_model.Retention]:
    """Per partition number whose input or output partition lost records to retention
    (log start offset above 0): the log start offsets and the timestamps of the oldest
    retained records."""
    from confluent_kafka import TopicPartition

    out: dict[int, audit_model.Retention] = {}
    for p in sorted(set(partitions) | set(outputs)):
        starts: dict[str, tuple[int, int | None]] = {
            job.input_topic: (0, None),
            job.output_topic: (0, None),
        }
        for topic, present in ((job.input_topic, partitions), (job.output_topic, outputs)):
            if p not in present:
                continue
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=METADATA_TIMEOUT_S
            )
            first = _first_record_ms(job, topic, p, low, high) if low > 0 else None
            starts[topic] = (max(0, low), first)
        (in_start, in_first), (out_start, out_first) = (
            starts[job.input_topic],
            starts[job.output_topic],
        )
        if in_start or out_start:
            out[p] = audit_model.Retention(in_start, in_first, out_start, out_first)
    return out


def _first_record_ms(job: AuditJob, topic: str, partition: int, low: int, high: int) -> int | None:
    """The timestamp of the oldest committed record still in a partition (None: none)."""
    from confluent_kafka import Consumer, TopicPartition

    if high <= low:
        return None
    consumer = Consumer(
        {
            "bootstrap.servers": job.kafka.bootstrap_servers,
            **job.kafka.settings,
            "group.id": f"dedup-reconcile-{job.run_id}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "logger": logging.getLogger("librdkafka"),
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, low)])
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                return None  # the end: nothing committed is retained
            return int(msg.timestamp()[1])
        raise JobError(f"no record of {topic}[{partition}] read in {METADATA_TIMEOUT_S} s")
    finally:
        consumer.close()


def source_frames(spark: SparkSession, job: AuditJob, state: InputState) -> DataFrame:
    """Every topic's records packed per Arrow batch and audit group (source.GROUPED_SCHEMA)
    with their `kind` (INPUT, OUTPUT, DEAD, FORWARDED), in one frame: groups below
    `state.buckets(job)` are id buckets, the ones above an input partition each."""
    from pyspark.sql import functions as F

    since = job.read_since_ms
    offsets = job.audit_range.offsets
    buckets = state.buckets(job)
    # Each topic's records packed per Arrow batch and audit group (source.grouped_ids),
    # so Spark moves a few hundred binary rows to the audit tasks, not a row per record.
    inputs = grouped_ids(
        read_topic(spark, job.kafka, job.input_topic, since_ms=since, offsets=offsets),
        job.id_spec,
        buckets,
    ).withColumn("kind", F.lit(INPUT))
    outputs = grouped_ids(
        read_topic(spark, job.kafka, job.output_topic, since_ms=since),
        job.id_spec,
        buckets,
        published=True,
    ).withColumn("kind", F.lit(OUTPUT))
    frames = [inputs, outputs]
    if job.dead_letter_topic:
        dead = read_topic(spark, job.kafka, job.dead_letter_topic, since_ms=since)
        for name, column in (
            (DLQ_TOPIC, "origin_topic"),
            (DLQ_PARTITION, "origin_partition"),
            (DLQ_OFFSET, "origin_offset"),
            (DLQ_REASON, "reason"),
        ):
            dead = with_header(dead, name, column)
        # Dead letters naming no partition and offset of this input are not its.
        origin = dead.select(
            F.col("origin_partition").try_cast("int").alias("partition"),
            F.col("origin_offset").try_cast("long").alias("origin_offset"),
            "timestamp_ms",
            "reason",
            "origin_topic",
        ).where(
            (F.col("origin_topic") == F.lit(job.input_topic))
            & F.col("partition").isNotNull()
            & F.col("origin_offset").isNotNull()
        )
        frames.append(
            grouped(origin.drop("origin_topic"), _PartitionGroup(buckets)).withColumn(
                "kind", F.lit(DEAD)
            )
        )
    if job.owned_topic and job.consumer_group is not None and state.committed_owned:
        frames.append(
            grouped(forwarded_frame(spark, job, state), _IdGroup(buckets)).withColumn(
                "kind", F.lit(FORWARDED)
            )
        )
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def forwarded_frame(spark: SparkSession, job: AuditJob, state: InputState) -> DataFrame:
    """The internal topic's records at or above the group's committed offset of their
    partition (forwarded, not yet consumed by their owner), as (id, origin_partition,
    origin_offset) from their `dedup.id` and `dedup.origin` headers."""
    from pyspark.sql import functions as F

    assert job.owned_topic is not None
    starting = {p: (o if o > 0 else -2) for p, o in state.committed_owned.items()}
    records = read_topic(spark, job.kafka, job.owned_topic, starting=starting)
    records = with_header(records, ID_HEADER_FORWARDED, "id")
    records = with_header(records, ORIGIN_HEADER, "origin")
    parts = F.split(F.col("origin"), ":")
    return records.select(
        "id",
        F.element_at(parts, 1).try_cast("int").alias("origin_partition"),
        F.element_at(parts, 2).try_cast("long").alias("origin_offset"),
    ).where(
        F.col("id").isNotNull()
        & F.col("origin_partition").isNotNull()
        & F.col("origin_offset").isNotNull()
    )


@dataclass(frozen=True)
class _IdGroup:
    """The audit group of rows with an `id` (forwarded records)."""

    buckets: int

    def __call__(self, batch: pa.RecordBatch) -> Any:
        from dedup_spark.murmur2 import owners

        return owners(batch.column(batch.schema.get_field_index("id")), self.buckets)


@dataclass(frozen=True)
class _PartitionGroup:
    """The audit group of rows naming an input partition (dead letters)."""

    buckets: int

    def __call__(self, batch: pa.RecordBatch) -> Any:
        column = batch.column(batch.schema.get_field_index("partition"))
        return self.buckets + column.to_numpy(zero_copy_only=False)


def forwarded_schema() -> pa.Schema:
    """The packed rows of the internal topic's forwarded records (`forwarded_frame`)."""
    import pyarrow as pa

    return pa.schema(
        [("id", pa.string()), ("origin_partition", pa.int32()), ("origin_offset", pa.int64())]
    )


def dead_schema() -> pa.Schema:
    """The packed rows of the dead-letter topic."""
    import pyarrow as pa

    return pa.schema(
        [
            ("partition", pa.int32()),
            ("origin_offset", pa.int64()),
            ("timestamp_ms", pa.int64()),
            ("reason", pa.string()),
        ]
    )
