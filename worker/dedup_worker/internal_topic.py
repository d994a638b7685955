"""(Ownership.) The internal topic as one worker reads it: the records other workers
forwarded to it, and what it may delete of them.

An `InternalTopic` exists only under ownership (`--owned-topic`). It owns the internal
topic's own consumer (the input consumer's group and settings, its own log judge and
statistics reader: each poll returns records of one kind, so no record's topic is read
to tell forwarded records from input ones), the offsets the worker's committed
transactions recorded on its internal partitions, and the deletion of the records below
them (Kafka's deleteRecords through an admin client made at the first records to
delete). From the consumer's statistics it keeps the age of the oldest open forwarder
transaction holding forwarded records back (`dedup_forwarded_stalled_seconds`).

The worker (`loop.py`) polls the consumer, assigns its partitions and tells which
offsets a committed batch reached; the records are forwarded by `transaction.py`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from dedup_contract.broker_logs import ConnectionLog
from dedup_worker.config import WorkerConfig
from dedup_worker.metrics import WorkerMetrics
from dedup_worker.routing import OpenTransactionAge, Source

# The worker's log lines keep the one logger name they had before the internal topic had
# a module of its own (`logger` in the JSON lines).
log = logging.getLogger("dedup_worker.loop")

DELETE_FORWARDED_EVERY_S = 10.0  # how often consumed forwarded records are deleted

ConsumerFactory = Callable[[dict[str, object]], Consumer]
AdminFactory = Callable[[dict[str, object]], AdminClient]


class InternalTopic:
    """The internal partitions one worker reads: their consumer, the offsets its
    committed transactions recorded, and the deletion of what it consumed."""

    def __init__(
        self,
        config: WorkerConfig,
        metrics: WorkerMetrics,
        make_consumer: ConsumerFactory = Consumer,
        make_admin: AdminFactory = AdminClient,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if config.owned_topic is None:
            raise ValueError("an internal topic needs --owned-topic (ownership)")
        self.config = config
        self.metrics = metrics
        self.topic: str = config.owned_topic
        self._make_consumer = make_consumer
        self._make_admin = make_admin
        self._monotonic = monotonic
        # The internal topic's own consumer (the same group, assigned partitions); made
        # by `open`.
        self.consumer: Consumer | None = None
        self._consumer_log = ConnectionLog()  # its log lines, judged by its own reports
        self._open_transaction = OpenTransactionAge()  # on the internal partitions read
        # internal partition -> the next offset our last committed transaction recorded,
        # and up to where the records before it were deleted (asked) already
        self._committed: dict[int, int] = {}
        self._deleted: dict[int, int] = {}
        self._deleted_at = 0.0
        self.admin: AdminClient | None = None
        self._admin_log = ConnectionLog()

    def open(self, input_settings: dict[str, object]) -> None:
        """Make the internal topic's consumer: the input consumer's settings, with its
        own log judge and statistics reader (polled at every batch too)."""
        self.consumer = self._make_consumer(
            {
                **input_settings,
                "logger": self._consumer_log,
                "error_cb": self._consumer_log.error,
                "stats_cb": self._on_statistics,
            }
        )

    def committed(self, spans: dict[Source, tuple[int, int]]) -> None:
        """A batch that read these spans has committed: its next offsets on the internal
        partitions are what may be deleted below."""
        topic = self.topic
        for (source_topic, partition), (_, next_offset) in spans.items():
            if source_topic == topic:
                self._committed[partition] = next_offset

    def delete_consumed(self) -> None:
        """Every DELETE_FORWARDED_EVERY_S, delete the records of the internal partitions
        this worker reads below the offsets its committed transactions recorded (Kafka's
        deleteRecords, as Kafka Streams does for repartition topics): the topic keeps
        every record (retention.ms -1) until its owner has consumed it."""
        now = self._monotonic()
        if now - self._deleted_at < DELETE_FORWARDED_EVERY_S:
            return
        self._deleted_at = now
        if self.admin is not None:
            self.admin.poll(0)  # serves its log lines
        due = {
            partition: offset
            for partition, offset in self._committed.items()
            if offset > self._deleted.get(partition, 0)
        }
        if not due:
            return
        if self.admin is None:
            # Made at the first records to delete: a worker whose producers key by id
            # receives none, and an idle client's threads cost the others CPU.
            cfg = self.config
            self.admin = self._make_admin(
                {
                    "bootstrap.servers": cfg.bootstrap_servers,
                    "logger": self._admin_log,
                    **cfg.kafka_settings,
                }
            )
        asked = [TopicPartition(self.topic, partition, offset) for partition, offset in due.items()]
        try:
            futures = self.admin.delete_records(asked, request_timeout=30)
        except KafkaException as exc:
            log.warning("consumed forwarded records not deleted", extra={"error": str(exc)})
            return
        self._deleted.update(due)
        for tp, future in futures.items():
            future.add_done_callback(
                lambda done, tp=tp: self._on_deleted(tp.partition, tp.offset, done)  # type: ignore[misc]
            )

    def close(self) -> None:
        """Drop the admin client and close the consumer."""
        self.admin = None
        if self.consumer is not None:
            self.consumer.close()
        self.consumer = None

    def _on_deleted(self, partition: int, offset: int, done: Future[object]) -> None:
        """(Admin thread.) A deleteRecords request answered; a refusal is logged and the
        deletion asked again later (the records stay: only disk is spent)."""
        error = done.exception()
        if error is None:
            return
        if self._deleted.get(partition) == offset:
            self._deleted[partition] = 0
        log.warning(
            "consumed forwarded records not deleted; the internal topic grows until they are "
            "(the workers need the DeleteRecords ACL on it)",
            extra={"partition": partition, "offset": offset, "error": str(error)},
        )

    def _on_statistics(self, report: str) -> None:
        """The internal topic's consumer's statistics (stats_cb, every second): its
        connections' states for the log levels, and each internal partition's high
        watermark and last stable offset for the age of the oldest open forwarder
        transaction."""
        try:  # parsed once for both readers
            parsed = json.loads(report)
        except ValueError:
            return
        self._consumer_log.statistics(parsed)
        try:
            partitions = parsed["topics"][self.topic]["partitions"]
            now = self._monotonic()
            for number, stats in partitions.items():
                partition = int(number)
                if partition >= 0:  # -1 is librdkafka's unassigned-messages entry
                    self._open_transaction.observe(
                        partition, int(stats["hi_offset"]), int(stats["ls_offset"]), now
                    )
        except (ValueError, KeyError, TypeError):
            return
        self.metrics.forwarded_stalled.set(self._open_transaction.seconds(now))
