"""What one worker reads: its input consumer, the sources assigned to it (topic,
partition), where each resumes, the input partitions that appear later, and the lag.

A `SourceReader` owns the input consumer (made by `open`, read_committed, offsets never
auto-committed: the transactions commit them) and the list of sources it and the internal
topic's consumer (internal_topic.py) are assigned. A source resumes at the offset the
worker's last committed transaction recorded, or, with none, at its log start. Under
ownership the reader finds the input partitions equal to the worker's number modulo the
number of workers, and looks again every DISCOVER_EVERY_S for partitions the input topic
has grown (each read from its start: nothing produced before it was noticed is skipped).

The worker (`loop.py`) polls through it and tells it what to rewind; nothing here reads
the store or produces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from dedup_contract.broker_logs import STATISTICS_INTERVAL_MS, ConnectionLog
from dedup_worker import routing
from dedup_worker.config import WorkerConfig
from dedup_worker.internal_topic import ConsumerFactory, InternalTopic
from dedup_worker.metrics import WorkerMetrics
from dedup_worker.routing import Source

# The worker's log lines keep the one logger name they had before what it reads had a
# module of its own (`logger` in the JSON lines).
log = logging.getLogger("dedup_worker.loop")

DISCOVER_EVERY_S = 5.0  # how often the input's partitions are looked up (ownership)

_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


def worth_retrying(err: object) -> bool:
    """Whether a failed offset lookup may succeed if asked again: a retriable error, or
    the group coordinator moving or still loading (a broker that has just started)."""
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in _COORDINATOR_MOVING)


class StoppedOnInput(RuntimeError):
    """The worker stops rather than drop what it read (exit 4)."""


class ForwardedRecordsLost(StoppedOnInput):
    """Records forwarded to this worker were deleted from the internal topic before it
    read them (offset out of range): they were the only copy once their forwarder
    committed its input offset. Stopping, not skipping: the internal topic must keep
    every record (retention.ms -1; workers delete only what they have committed)."""


def named(offsets: dict[Source, int]) -> dict[str, int]:
    """Offsets by source for a log line: ``{"topic[partition]": offset}``."""
    return {f"{topic}[{partition}]": offset for (topic, partition), offset in offsets.items()}


class SourceReader:
    """The input consumer of one worker and the sources it reads (with the internal
    topic's consumer, under ownership)."""

    def __init__(
        self,
        config: WorkerConfig,
        metrics: WorkerMetrics,
        internal: InternalTopic | None,
        make_consumer: ConsumerFactory = Consumer,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.internal = internal
        self._make_consumer = make_consumer
        self._monotonic = monotonic
        self.consumer: Consumer | None = None  # the input's; made by `open`
        self._log = ConnectionLog()  # its log lines, judged by its own reports
        # what this worker reads: (topic, partition); one input partition without ownership
        self._sources: list[Source] = []
        self._single_input: Source | None = None
        self._discovered_at = 0.0  # monotonic time the input's partitions were last looked up

    @property
    def sources(self) -> list[Source]:
        """The sources assigned, in the order they were."""
        return list(self._sources)

    @property
    def single_input(self) -> Source | None:
        """The one input partition read, if the worker reads one (the common case)."""
        return self._single_input

    def open(self) -> Consumer:
        """Make the input consumer."""
        self.consumer = self._make_consumer(self.settings())
        return self.consumer

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self.consumer = None

    # -- assignment ----------------------------------------------------------------------

    def assign_all(self) -> dict[Source, int]:
        """Assign every source this worker reads (none assigned yet) at its resume offset:
        its input partition; under ownership, every input and internal partition equal to
        its number modulo the number of workers."""
        cfg = self.config
        self._sources = []
        if self.internal is None or cfg.workers is None:
            return self.assign([(cfg.input_topic, cfg.partition)])
        self._discovered_at = self._monotonic()
        return self.assign(
            [
                (topic, partition)
                for topic in (cfg.input_topic, self.internal.topic)
                for partition in routing.sources_of(
                    cfg.partition, cfg.workers, self._partition_count(topic)
                )
            ]
        )

    def assign(self, sources: list[Source]) -> dict[Source, int]:
        """Add `sources` to their consumers' assignments at their resume offsets (a
        consumer's first assignment, an incremental one after it)."""
        offsets = self.resume_offsets(sources)
        assigned = {topic for topic, _ in self._sources}
        for topic in dict.fromkeys(topic for topic, _ in sources):
            consumer = self.consumer_of(topic)
            partitions = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if t == topic]
            if topic in assigned:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)
        self._sources = [*self._sources, *sources]
        inputs = [s for s in self._sources if s[0] == self.config.input_topic]
        self._single_input = inputs[0] if len(inputs) == 1 else None
        return offsets

    def reassign(self) -> dict[Source, int]:
        """Assign the same sources again from their resume offsets (after the consumer
        was used for a catch-up)."""
        sources, self._sources = self._sources, []
        return self.assign(sources)

    def seek_to_committed(self) -> dict[Source, int]:
        """Move every source to its resume offset (the assignment kept)."""
        offsets = self.resume_offsets(self._sources)
        for (topic, partition), offset in offsets.items():
            self.consumer_of(topic).seek(TopicPartition(topic, partition, offset))
        return offsets

    def rewind(self, spans: dict[Source, tuple[int, int]]) -> None:
        """Read each source again from the first offset of its span."""
        for (topic, partition), (first, _) in spans.items():
            self.consumer_of(topic).seek(TopicPartition(topic, partition, first))

    def discover_if_due(self) -> None:
        """(Ownership.) Every DISCOVER_EVERY_S, start reading input partitions that
        appeared since the last look (the topic grew), each from its committed offset,
        else from its log start: nothing produced before this worker noticed the
        partition is skipped."""
        cfg = self.config
        if cfg.workers is None or self._monotonic() - self._discovered_at < DISCOVER_EVERY_S:
            return
        self._discovered_at = self._monotonic()
        try:
            count = self._partition_count(cfg.input_topic, timeout_s=5)
        except KafkaException as exc:
            log.debug("input metadata not read; trying again later", extra={"error": str(exc)})
            return
        known = set(self._sources)
        new = [
            (cfg.input_topic, partition)
            for partition in routing.sources_of(cfg.partition, cfg.workers, count)
            if (cfg.input_topic, partition) not in known
        ]
        if new:
            offsets = self.assign(new)
            log.info(
                "input partitions discovered",
                extra={"topic": cfg.input_topic, "partitions": count, "sources": named(offsets)},
            )

    def consumer_of(self, topic: str) -> Consumer:
        """The consumer that reads `topic`: the internal topic has its own."""
        internal = self.internal
        if internal is not None and topic == internal.topic and internal.consumer is not None:
            return internal.consumer
        assert self.consumer is not None
        return self.consumer

    # -- reading -------------------------------------------------------------------------

    def records(self, messages: list[Message]) -> list[Message]:
        """The data records of a poll; partition-end events are dropped, errors raised."""
        records = [m for m in messages if m.error() is None]
        if len(records) != len(messages):
            for msg in messages:
                err = msg.error()
                if err is None or err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    self._out_of_range(msg, err)
                    continue
                raise KafkaException(err)
        return records

    def poll_forwarded(self) -> tuple[list[Message], list[Message]]:
        """(Ownership.) The forwarded records fetched so far, without waiting, up to
        half a batch (the rest of the batch is left to the input): the records, and the
        poll's messages with its partition-end events."""
        consumer = None if self.internal is None else self.internal.consumer
        if consumer is None:
            return [], []
        messages = consumer.consume(max(1, self.config.batch_size // 2), 0)
        return self.records(messages), messages

    def _out_of_range(self, msg: Message, err: KafkaError) -> None:
        """(Ownership: auto.offset.reset=error.) A source's offset is no longer in its
        log. Forwarded records deleted unread are lost: stop. Input deleted by its
        retention before it was read: go on from the log start, as auto.offset.reset
        earliest does without ownership, with a warning."""
        assert self.consumer is not None
        topic, partition = str(msg.topic()), int(msg.partition())
        if self.internal is not None and topic == self.internal.topic:
            raise ForwardedRecordsLost(
                f"records forwarded to this worker on {topic}[{partition}] were deleted "
                f"before it read them ({err.str()}); they were their only copy. The "
                "internal topic must keep every record: retention.ms -1 (the workers "
                "delete what they have committed)"
            )
        low, _ = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        log.warning(
            "input offset out of range: records deleted by retention before they were "
            "read; going on from the log start",
            extra={"topic": topic, "partition": partition, "log_start": low, "error": err.str()},
        )
        self.consumer.seek(TopicPartition(topic, partition, int(low)))

    # -- offsets -------------------------------------------------------------------------

    def resume_offsets(self, sources: list[Source]) -> dict[Source, int]:
        """Each source's offset committed by the last transaction; a source with none
        starts at its first offset (given explicitly: the logical OFFSET_BEGINNING costs
        librdkafka a reset round, about 1 s to the first fetch)."""
        assert self.consumer is not None
        committed = self.committed_offsets(sources)
        for source, offset in committed.items():
            if offset < 0:
                low, _ = self.consumer.get_watermark_offsets(TopicPartition(*source), timeout=30)
                committed[source] = int(low)
        return committed

    def committed_offsets(
        self, sources: list[Source], deadline_s: float = 60.0
    ) -> dict[Source, int]:
        """The offsets committed by the last transaction (negative: none). A broker that
        has just started answers NOT_COORDINATOR while it loads its offsets topic: that
        and other retriable errors are retried until `deadline_s`."""
        assert self.consumer is not None
        deadline = time.monotonic() + deadline_s
        asked = [TopicPartition(topic, partition) for topic, partition in sources]
        while True:
            try:
                return {
                    (tp.topic, tp.partition): int(tp.offset)
                    for tp in self.consumer.committed(asked, timeout=30)
                }
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not worth_retrying(err) or time.monotonic() > deadline:
                    raise
                log.info("committed offsets not available yet; retrying", extra={"error": str(exc)})
                time.sleep(0.2)

    def update_lag(self) -> None:
        """Records not read yet: of the input (consumer lag) and of the internal topic."""
        cfg = self.config
        owned_topic = None if self.internal is None else self.internal.topic
        lag = dict.fromkeys((t for t in (cfg.input_topic, owned_topic) if t is not None), 0)
        try:
            for topic in lag:
                consumer = self.consumer_of(topic)
                read = [TopicPartition(t, p) for t, p in self._sources if t == topic]
                for tp in consumer.position(read) if read else ():
                    _, high = consumer.get_watermark_offsets(tp, cached=True)
                    if high >= 0 and tp.offset >= 0:
                        lag[topic] += max(0, high - tp.offset)
        except KafkaException:
            return
        self.metrics.consumer_lag.set(lag[cfg.input_topic])
        if owned_topic is not None:
            self.metrics.forwarded_lag.set(lag[owned_topic])

    def _partition_count(self, topic: str, timeout_s: float = 30) -> int:
        assert self.consumer is not None
        metadata = self.consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None:
            err = None if metadata is None else metadata.error
            raise KafkaException(err or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return len(metadata.partitions)

    def settings(self) -> dict[str, object]:
        """The input consumer's settings (the internal topic's consumer starts from them)."""
        cfg = self.config
        return {
            "bootstrap.servers": cfg.bootstrap_servers,
            "group.id": cfg.group,
            "logger": self._log,
            "error_cb": self._log.error,
            # The consumer is polled all the time: its reports say when a broker is up.
            "stats_cb": self._log.statistics,
            "statistics.interval.ms": STATISTICS_INTERVAL_MS,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            # under ownership an offset out of range is decided per source (_out_of_range)
            "auto.offset.reset": "earliest" if self.internal is None else "error",
            "enable.partition.eof": True,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "queued.min.messages": max(100_000, cfg.batch_size * 4),
            **cfg.kafka_settings,
        }
