"""Reading a pipeline's topics in Spark, and the worker's id rules applied to them.

`read_topic` is Spark's Kafka source in batch mode as every job here uses it: read
committed (aborted transactions and markers are skipped), headers included, and a
short `kafkaConsumer.pollTimeoutMs` (Spark's default of 120 s is what a batch of only
transaction markers can wait). `with_ids` adds the id and the dead-letter reason of each
record by calling `dedup_contract.ids.extract_id` in a `mapInArrow` UDF: the worker's own
rules, imported, never re-implemented in SQL; and a digest of the record's key, value and
headers (`content_digest`, computed by the JVM as it reads), so the audit compares an
output record's contents with its input occurrence's without moving the values. `packed_ids` does the same and packs the
rows per partition and Arrow batch, for jobs that take a partition's rows together.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from dedup_contract.ids import (
    ID_HEADER,
    IdSpec,
    InvalidRecord,
    extract_id,
    plain_field,
    plain_json_id,
    plain_json_ids,
)
from dedup_contract.kafka_settings import KafkaSettingsError, parse_kafka_settings

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

POLL_TIMEOUT_MS: Final = 10_000
"""How long one Kafka poll may wait (Spark's default is 120 s)."""

RECORD_COLUMNS: Final = ("partition", "offset", "timestamp_ms", "key", "value", "headers")

FETCH_DEFAULTS: Final = {
    # Bigger fetches than the Java client's defaults (500 records, 1 MiB per partition):
    # a batch audit reads whole partitions; measured 1.5x faster reads
    # (bench/HISTORY.md, "Reconciliation audit").
    # And a short fetch.max.wait.ms (default 500 ms): with the default, Spark's read tasks
    # sat idle ~650 of ~770 ms each (task CPU time against run time); 10 ms read the same
    # 1M records 2.4x faster.
    "fetch.max.wait.ms": "10",
    "max.poll.records": "20000",
    "max.partition.fetch.bytes": str(16 << 20),
    "fetch.max.bytes": str(64 << 20),
    "receive.buffer.bytes": str(4 << 20),
}

# librdkafka setting names that differ in the Java client Spark uses.
_JAVA_NAMES: Final = {"sasl.mechanisms": "sasl.mechanism"}
_LIBRDKAFKA_ONLY: Final = frozenset({"sasl.username", "sasl.password"})


class SourceError(Exception):
    """The topics cannot be read as configured (a message for a person)."""


@dataclass(frozen=True)
class KafkaSource:
    """Where the topics are: bootstrap servers and the client settings (librdkafka names,
    the worker's `DEDUP_KAFKA_CONFIG`), translated for the Java client."""

    bootstrap_servers: str
    settings: Mapping[str, str] = field(default_factory=dict)

    def spark_options(self) -> dict[str, str]:
        """`kafka.*` options for Spark's Kafka source and sink (`FETCH_DEFAULTS` unless
        the settings say otherwise)."""
        options = {"kafka." + name: value for name, value in FETCH_DEFAULTS.items()}
        options["kafka.bootstrap.servers"] = self.bootstrap_servers
        username = self.settings.get("sasl.username")
        password = self.settings.get("sasl.password")
        for name, value in self.settings.items():
            if name in _LIBRDKAFKA_ONLY:
                continue
            options["kafka." + _JAVA_NAMES.get(name, name)] = value
        if username is not None and password is not None:
            mechanism = self.settings.get("sasl.mechanisms", "PLAIN").upper()
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            options["kafka.sasl.jaas.config"] = (
                f'{module} required username="{_jaas_quote(username)}" '
                f'password="{_jaas_quote(password)}";'
            )
        return options


def _jaas_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def parse_settings(text: str) -> dict[str, str]:
    """`key=value[,key=value]`, the worker's `--kafka-config` format, read by the one
    parser (`dedup_contract.kafka_settings`); a malformed entry is a SourceError."""
    try:
        return parse_kafka_settings(text)
    except KafkaSettingsError as exc:
        raise SourceError(str(exc)) from None


def read_topic(
    spark: SparkSession,
    kafka: KafkaSource,
    topic: str,
    *,
    since_ms: int | None = None,
    offsets: Mapping[int, tuple[int, int]] | None = None,
    starting: Mapping[int, int] | None = None,
) -> DataFrame:
    """The committed records of `topic` as (partition, offset, timestamp_ms, key, value,
    headers), from `since_ms` (record timestamp; partitions with nothing that recent
    contribute nothing), from the per-partition offsets in `starting` (every partition
    named; -2: the earliest), or from the earliest offset, to the last stable offset; or
    exactly the per-partition `[start, end)` offset ranges in `offsets`."""
    reader = spark.read.format("kafka").options(**kafka.spark_options())
    reader = (
        reader.option("subscribe", topic)
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("kafkaConsumer.pollTimeoutMs", str(POLL_TIMEOUT_MS))
        .option("failOnDataLoss", "false")
    )
    if offsets is not None:
        reader = reader.option(
            "startingOffsets", _offsets_json(topic, {p: s for p, (s, _) in offsets.items()})
        ).option("endingOffsets", _offsets_json(topic, {p: e for p, (_, e) in offsets.items()}))
    elif starting is not None:
        reader = reader.option("startingOffsets", _offsets_json(topic, starting)).option(
            "endingOffsets", "latest"
        )
    elif since_ms is not None:
        reader = (
            reader.option("startingTimestamp", str(max(0, since_ms)))
            .option("startingOffsetsByTimestampStrategy", "latest")
            .option("endingOffsets", "latest")
        )
    else:
        reader = reader.option("startingOffsets", "earliest").option("endingOffsets", "latest")
    return reader.load().selectExpr(
        "partition",
        "offset",
        "unix_millis(timestamp) AS timestamp_ms",
        "key",
        "value",
        "headers",
    )


def _offsets_json(topic: str, per_partition: Mapping[int, int]) -> str:
    import json

    return json.dumps({topic: {str(p): o for p, o in sorted(per_partition.items())}})


IDS_SCHEMA: Final = (
    "partition INT, offset BIGINT, timestamp_ms BIGINT, id STRING, reason STRING, digest BIGINT"
)


def ids_schema() -> pa.Schema:
    """IDS_SCHEMA in Arrow."""
    import pyarrow as pa

    return pa.schema(
        [
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp_ms", pa.int64()),
            ("id", pa.string()),
            ("reason", pa.string()),
            ("digest", pa.int64()),
        ]
    )


def content_digest(*, published: bool = False) -> Column:
    """64 bits of Spark's `xxhash64` over a record's key, value and headers, in that
    order, computed by the JVM as it reads (no per-record Python work). `published`:
    records of an output topic, whose last header, when it is the worker's `dedup.id`,
    is left out, so a faithful publication digests like its input occurrence.

    Each column's hash seeds the next, so where one part ends counts (`kv` + `` is not
    `k` + `v`); a null part and an absent or empty header list leave the running hash
    as it is (a record without headers and its output, whose only header was the id,
    digest alike). Tested against real records in tests/integration/test_spark_smoke.py.
    """
    from pyspark.sql import functions as F

    headers = F.col("headers")
    if published:
        last_is_id = F.try_element_at(headers, F.lit(-1))["key"] == F.lit(ID_HEADER)
        headers = F.when(
            F.coalesce(last_is_id, F.lit(False)), F.slice(headers, 1, F.size(headers) - 1)
        ).otherwise(headers)
    return F.xxhash64(F.col("key"), F.col("value"), headers)


def with_ids(records: DataFrame, spec: IdSpec, *, published: bool = False) -> DataFrame:
    """(partition, offset, timestamp_ms, id, reason, digest) per record: `id` under the
    pipeline's rules, or null with the dead-letter `reason` code the worker would give;
    `digest` of its contents (`published`: records of an output topic, whose last
    `dedup.id` header, the worker's addition, is left out)."""

    def extract(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from (extract_ids(batch, spec) for batch in batches)

    return _id_inputs(records, spec, published).mapInArrow(extract, IDS_SCHEMA)


def _id_inputs(records: DataFrame, spec: IdSpec, published: bool) -> DataFrame:
    """The columns `extract_ids` reads: the record's place, what the id rules read (the
    value, the key or the headers), and the content digest (computed by the JVM)."""
    wanted = ["partition", "offset", "timestamp_ms"]
    wanted += ["headers"] if spec.source == "header" else ["key"] if spec.source == "key" else []
    wanted += ["value"] if spec.source == "jsonField" else []
    return records.select(*wanted, content_digest(published=published).alias("digest"))


PACKED_SCHEMA: Final = "partition INT, rows BINARY"
"""A packed frame: per Arrow batch of a task and partition in it, one row whose `rows` is
that partition's rows of the batch as an Arrow IPC stream (`unpack`)."""


def packed_ids(records: DataFrame, spec: IdSpec, *, published: bool = False) -> DataFrame:
    """`with_ids`, packed (PACKED_SCHEMA). For a job that needs a partition's records
    together in one Python function: Spark then moves a few hundred binary rows instead
    of a row per record through the shuffle, its sort and the conversions between
    Arrow and its own rows (~7% of a 1M record audit's CPU,
    bench/HISTORY.md, "Reconciliation audit")."""

    def extract(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from pack_batch(extract_ids(batch, spec))

    return _id_inputs(records, spec, published).mapInArrow(extract, PACKED_SCHEMA)


GROUPED_SCHEMA: Final = "group INT, rows BINARY"
"""A grouped frame: per Arrow batch of a task and group in it, one row whose `rows` is
that group's rows of the batch as an Arrow IPC stream (`unpack`)."""


def id_groups(batch: pa.RecordBatch, buckets: int, *, published: bool = False) -> Any:
    """The audit group of each row of a batch with `id` and `partition` columns: rows
    with an id go to bucket `owner(id)` under `buckets` (the audit's own murmur2), so
    every record of an id lands in one group whatever its partition; input rows without
    one go to group `buckets + partition` (checked against the dead letters of their
    partition), output rows without one to group 0."""
    import numpy as np

    from dedup_spark.murmur2 import owners

    ids = batch.column(batch.schema.get_field_index("id"))
    bucket = owners(ids, buckets)
    if not ids.null_count:
        return bucket
    valid = np.asarray(ids.is_valid())
    if published:
        return np.where(valid, bucket, 0)
    partition = batch.column(batch.schema.get_field_index("partition"))
    return np.where(valid, bucket, buckets + partition.to_numpy(zero_copy_only=False))


def grouped_ids(
    records: DataFrame, spec: IdSpec, buckets: int, *, published: bool = False
) -> DataFrame:
    """`with_ids`, packed per audit group (`id_groups`, GROUPED_SCHEMA)."""

    def extract(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = extract_ids(batch, spec)
            yield from pack_groups(rows, id_groups(rows, buckets, published=published))

    return _id_inputs(records, spec, published).mapInArrow(extract, GROUPED_SCHEMA)


def grouped(frame: DataFrame, group: Any) -> DataFrame:
    """Any frame packed per group (GROUPED_SCHEMA); `group(batch)` gives each row's."""

    def pack(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from pack_groups(batch, group(batch))

    return frame.mapInArrow(pack, GROUPED_SCHEMA)


def pack_groups(batch: pa.RecordBatch, groups: Any) -> Iterator[pa.RecordBatch]:
    """(group, rows) for each group of `batch` (`groups`: an int per row)."""
    import numpy as np
    import pyarrow as pa

    if batch.num_rows == 0:
        return
    groups = np.asarray(groups, dtype=np.int64)
    order = np.argsort(groups, kind="stable")
    ordered = groups[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.concatenate([starts[1:], [len(ordered)]])
    if len(starts) > 1:
        batch = batch.take(pa.array(order))  # one copy, then zero-copy slices per group
    for start, end in zip(starts, ends, strict=True):
        g = ordered[start]
        part = batch.slice(int(start), int(end - start))
        yield pa.RecordBatch.from_arrays(
            [pa.array([int(g)], pa.int32()), pa.array([ipc_bytes(part)], pa.binary())],
            names=["group", "rows"],
        )


def ipc_bytes(rows: pa.RecordBatch | pa.Table) -> bytes:
    """`rows` as one Arrow IPC stream (what `unpack` reads)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write(rows)
    return bytes(sink.getvalue())


def packed(frame: DataFrame) -> DataFrame:
    """Any frame with an INT `partition` column, packed (PACKED_SCHEMA)."""

    def pack(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from pack_batch(batch)

    return frame.mapInArrow(pack, PACKED_SCHEMA)


def pack_batch(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """(partition, rows) for each partition in `batch` (null partitions included)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return
    partitions = batch.column(batch.schema.get_field_index("partition"))
    unique = pc.unique(partitions)
    for partition in unique.to_pylist():
        if len(unique) == 1:  # a Kafka read task's batches: one partition
            part = batch
        elif partition is None:
            part = batch.filter(pc.is_null(partitions))
        else:
            part = batch.filter(pc.equal(partitions, partition))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_batch(part)
        data = sink.getvalue()
        offsets = pa.array([0, data.size], pa.int32()).buffers()[1]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([partition], pa.int32()),
                pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data]),  # no copy
            ],
            names=["partition", "rows"],
        )


def unpack(rows: pa.Array | pa.ChunkedArray, schema: pa.Schema) -> pa.Table:
    """The rows packed in the `rows` values given, as one table (`schema` when empty)."""
    import pyarrow as pa

    values = rows.combine_chunks() if isinstance(rows, pa.ChunkedArray) else rows
    tables = [pa.ipc.open_stream(values[i].as_buffer()).read_all() for i in range(len(values))]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def extract_ids(batch: pa.RecordBatch, spec: IdSpec) -> pa.RecordBatch:
    """One Arrow batch of Kafka rows (`_id_inputs`: place, what the id rules read, digest)
    -> the same rows' ids and dead-letter reasons, digest passed on (runs in executors).

    A top-level JSON field's plain ids are decided for the whole batch at once
    (`plain_json_ids`, as the worker's triage does), or, when any record defers, in one
    call per record (`plain_json_id`: 1.3 us per record against `extract_id`'s 1.8, and the
    id rules are the audit's largest cost: bench/HISTORY.md, "After issue 18: the stricter
    audit"); the rest take `extract_id`, which also names the reason."""
    import pyarrow as pa

    names = batch.schema.names
    size = batch.num_rows

    def column(name: str) -> list[Any]:
        return batch.column(names.index(name)).to_pylist() if name in names else [None] * size

    values = column("value")
    field = plain_field(spec)
    ids: list[str | None]
    if field is None:
        ids = [None] * size
    else:
        plain = plain_json_ids(field, values)
        ids = [plain_json_id(field, v) for v in values] if plain is None else list(plain)
    reasons: list[str | None] = [None] * size
    undecided = [i for i, found in enumerate(ids) if found is None]
    if undecided:
        keys = column("key")
        headers = column("headers")
        for i in undecided:
            hs = headers[i]
            try:
                ids[i] = extract_id(
                    spec,
                    keys[i],
                    values[i],
                    None if hs is None else [(h["key"], h["value"]) for h in hs],
                )
            except InvalidRecord as invalid:
                reasons[i] = invalid.reason
    return pa.RecordBatch.from_arrays(
        [
            batch.column(names.index("partition")),
            batch.column(names.index("offset")),
            batch.column(names.index("timestamp_ms")),
            pa.array(ids, pa.string()),
            pa.array(reasons, pa.string()),
            batch.column(names.index("digest")),
        ],
        schema=ids_schema(),
    )


def with_header(records: DataFrame, name: str, column: str) -> DataFrame:
    """`records` plus `column`: the UTF-8 text of the last header called `name` (or null)."""
    from pyspark.sql import functions as F

    matching = F.filter("headers", lambda h: h["key"] == F.lit(name))
    return records.withColumn(
        column,
        F.when(F.size(matching) > 0, F.element_at(matching, -1)["value"].cast("string")),
    )
