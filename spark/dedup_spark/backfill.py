"""`dedup-backfill`: the worker's deduplication in batch, and warm stores for new partitions.

`dedup-backfill run` replays history, the records of an input topic (per-partition offset
ranges, or all) or of Parquet files, deduplicated with the semantics of the workers under
ownership (`by_owner`):

* each valid record goes to the worker that owns its id (`dedup_contract.ownership`),
  whatever its input partition; a record without a valid id stays with the worker that
  reads its partition (`partition % workers`);
* each worker's records are met as a worker meets its sources: every input partition's
  in offset order, the partitions interleaved by timestamp;
* they are cut into batches of `--batch-size` (default 1), each decided as the worker
  decides one (`dedup_contract.batch.triage`, imported), against the worker's own window
  (`dedup_contract.window.WindowState`); a published record goes to output partition
  `owner(id)` with the `dedup.id` header, so each id is published once overall (per
  window), by its owner.

The backfill and the workers publish the same set of ids, each on its owner's partition,
but not always the same occurrence of an id seen on two partitions, nor always the same
decision near a window's expiry (tests/integration/test_backfill.py compares the sets).
Output: a topic (each partition in one Kafka transaction) or Parquet (`--output-dir`).
`dedup-backfill warm-store` writes the ids an output partition published within the
window into a fresh store through `dedup_contract.store.Store`, so a worker started on it
recovers nothing. Formats, the differences from running workers, `--commit-input-offsets`:
docs/audit.md, "Backfill". Exit codes: 0 done, 2 could not run (one log line says why).
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from dedup_contract.batch import Headers, Record, dead_letter_headers, triage
from dedup_contract.ids import ID_HEADER, ID_SOURCES, IdSpec, InvalidRecord, extract_id, id_key
from dedup_contract.logs import configure
from dedup_contract.names import default_consumer_group
from dedup_contract.ownership import owner
from dedup_contract.store import Store, StoreConfig, StoreError, StoreOwner
from dedup_contract.window import WindowPolicy, WindowState
from dedup_spark.source import KafkaSource, SourceError, parse_settings, read_topic, with_header

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("dedup_spark.backfill")

EXIT_OK: Final = 0
EXIT_ERROR: Final = 2
WARM_BATCH: Final = 50_000


class BackfillError(Exception):
    """The backfill cannot run as asked; the message is for a person."""


# --- the pure rule ---------------------------------------------------------------------


class SourceRecord(NamedTuple):
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    partition: int = 0  # of the input


class Published(NamedTuple):
    record: SourceRecord
    message_id: str

    def headers(self) -> Headers:
        """The output record's headers: the input's, then the id (as the worker writes)."""
        return [*(self.record.headers or ()), (ID_HEADER, self.message_id.encode())]


class Rejected(NamedTuple):
    record: SourceRecord
    reason: str
    detail: str


def first_occurrences(
    records: Iterable[SourceRecord],
    spec: IdSpec,
    window: WindowPolicy | None,
    *,
    batch_size: int = 1,
    generations: int = StoreConfig.generations,
) -> tuple[list[Published], list[Rejected]]:
    """One worker's records, in the order it meets them -> what it publishes, and its
    dead letters (module docstring). `window` None: ids never expire."""
    if batch_size < 1:
        raise ValueError(f"the batch size must be at least 1, not {batch_size}")
    published: list[Published] = []
    rejected: list[Rejected] = []
    held: set[bytes] | WindowState = set() if window is None else WindowState(window, generations)
    now_ms = 0
    batch: list[Record] = []
    sources: dict[
        int, SourceRecord
    ] = {}  # by place in the stream (offsets repeat across partitions)

    def decide() -> None:
        nonlocal now_ms
        split = triage(batch, spec)
        for dead in split.dead_letters:
            rejected.append(Rejected(sources[dead.record.offset()], dead.reason, dead.detail))
        new = [c for c in split.firsts if c.key not in held]
        published.extend(Published(sources[c.record.offset()], c.message_id) for c in new)
        now_ms = max(now_ms, split.newest_ms)  # the worker's window clock
        keys = [c.key for c in new]
        if isinstance(held, WindowState):
            held.record(keys, now_ms)
            held.expire(now_ms)
        else:
            held.update(keys)
        batch.clear()
        sources.clear()

    for n, rec in enumerate(records):
        batch.append(Record(n, rec.key, rec.value, rec.headers, rec.timestamp_ms))
        sources[n] = rec
        if len(batch) >= batch_size:
            decide()
    if batch:
        decide()
    return published, rejected


def owner_of(rec: SourceRecord, spec: IdSpec, workers: int) -> int:
    """The worker that decides a record: its id's owner, or, without a valid id, the
    worker that reads its input partition (it dead-letters it)."""
    try:
        message_id = extract_id(spec, rec.key, rec.value, rec.headers)
    except InvalidRecord:
        return rec.partition % workers
    return owner(message_id, workers)


def met_order(records: Iterable[SourceRecord]) -> list[SourceRecord]:
    """Records of several input partitions in an order a worker may meet them: each
    partition in offset order, partitions interleaved by timestamp (ties: partition)."""
    runs: dict[int, list[SourceRecord]] = {}
    for rec in records:
        runs.setdefault(rec.partition, []).append(rec)
    ordered = [sorted(run, key=lambda r: r.offset) for _, run in sorted(runs.items())]
    return list(heapq.merge(*ordered, key=lambda r: (r.timestamp_ms, r.partition)))


def by_owner(
    records: Iterable[SourceRecord],
    spec: IdSpec,
    window: WindowPolicy | None,
    *,
    workers: int,
    batch_size: int = 1,
    generations: int = StoreConfig.generations,
) -> dict[int, tuple[list[Published], list[Rejected]]]:
    """Records of any input partitions -> per worker, what it publishes (to output
    partition `worker`) and its dead letters (module docstring)."""
    if workers < 1:
        raise ValueError(f"workers must be positive, not {workers}")
    mine: dict[int, list[SourceRecord]] = {}
    for rec in records:
        mine.setdefault(owner_of(rec, spec, workers), []).append(rec)
    return {
        w: first_occurrences(
            met_order(recs), spec, window, batch_size=batch_size, generations=generations
        )
        for w, recs in sorted(mine.items())
    }


# --- the job -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BackfillJob:
    kafka: KafkaSource | None
    input_topic: str | None
    input_files: str | None
    offsets: Mapping[int, tuple[int, int]] | None
    id_spec: IdSpec
    window: WindowPolicy | None
    output_topic: str | None
    dead_letter_topic: str | None
    output_dir: str | None
    origin_topic: str  # named in dead letters' origin header
    run_id: str
    batch_size: int = 1
    workers: int | None = None  # the pipeline's spec.partitions (required to run)


RESULT_SCHEMA: Final = "partition INT, published BIGINT, dead_letters BIGINT, last_offset BIGINT"
"""Per input partition of a worker's group: how many of its records the worker published
and dead-lettered, and its last offset there (summed, and maximised, over workers)."""


def records_frame(spark: SparkSession, job: BackfillJob) -> DataFrame:
    if job.input_files:
        frame = spark.read.parquet(job.input_files)
        return frame.select("partition", "offset", "timestamp_ms", "key", "value", "headers")
    assert job.kafka is not None and job.input_topic is not None
    return read_topic(spark, job.kafka, job.input_topic, offsets=job.offsets)


def run(spark: SparkSession, job: BackfillJob) -> dict[int, dict[str, int]]:
    """Deduplicate per owner in Spark and write the result; counts per input partition."""
    if job.workers is None or job.workers < 1:
        raise BackfillError(
            "--workers is required: the pipeline's spec.partitions, which decides each id's owner"
        )
    frame = with_owner(records_frame(spark, job), job.id_spec, job.workers)
    if job.output_dir:
        return _to_files(frame, job)
    return _to_topic(frame, job)


def with_owner(records: DataFrame, spec: IdSpec, workers: int) -> DataFrame:
    """`records` plus `owner`: the worker that decides each (`owner_of`)."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    schema = StructType([*records.schema.fields, StructField("owner", IntegerType())])

    def owners_of(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            recs = _source_records(pa.Table.from_batches([batch]))
            column = pa.array([owner_of(r, spec, workers) for r in recs], pa.int32())
            yield batch.append_column("owner", column)

    return records.mapInArrow(owners_of, schema)


def _source_records(table: pa.Table) -> list[SourceRecord]:
    headers = [
        None if hs is None else [(h["key"], h["value"]) for h in hs]
        for hs in table.column("headers").to_pylist()
    ]
    return list(
        map(
            SourceRecord._make,
            zip(
                table.column("offset").to_pylist(),
                table.column("timestamp_ms").to_pylist(),
                table.column("key").to_pylist(),
                table.column("value").to_pylist(),
                headers,
                table.column("partition").to_pylist(),
                strict=True,
            ),
        )
    )


def _owner_records(table: pa.Table) -> tuple[int, list[SourceRecord]]:
    """One worker's group: its number, and its records in the order it meets them."""
    return int(table.column("owner")[0].as_py()), met_order(_source_records(table))


def _result_rows(
    records: Sequence[SourceRecord], published: Sequence[Published], rejected: Sequence[Rejected]
) -> list[dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for rec in records:
        row = rows.setdefault(
            rec.partition,
            {"partition": rec.partition, "published": 0, "dead_letters": 0, "last_offset": -1},
        )
        row["last_offset"] = max(row["last_offset"], rec.offset)
    for item in published:
        rows[item.record.partition]["published"] += 1
    for dead in rejected:
        rows[dead.record.partition]["dead_letters"] += 1
    return [rows[p] for p in sorted(rows)]


def _summed(rows: Iterable[Any], *, offsets: bool = True) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for r in rows:
        entry = out.setdefault(
            int(r["partition"]),
            {"published": 0, "deadLetters": 0, **({"lastOffset": -1} if offsets else {})},
        )
        entry["published"] += int(r["published"])
        entry["deadLetters"] += int(r["dead_letters"])
        if offsets:
            entry["lastOffset"] = max(entry["lastOffset"], int(r["last_offset"]))
    return out


def _to_topic(frame: DataFrame, job: BackfillJob) -> dict[int, dict[str, int]]:
    assert job.kafka is not None and job.output_topic is not None and job.workers is not None
    settings = {
        "bootstrap.servers": job.kafka.bootstrap_servers,
        **job.kafka.settings,
        "linger.ms": 20,
        "transaction.timeout.ms": 600_000,
    }
    spec, window, run_id, size = job.id_spec, job.window, job.run_id, job.batch_size
    output, dead_topic, origin = job.output_topic, job.dead_letter_topic, job.origin_topic

    def publish(table: pa.Table) -> pa.Table:
        import pyarrow as pa
        from confluent_kafka import Producer

        worker, records = _owner_records(table)
        published, rejected = first_occurrences(records, spec, window, batch_size=size)
        if rejected and not dead_topic:
            raise BackfillError(
                f"worker {worker}: {len(rejected)} records without a valid id and no "
                "--dead-letter-topic"
            )
        producer = Producer({**settings, "transactional.id": f"dedup-backfill/{run_id}/w{worker}"})
        producer.init_transactions(60)
        producer.begin_transaction()
        for item in published:
            _produce(producer, output, item.record, item.headers(), worker)
        for dead in rejected:
            headers = dead_letter_headers(
                dead.record.headers,
                dead.reason,
                dead.detail,
                origin,
                dead.record.partition,
                dead.record.offset,
            )
            _produce(producer, dead_topic or "", dead.record, headers, None)
        producer.commit_transaction(120)
        return pa.Table.from_pylist(
            _result_rows(records, published, rejected),
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("published", pa.int64()),
                    ("dead_letters", pa.int64()),
                    ("last_offset", pa.int64()),
                ]
            ),
        )

    rows = frame.groupBy("owner").applyInArrow(publish, RESULT_SCHEMA).collect()
    return _summed(rows)


def _produce(
    producer: Any, topic: str, record: SourceRecord, headers: Headers, partition: int | None
) -> None:
    extra = {} if partition is None else {"partition": partition}
    while True:
        try:
            producer.produce(
                topic,
                record.value,
                record.key,
                timestamp=record.timestamp_ms,
                headers=headers,
                **extra,
            )
            return
        except BufferError:
            producer.poll(0.1)


OUTPUT_SCHEMA: Final = (
    "kind STRING, partition INT, offset BIGINT, timestamp_ms BIGINT, key BINARY, value BINARY, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, id STRING, reason STRING, "
    "source_partition INT"
)
"""`partition`: the output partition (the owner) of a published record, the input
partition of a dead letter; `offset` and `source_partition`: where the record was read."""


def _to_files(frame: DataFrame, job: BackfillJob) -> dict[int, dict[str, int]]:
    spec, window, origin, size = job.id_spec, job.window, job.origin_topic, job.batch_size

    def dedup(table: pa.Table) -> pa.Table:
        import pyarrow as pa

        worker, records = _owner_records(table)
        published, rejected = first_occurrences(records, spec, window, batch_size=size)
        rows: list[dict[str, Any]] = []
        for item in published:
            rows.append(_row("published", worker, item.record, item.headers(), item.message_id))
        for dead in rejected:
            headers = dead_letter_headers(
                dead.record.headers,
                dead.reason,
                dead.detail,
                origin,
                dead.record.partition,
                dead.record.offset,
            )
            rows.append(
                _row("dead_letter", dead.record.partition, dead.record, headers, None, dead.reason)
            )
        return pa.Table.from_pylist(rows, schema=_output_arrow_schema())

    result = frame.groupBy("owner").applyInArrow(dedup, OUTPUT_SCHEMA).cache()
    try:
        out = (job.output_dir or "").rstrip("/")
        published = result.where("kind = 'published'").drop("kind", "reason")
        published.orderBy("partition", "timestamp_ms", "source_partition", "offset").write.mode(
            "overwrite"
        ).parquet(f"{out}/published")
        dead = result.where("kind = 'dead_letter'").drop("kind", "id")
        dead.orderBy("partition", "offset").write.mode("overwrite").parquet(f"{out}/dead_letters")
        counts = result.groupBy("source_partition", "kind").count().collect()
    finally:
        result.unpersist()
    summary: dict[int, dict[str, int]] = {}  # per input partition, as `run` to a topic
    for row in counts:
        entry = summary.setdefault(int(row["source_partition"]), {"published": 0, "deadLetters": 0})
        entry["published" if row["kind"] == "published" else "deadLetters"] = int(row["count"])
    return summary


def _row(
    kind: str,
    partition: int,
    record: SourceRecord,
    headers: Headers,
    message_id: str | None,
    reason: str | None = None,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "partition": partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": record.key,
        "value": record.value,
        "headers": [{"key": k, "value": v} for k, v in headers],
        "id": message_id,
        "reason": reason,
        "source_partition": record.partition,
    }


def _output_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [
            ("kind", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp_ms", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("headers", pa.list_(header)),
            ("id", pa.string()),
            ("reason", pa.string()),
            ("source_partition", pa.int32()),
        ]
    )


def commit_input_offsets(
    kafka: KafkaSource, topic: str, group: str, next_offsets: Mapping[int, int]
) -> None:
    """Set `group`'s committed offsets on `topic` (the worker resumes there)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            **kafka.settings,
            "group.id": group,
            "enable.auto.commit": False,
            "logger": logging.getLogger("librdkafka"),
        }
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in sorted(next_offsets.items())],
            asynchronous=False,
        )
    finally:
        consumer.close()


# --- warm stores ------------------------------------------------------------------------


def output_end(kafka: KafkaSource, topic: str, partition: int) -> int:
    """The output partition's last stable offset (what a read_committed reader reaches)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            **kafka.settings,
            "group.id": f"dedup-backfill-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "logger": logging.getLogger("librdkafka"),
        }
    )
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    finally:
        consumer.close()
    return int(end)


def warm_store(
    spark: SparkSession,
    kafka: KafkaSource,
    output_topic: str,
    partition: int,
    store_path: Path,
    owner: StoreOwner,
    window: WindowPolicy,
    now_ms: int | None = None,
) -> int:
    """Write the window's published ids of one output partition into a fresh store.
    Returns how many ids it holds."""
    if store_path.exists() and any(store_path.iterdir()):
        raise BackfillError(f"{store_path} is not empty: a warm store starts fresh")
    end = output_end(kafka, output_topic, partition)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    since = None if window.duration_ms is None else now_ms - window.duration_ms
    ids = with_header(
        read_topic(spark, kafka, output_topic, offsets={partition: (0, end)}), ID_HEADER, "id"
    ).where("id IS NOT NULL")
    if since is not None:
        ids = ids.where(f"timestamp_ms >= {since}")
    rows = ids.select("offset", "timestamp_ms", "id").orderBy("offset").toLocalIterator()
    with Store.open(store_path, owner, window) as store:
        for chunk in _chunks(rows, WARM_BATCH):
            newest = max(int(r["timestamp_ms"]) for r in chunk)
            store.record_batch(
                [id_key(r["id"]) for r in chunk],
                newest,
                input_next_offset=None,
                output_next_offset=None,
            )
        # The output offset last: a worker resumes its catch-up there and finds nothing.
        store.record_batch([], now_ms, input_next_offset=None, output_next_offset=end)
        store.flush()
        return store.key_count


def _chunks(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# --- command line -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dedup-backfill",
        description="The worker's deduplication in batch over history, and warm stores.",
        epilog="Exit codes: 0 done, 2 could not run. Kafka client settings: --kafka-config "
        "or env DEDUP_KAFKA_CONFIG (key=value,...).",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", default="json", choices=["json", "text"])
    p.add_argument("--master", default="local[2]", help="local[N], k8s, or k8s://https://...")
    p.add_argument("--image", help="executor image (--master k8s)")
    p.add_argument("--executors", type=int, default=2)
    sub = p.add_subparsers(dest="command", required=True)

    run_p = sub.add_parser("run", help="deduplicate a topic's range or files")
    run_p.add_argument("--bootstrap-servers")
    run_p.add_argument("--kafka-config", default="")
    source = run_p.add_mutually_exclusive_group(required=True)
    source.add_argument("--input-topic")
    source.add_argument("--input-files", help="Parquet directory (see the module docstring)")
    run_p.add_argument("--offsets", help="P:START-END[,P:START-END] of --input-topic")
    run_p.add_argument(
        "--workers",
        type=int,
        help="the pipeline's worker count (spec.partitions): each id is published once, by "
        "its owner murmur2(id) %% workers, to that output partition (required)",
    )
    run_p.add_argument("--id-source", default="jsonField", choices=list(ID_SOURCES))
    run_p.add_argument("--id-field", default="messageId")
    run_p.add_argument("--window", help="the pipeline's window duration (none: never expire)")
    run_p.add_argument("--window-max-keys", type=int, help="the pipeline's window.maxKeys")
    run_p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="records per decision, as the worker's batches (see the module docstring)",
    )
    target = run_p.add_mutually_exclusive_group(required=True)
    target.add_argument("--output-topic")
    target.add_argument("--output-dir", help="Parquet directory")
    run_p.add_argument("--dead-letter-topic")
    run_p.add_argument("--origin-topic", help="input topic named in dead letters (files)")
    run_p.add_argument(
        "--commit-input-offsets",
        metavar="PIPELINE",
        help="set PIPELINE's consumer group to the end of the replayed range",
    )

    warm = sub.add_parser("warm-store", help="a fresh store from an output partition")
    warm.add_argument("--bootstrap-servers", required=True)
    warm.add_argument("--kafka-config", default="")
    warm.add_argument("--output-topic", required=True)
    warm.add_argument("--partition", type=int, required=True)
    warm.add_argument("--store-path", required=True)
    warm.add_argument("--pipeline", required=True)
    warm.add_argument("--namespace", default="default")
    warm.add_argument("--window", help="window duration")
    warm.add_argument("--window-max-keys", type=int)
    return p


def _kafka(args: argparse.Namespace) -> KafkaSource | None:
    if not args.bootstrap_servers:
        return None
    return KafkaSource(args.bootstrap_servers, parse_settings(args.kafka_config))


def job_from_args(args: argparse.Namespace) -> BackfillJob:
    from dedup_spark.audit_job import parse_offsets

    kafka = _kafka(args)
    if args.input_topic and kafka is None:
        raise BackfillError("--input-topic needs --bootstrap-servers")
    if args.output_topic and kafka is None:
        raise BackfillError("--output-topic needs --bootstrap-servers")
    if args.offsets and not args.input_topic:
        raise BackfillError("--offsets goes with --input-topic")
    if args.batch_size < 1:
        raise BackfillError(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.workers is None or args.workers < 1:
        raise BackfillError(
            "--workers is required: the pipeline's spec.partitions, which decides each id's owner"
        )
    try:
        return BackfillJob(
            kafka=kafka,
            input_topic=args.input_topic,
            input_files=args.input_files,
            offsets=parse_offsets(args.offsets) if args.offsets else None,
            id_spec=IdSpec(args.id_source, args.id_field),
            window=WindowPolicy.from_spec(args.window, args.window_max_keys)
            if args.window or args.window_max_keys
            else None,
            batch_size=args.batch_size,
            workers=args.workers,
            output_topic=args.output_topic,
            dead_letter_topic=args.dead_letter_topic,
            output_dir=args.output_dir,
            origin_topic=args.origin_topic or args.input_topic or "",
            run_id=uuid.uuid4().hex[:12],
        )
    except ValueError as exc:
        raise BackfillError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    from dedup_spark.session import SparkSettings, spark_session

    args = build_parser().parse_args(argv)
    configure(args.log_level, args.log_format)
    settings = SparkSettings(args.master, image=args.image, executors=args.executors)
    try:
        if args.command == "warm-store":
            kafka = _kafka(args)
            assert kafka is not None
            window = WindowPolicy.from_spec(args.window, args.window_max_keys)
            owner = StoreOwner(args.namespace, args.pipeline, args.partition)
            spark = spark_session("dedup-backfill-warm", settings)
            try:
                held = warm_store(
                    spark, kafka, args.output_topic, args.partition, Path(args.store_path), owner,
                    window,
                )  # fmt: skip
            finally:
                spark.stop()
            log.info("store warmed", extra={"ids": held, "store_path": args.store_path})
            return EXIT_OK
        job = job_from_args(args)
        spark = spark_session(f"dedup-backfill-{job.run_id}", settings)
        try:
            counts = run(spark, job)
        finally:
            spark.stop()
        if args.commit_input_offsets and job.kafka and job.input_topic:
            commit_input_offsets(
                job.kafka,
                job.input_topic,
                default_consumer_group(args.commit_input_offsets),
                {p: c["lastOffset"] + 1 for p, c in counts.items() if c["lastOffset"] >= 0},
            )
        log.info("backfill done", extra={"partitions": json.dumps(counts, sort_keys=True)})
        return EXIT_OK
    except (BackfillError, SourceError, StoreError, ValueError) as exc:
        log.error("backfill could not run: %s", exc, extra={"exit_code": EXIT_ERROR})
        return EXIT_ERROR
    except Exception as exc:  # Spark's and Kafka's errors carry long traces: one line
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:500]
        log.error("backfill could not run: %s", text, extra={"exit_code": EXIT_ERROR})
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
