"""Start-up recovery: make the store agree with the output topic, the source of truth.

The store is written only after a Kafka commit, so it can lag the output topic (a crash
between commit and store write) but never lead it. Reading the output partition from the
store's applied output offset to its end re-applies whatever it missed; an empty or lost
store is rebuilt the same way over the window. Every output record carries its id in the
`ID_HEADER` header, so no payload is parsed here.

Under ownership a full rebuild reads **every** output partition over the window and keeps
the ids this worker owns: ids published on another partition are there only if the
pipeline ran without ownership before (its producers then decided the partition), and
they must not be published again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dedup_contract import ownership
from dedup_contract.ids import ID_HEADER, id_key
from dedup_contract.store import Store

log = logging.getLogger(__name__)

CATCH_UP_BATCH = 20_000


@dataclass(frozen=True)
class CatchUp:
    from_offset: int
    next_offset: int
    ids: int
    records_without_id: int
    seconds: float
    rebuilt: bool


def start_offset(
    store: Store,
    consumer: Consumer,
    tp: TopicPartition,
    rebuild_from_ms: int | None,
    low: int,
    end: int,
) -> tuple[int, bool]:
    """Where to start reading the output partition (whose first and last stable offsets
    are `low` and `end`), and whether this is a full rebuild."""
    applied = store.output_next_offset
    if applied is not None:
        return applied, False
    if rebuild_from_ms is None:
        # The explicit first offset, not OFFSET_BEGINNING: librdkafka resolves a logical
        # offset with a reset round that delayed the first fetch by about a second.
        return low, True
    found = consumer.offsets_for_times(
        [TopicPartition(tp.topic, tp.partition, rebuild_from_ms)], timeout=30
    )
    offset = found[0].offset
    if offset < 0:  # nothing that recent: the window holds no published id
        return end, True
    return int(offset), True


def nothing_to_read(first: int, end: int) -> bool:
    """Whether the output partition holds no record at or after `first`, given its end.

    Only this worker writes the output partition, and every transaction ends with one
    marker offset: the store's applied offset sits just before the marker of the last
    applied transaction. A later committed or aborted transaction would put at least one
    data offset and one marker past it, so an end at most one past `first` means nothing
    was missed; skipping the read saves a fetch round (about half a second) per start.
    """
    return end <= first + 1


def catch_up(
    store: Store,
    consumer: Consumer,
    topic: str,
    partition: int,
    rebuild_from_ms: int | None,
    workers: int | None = None,
) -> CatchUp:
    """Read the output partition (read_committed) to its end into the store; under
    ownership (`workers`), a full rebuild first reads the other output partitions for
    the ids this worker owns.

    `consumer` must have `enable.partition.eof` on and no assignment; it is left unassigned.
    """
    started = time.monotonic()
    tp = TopicPartition(topic, partition)
    low, end = consumer.get_watermark_offsets(tp, timeout=30)  # read_committed: last stable
    first, rebuilt = start_offset(store, consumer, tp, rebuild_from_ms, int(low), int(end))
    owned_elsewhere = 0
    if rebuilt and workers is not None:
        owned_elsewhere = owned_from_other_partitions(
            store, consumer, topic, partition, workers, rebuild_from_ms
        )
    log.info(
        "catch-up from output topic",
        extra={"topic": topic, "partition": partition, "from_offset": first, "rebuild": rebuilt},
    )
    if nothing_to_read(first, int(end)):
        result = CatchUp(first, first, owned_elsewhere, 0, time.monotonic() - started, rebuilt)
        log.info("catch-up done: output has nothing past the store", extra={"offset": first})
        return result
    consumer.assign([TopicPartition(topic, partition, first)])
    applied = 0
    without_id = 0
    next_offset = first
    last_report = started
    try:
        done = False
        while not done:
            keys: list[bytes] = []
            newest_ms = 0
            for msg in consumer.consume(CATCH_UP_BATCH, 0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        next_offset = max(next_offset, int(msg.offset()))
                        continue
                    raise KafkaException(err)
                next_offset = int(msg.offset()) + 1
                message_id = _id_header(msg.headers())
                if message_id is None:
                    without_id += 1
                    continue
                keys.append(id_key(message_id))
                newest_ms = max(newest_ms, int(msg.timestamp()[1]))
            recorded = store.output_next_offset
            if keys or next_offset != (first if recorded is None else recorded):
                store.record_batch(
                    keys, newest_ms, input_next_offset=None, output_next_offset=next_offset
                )
                applied += len(keys)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log.info("catch-up progress", extra={"ids": applied, "offset": next_offset})
    finally:
        consumer.unassign()
    if without_id:
        log.warning(
            "output records without an id header were skipped; something other than this "
            "worker writes to the output topic",
            extra={"count": without_id, "header": ID_HEADER},
        )
    result = CatchUp(
        first,
        next_offset,
        applied + owned_elsewhere,
        without_id,
        time.monotonic() - started,
        rebuilt,
    )
    log.info(
        "catch-up done",
        extra={
            "ids": result.ids,
            "from_offset": result.from_offset,
            "next_offset": result.next_offset,
            "seconds": round(result.seconds, 3),
            "rebuild": rebuilt,
        },
    )
    return result


def owned_from_other_partitions(
    store: Store,
    consumer: Consumer,
    topic: str,
    partition: int,
    workers: int,
    rebuild_from_ms: int | None,
) -> int:
    """Add to the store the ids this worker owns that were published on the other
    output partitions within the window; how many. The store's output offset (its own
    partition's) is not touched, so a crash here repeats the rebuild. Each partition is
    read up to its end as looked up first: what the other workers publish meanwhile is
    theirs (under ownership no other worker publishes an id this one owns), and chasing
    their output while they run made a start take seconds more."""
    metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise KafkaException(metadata.error if metadata is not None else KafkaError._UNKNOWN_TOPIC)
    others = [p for p in sorted(metadata.partitions) if p != partition]
    starts: list[TopicPartition] = []
    ends: dict[int, int] = {}
    for other in others:
        tp = TopicPartition(topic, other)
        low, end = consumer.get_watermark_offsets(tp, timeout=30)
        first = int(low)
        if rebuild_from_ms is not None:
            found = consumer.offsets_for_times(
                [TopicPartition(topic, other, rebuild_from_ms)], timeout=30
            )[0].offset
            first = int(end) if found < 0 else int(found)
        if first < int(end):
            starts.append(TopicPartition(topic, other, first))
            ends[other] = int(end)
    if not starts:
        return 0
    consumer.assign(starts)
    open_partitions = {tp.partition for tp in starts}
    kept = 0
    try:
        while open_partitions:
            keys: list[bytes] = []
            newest_ms = 0
            for msg in consumer.consume(CATCH_UP_BATCH, 0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(msg.partition())
                        continue
                    raise KafkaException(err)
                at = int(msg.offset())
                if at + 1 >= ends[msg.partition()]:  # the end looked up first: done
                    open_partitions.discard(msg.partition())
                    if at >= ends[msg.partition()]:
                        continue
                message_id = _id_header(msg.headers())
                if message_id is None or ownership.owner(message_id, workers) != partition:
                    continue
                keys.append(id_key(message_id))
                newest_ms = max(newest_ms, int(msg.timestamp()[1]))
            if keys:
                store.record_batch(keys, newest_ms, input_next_offset=None, output_next_offset=None)
                kept += len(keys)
    finally:
        consumer.unassign()
    log.info(
        "rebuild: ids this worker owns read from the other output partitions",
        extra={"topic": topic, "partitions": others, "ids": kept},
    )
    return kept


def _id_header(headers: list[tuple[str, bytes | None]] | None) -> str | None:
    for name, value in headers or ():
        if name == ID_HEADER and value is not None:
            return value.decode("utf-8", errors="surrogateescape")
    return None
