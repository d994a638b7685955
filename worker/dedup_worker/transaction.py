"""The worker's commit protocol: one Kafka transaction per batch, committed in the
background, and how a fence is told.

A `Publisher` owns the transactional producer (`open`: `init_transactions` fences any
zombie with the same transactional id) and its committer thread. `send(batch)` opens the
batch's transaction and produces into it, in this order: the new records to the output
partition, the records another worker owns to its partition of the internal topic
(forwarding), the dead letters with their headers; then the committer thread flushes,
adds the input offsets and commits, checking the fencing token before and after the
flush. `result()` waits for that commit: True when committed, False when the
transaction was aborted and the batch must be redone (a lapsed Lease hold, an abortable
Kafka error); it raises `Fenced` when this worker is a zombie (its token lost, or the
producer fenced or fatally failed at the broker). `serve_idle()` serves the producer's
reports while nothing is in flight; `close()` stops the committer and flushes.

The caller (`loop.py`) prepares each `Batch` and completes it (the store write after the
commit); nothing here reads the input or writes the store.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from dedup_contract import batch as batch_rules
from dedup_contract import broker_logs, faults
from dedup_contract.batch import DeadLetter, Firsts, Headers, Triage
from dedup_contract.broker_logs import STATISTICS_INTERVAL_MS, ConnectionLog
from dedup_contract.ids import ID_HEADER
from dedup_worker import routing
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import Fenced, FencingToken
from dedup_worker.lease import Hold
from dedup_worker.metrics import WorkerMetrics
from dedup_worker.routing import NO_FORWARDS, Forwards, Source

# The worker's log lines keep the one logger name they had before the commit protocol had
# a module of its own (`logger` in the JSON lines).
log = logging.getLogger("dedup_worker.loop")
# librdkafka's own log lines (delivered on poll) go through our structured logging, the
# logger `librdkafka`: each client's through its ConnectionLog (broker_logs.py), which
# passes a connection failure at WARNING while a broker is up or all have been down for
# less than 30 s.
LIBRDKAFKA_LOG = broker_logs.LIBRDKAFKA_LOG


class FenceReportedByTheWorker(logging.Filter):
    """librdkafka's own ERROR lines about this producer being fenced are passed on as
    WARNING: the worker reports a fence itself, once, as its ERROR line ``fenced: ...``
    before exit code 3. (A fence met while the input offsets are being added to the
    transaction makes librdkafka log an ``ADDOFFSETS`` ERROR line.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "fence" in record.getMessage().lower():
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


LIBRDKAFKA_LOG.addFilter(FenceReportedByTheWorker())

ABORT_FLUSH_S = 10.0  # before a deliberate abort: the open transaction's records delivered
FORWARDING_CRASH = "forwarding"  # test-only fault point: between two forwarded records

_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
FATAL_SETTLE_S = 1.0
"""How long a `_STATE` error waits for the fatal error it may be the first sign of: a
fence met by librdkafka's thread moves the transaction to its fatal state before it sets
the producer's fatal error, and a `produce` in between fails with `_STATE` ("Erroneous
state"), not `_FATAL` (CI, 2026-12-05: a fenced worker exited 6, "kafka failed")."""


@dataclass(frozen=True)
class BatchResult:
    """What a completed batch did: records consumed (from the input and, under ownership,
    `received` of them from the internal topic), new ids published, duplicates dropped,
    dead letters, and records `forwarded` to their owners."""

    consumed: int
    published: int
    duplicates: int
    dead_letters: int
    received: int = 0
    forwarded: int = 0


@dataclass(eq=False)
class Batch:
    """A polled batch between preparation and completion."""

    records: list[Message]  # the data records of one poll, each source's in offset order
    split: Triage
    new: Firsts  # first occurrences the window does not hold (and this worker owns)
    new_keys: frozenset[bytes]
    # each source read: its first offset in the batch and the next to read after it
    spans: dict[Source, tuple[int, int]]
    forwards: Forwards = NO_FORWARDS  # first occurrences other workers own
    received: int = 0  # records read from the internal topic
    started: float = 0.0
    last_output_offset: int = -1

    @property
    def next_input(self) -> int:
        """The next offset of the batch's first source (the store's informational
        input offset; the consumer group's offsets are the resume points)."""
        return next(iter(self.spans.values()))[1]

    @property
    def newest_ms(self) -> int:
        return self.split.newest_ms

    @property
    def dead_letters(self) -> list[DeadLetter]:
        return self.split.dead_letters

    @property
    def duplicates(self) -> int:
        return self.split.repeats + len(self.split.firsts) - len(self.new) - len(self.forwards)

    def result(self) -> BatchResult:
        return BatchResult(
            len(self.records),
            len(self.new),
            self.duplicates,
            len(self.dead_letters),
            self.received,
            len(self.forwards),
        )

    def on_last_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.last_output_offset = int(msg.offset())


# The accessors of a batch's columns, as Message's own (C) methods: ``map`` over these
# costs ~15 ns a record, where ``methodcaller`` builds a bound method per call (~70 ns)
# and a Python loop calling the method ~20 ns (bench/HISTORY.md).
_topic = Message.topic
_partition = Message.partition
_offset = Message.offset
_timestamp = Message.timestamp
_timestamp_ms = itemgetter(1)
_headers = Message.headers
_value = Message.value
_key = Message.key
# Producer.produce is called positionally on the hot paths, 0.3 us a record less than
# with keywords. Its order (confluent-kafka): topic, value, key, partition, callback,
# on_delivery (an alias read only when `callback` is absent: passing None there drops
# it), timestamp, headers.

ProducerFactory = Callable[[dict[str, object]], Producer]
"""Makes the transactional producer from its settings (confluent-kafka's `Producer`)."""


class Publisher:
    """The transactional producer of one worker and its committer thread: each batch's
    records, forwards and dead letters in one transaction, committed in the background."""

    def __init__(
        self,
        config: WorkerConfig,
        fencing: FencingToken,
        metrics: WorkerMetrics,
        group_metadata: Callable[[], object],
        make_producer: ProducerFactory = Producer,
        observe_commit: Callable[[float], None] | None = None,
    ) -> None:
        """`group_metadata` gives the input consumer's group metadata, which each commit
        sends with the input offsets (called on the committer thread). `observe_commit`,
        if given, is told each committed transaction's time from the committer's start
        to the commit's return, in seconds (on the committer thread; the bench's
        latencies)."""
        self.config = config
        self.fencing = fencing
        self.metrics = metrics
        self._group_metadata = group_metadata
        self._make_producer = make_producer
        self._observe_commit = observe_commit
        self._producer: Producer | None = None
        self._producer_log = ConnectionLog()  # its log lines, judged by its own reports
        self._fatal: KafkaError | None = None  # the producer's fatal error, when it has one
        self._fence: str | None = None  # why this worker is fenced, once it is
        self._in_flight: Batch | None = None
        self._commit_result: Future[bool] | None = None
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="committer")
        # wall-clock time the last commit returned (None before the first): the fenced
        # worker's log line carries it, to show it stopped before the next holder began
        self.last_commit_at: float | None = None

    # -- the surface -------------------------------------------------------------------

    def open(self) -> None:
        """Make the transactional producer and initialise its transactions, which fences
        any zombie with our transactional id (raises Fenced if we are the zombie)."""
        self._producer = self._make_producer(self._producer_settings())
        log.info(
            "initialising transactions", extra={"transactional_id": self.config.transactional_id}
        )
        try:
            self._producer.init_transactions(60)
        except KafkaException as exc:
            self._raise_if_fenced(exc, "init_transactions")
            raise
        self._producer_log.request_succeeded()

    @property
    def in_flight(self) -> Batch | None:
        """The batch sent whose commit has not been waited for yet."""
        return self._in_flight

    @property
    def fence(self) -> str | None:
        """Why this worker is fenced (None while it is not)."""
        return self._fence

    def send(self, batch: Batch) -> None:
        """Open the batch's transaction, produce its records, and commit it in the
        background."""
        self._produce_batch(batch)
        batch.started = time.monotonic()
        self._in_flight = batch
        self._commit_result = self._committer.submit(self._commit, batch)

    def result(self) -> bool:
        """Wait for the commit of the batch in flight, which is then no longer in
        flight: True when committed, False when aborted (the batch must be redone).
        Raises Fenced when this worker is a zombie."""
        future = self._commit_result
        assert future is not None, "no batch in flight"
        self._in_flight = self._commit_result = None
        return future.result()

    def discard(self) -> None:
        """A fenced worker does not complete its batch in flight: the committer aborts it
        (token lost) or fails to commit it (fenced at the broker), and should it have
        committed, the store, unwritten, catches up from the output topic at the next
        start, as after a crash."""
        future = self._commit_result
        self._in_flight = self._commit_result = None
        if future is not None:
            with contextlib.suppress(Fenced, KafkaException):
                future.result()

    def serve_idle(self) -> None:
        """With no transaction in flight, serve the producer's log lines, errors and
        statistics now: only a commit's flush serves them otherwise, and an idle worker
        would tell of a broker outage (its transaction coordinator's connection failing)
        at the next commit, judged late, or never. (A transaction in flight is flushed
        by the committer thread, which serves them.)"""
        if self._in_flight is None and self._producer is not None:
            self._producer.poll(0)

    def fenced(self, reason: str) -> Fenced:
        """The exception a fenced worker stops with; counted once per worker."""
        if self._fence is None:
            self._fence = reason
            self.metrics.fencing_events.inc()
        return Fenced(f"partition {self.config.partition} of {self.config.pipeline}: {reason}")

    def close(self) -> None:
        """Stop the committer thread and flush the producer (nothing of ours is left to
        deliver once fenced or fatally failed)."""
        self._in_flight = self._commit_result = None
        self._committer.shutdown(wait=True)
        if self._producer is not None:
            producer, self._producer = self._producer, None
            try:
                producer.flush(10)
            except KafkaException as exc:  # fenced or fatal: nothing of ours to deliver
                log.warning("producer not flushed on close", extra={"error": str(exc)})

    # -- a batch's transaction -----------------------------------------------------------

    def _produce_batch(self, batch: Batch) -> None:
        assert self._producer is not None
        cfg = self.config
        try:
            self._producer.begin_transaction()
            output, partition = cfg.output_topic, cfg.partition
            produce = self._producer.produce
            new = batch.new
            records = cast(list[Message], new.records)
            owned_topic = cfg.owned_topic if batch.received else None
            # Columns taken with ``map`` (driven from C), then one positional produce
            # call a record (confluent-kafka's order: the note by `_key`).
            headers: list[Headers] = [
                # forwarded: published as if it had not been
                routing.published_headers(own)
                if own and owned_topic is not None and topic == owned_topic
                else [(ID_HEADER, utf8_id)]
                if own is None
                else [*own, (ID_HEADER, utf8_id)]
                for own, utf8_id, topic in zip(
                    map(_headers, records),
                    new.utf8_ids,
                    map(_topic, records) if owned_topic is not None else repeat(None, len(records)),
                    strict=True,
                )
            ]
            # a delivery callback on the last record only
            callbacks = [*repeat(None, len(records) - 1), batch.on_last_delivery] if records else []
            for value, key, stamp, hs, callback in zip(
                map(_value, records),
                map(_key, records),
                map(_timestamp_ms, map(_timestamp, records)),
                headers,
                callbacks,
                strict=True,
            ):
                try:
                    produce(output, value, key, partition, callback, None, stamp, hs)
                except BufferError:  # local queue full: the slow path waits for room
                    self._produce(output, value, key, hs, stamp, partition, callback)
            self._forward(batch.forwards)
            for dl in batch.dead_letters:
                self._produce(
                    cfg.dead_letter_topic or "",
                    dl.record.value(),
                    dl.record.key(),
                    self._dead_letter_headers(dl),
                    dl.record.timestamp()[1],
                )
        except KafkaException as exc:
            self._raise_if_fenced(exc, "produce (begin_transaction, produce)")
            raise

    def _forward(self, forwards: Forwards) -> None:
        """Produce each record another worker owns to its owner's partition of the
        internal topic (in the open transaction), with the forwarding headers.

        The columns are taken with ``map`` (driven from C) and the produce call is
        positional: cheaper per call, measured in isolation; records/s did not move
        measurably (bench/HISTORY.md, "Per-call costs on the forwarding path")."""
        owned_topic = self.config.owned_topic
        if not forwards or owned_topic is None:
            return
        assert self._producer is not None
        produce = self._producer.produce
        forward_headers = routing.forward_headers
        records = cast(list[Message], forwards.records)
        headers = [
            # read from the internal topic: forwarded already, its headers kept
            (own or []) if topic == owned_topic else forward_headers(own, utf8_id, at, offset)
            for topic, own, utf8_id, at, offset in zip(
                map(_topic, records),
                map(_headers, records),
                forwards.utf8_ids,
                map(_partition, records),
                map(_offset, records),
                strict=True,
            )
        ]
        crash_point = faults.armed(FORWARDING_CRASH)
        for value, key, to, stamp, hs in zip(
            map(_value, records),
            map(_key, records),
            forwards.owners,
            map(_timestamp_ms, map(_timestamp, records)),
            headers,
            strict=True,
        ):
            try:
                produce(owned_topic, value, key, to, None, None, stamp, hs)  # positional
            except BufferError:  # local queue full: the slow path waits for room
                self._produce(owned_topic, value, key, hs, stamp, to)
            if crash_point:
                faults.maybe_crash(FORWARDING_CRASH)  # test-only: dying mid-transaction

    def _commit(self, batch: Batch) -> bool:
        """(Committer thread.) Flush, add the input offset, commit. False if the
        transaction was aborted and the batch must be redone; raises Fenced when this
        worker is a zombie."""
        assert self._producer is not None
        producer = self._producer
        began = time.perf_counter()
        try:
            if not self._check_token(producer):
                return False
            # The flush before the offsets: sent first, the offsets overlap the delivery
            # and the main thread waits less for the commit, but records/s did not
            # follow (bench/HISTORY.md, "Overlapping more on two cores").
            producer.flush()
            producer.send_offsets_to_transaction(
                [
                    TopicPartition(topic, partition, next_offset)
                    for (topic, partition), (_, next_offset) in batch.spans.items()
                ],
                self._group_metadata(),
            )
            faults.maybe_crash("before-commit")
            faults.maybe_abortable_error("abortable-before-commit")
            if not self._check_token(producer):  # the flush may have taken a while
                return False
            sent = time.time()
            producer.commit_transaction()
            self._producer_log.request_succeeded()
        except KafkaException as exc:
            self._raise_if_fenced(
                exc, "commit (flush, send_offsets_to_transaction, commit_transaction)"
            )
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.txn_requires_abort():
                log.warning("transaction aborted; redoing the batch", extra={"error": err.str()})
                return self._abort(producer, flush_s=None)
            raise
        first = self.last_commit_at is None
        self.last_commit_at = time.time()
        if first:
            log.info(
                "first transaction committed",
                extra={
                    "input_next_offset": batch.next_input,
                    "commit_sent": sent,
                    "committed": self.last_commit_at,
                },
            )
        self.metrics.transactions.inc()
        if self._observe_commit is not None:
            self._observe_commit(time.perf_counter() - began)
        return True

    def _check_token(self, producer: Producer) -> bool:
        """(Committer thread.) Before committing: still holding the fencing token? If
        lost, abort the open transaction (as far as the broker lets us) and raise Fenced;
        if lapsed, abort it and return False (the batch is redone after the pause)."""
        hold = self.fencing.state()
        if hold is Hold.HELD:
            return True
        if hold is Hold.LOST:
            fence = self.fenced(self.fencing.why_not_held())
            try:
                producer.abort_transaction(10)
            except KafkaException as exc:
                log.debug("abort after losing the token failed", extra={"error": str(exc)})
            raise fence
        log.warning(
            "the Lease hold lapsed before the commit; transaction aborted",
            extra={"reason": self.fencing.why_not_held()},
        )
        # Deliver what the transaction holds before aborting it (librdkafka#4849): an
        # abort sent while the transaction's first produce is in flight can reach the
        # coordinator before the partitions are added, and the broker then refuses the
        # EndTxn with a fatal INVALID_TXN_STATE, which would stop this worker as if it
        # were fenced. Records delivered into a transaction that is then aborted are
        # never read by a read_committed consumer.
        return self._abort(producer, flush_s=ABORT_FLUSH_S)

    def _abort(self, producer: Producer, flush_s: float | None) -> bool:
        """(Committer thread.) Abort the open transaction, delivering what it holds first
        when `flush_s` is given; counted. False: the batch is redone. A fence met on the
        way raises Fenced."""
        try:
            if flush_s is not None:
                producer.flush(flush_s)
            producer.abort_transaction(30)
        except KafkaException as exc:
            what = "abort_transaction" if flush_s is None else "flush, abort_transaction"
            self._raise_if_fenced(exc, what)
            raise
        self.metrics.aborts.inc()
        return False

    # -- fences and errors ---------------------------------------------------------------

    def _raise_if_fenced(self, exc: KafkaException, during: str = "a Kafka call") -> None:
        """Raise Fenced if `exc` says the producer is fenced or fatally failed, however the
        call learned it: the transactional calls return the fatal error itself, while
        `produce` only says `_FATAL` ("Unable to produce message"), the reason being
        served to the error callback by the next poll."""
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError):
            return
        code = err.code()
        # _FATAL and _STATE name no reason: the producer's fatal error, served to the
        # error callback, does (for _STATE, only if it comes: see FATAL_SETTLE_S)
        # (an abortable _STATE is a transaction's own, aborted and redone by the caller)
        unnamed = code == KafkaError._FATAL or (
            code == KafkaError._STATE and not err.txn_requires_abort()
        )
        if code not in _FENCED_CODES and not err.fatal() and not unnamed:
            return
        if unnamed and self._fatal is None:
            self._serve_fatal(FATAL_SETTLE_S if code == KafkaError._STATE else 0.0)
        if code == KafkaError._STATE and self._fatal is None:
            return  # a state error of its own, not a fence
        cause = self._fatal if unnamed and self._fatal is not None else err
        raise self.fenced(
            f"another worker took over transactional id {self.config.transactional_id} "
            f"({cause.str()}; learned during {during}); this one must stop"
        ) from exc

    def _serve_fatal(self, wait_s: float) -> None:
        """Poll the producer, which serves a fatal error to `_on_kafka_error` (or raises
        it), until it has one or `wait_s` passed (at least one poll)."""
        if self._producer is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._producer.poll(0)
            except KafkaException as served:
                self._on_kafka_error(served.args[0] if served.args else None)
            if self._fatal is not None or time.monotonic() >= deadline:
                return
            time.sleep(0.01)

    def _on_kafka_error(self, err: KafkaError | None) -> None:
        """The producer's error callback: remembers its fatal error (a fence), and tells
        its log hook when all brokers are down."""
        if isinstance(err, KafkaError) and err.fatal() and self._fatal is None:
            self._fatal = err
        self._producer_log.error(err)

    # -- helpers -------------------------------------------------------------------------

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]],
        timestamp_ms: int,
        partition: int = -1,  # librdkafka's "let the partitioner choose"
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    ) -> None:
        """Produce one record; when the local queue is full, let librdkafka drain it."""
        assert self._producer is not None
        while True:
            try:
                self._producer.produce(
                    topic,
                    value,
                    key,
                    partition,
                    on_delivery=on_delivery,
                    timestamp=timestamp_ms,
                    headers=headers,
                )
                return
            except BufferError:
                self._producer.poll(0.05)

    def _dead_letter_headers(self, dead: DeadLetter) -> list[tuple[str, bytes | None]]:
        record = cast(Message, dead.record)
        return batch_rules.dead_letter_headers(
            record.headers(),
            dead.reason,
            dead.detail,
            str(record.topic()),
            int(record.partition()),
            int(record.offset()),
        )

    def _producer_settings(self) -> dict[str, object]:
        cfg = self.config
        return {
            "bootstrap.servers": cfg.bootstrap_servers,
            "transactional.id": cfg.transactional_id,
            "error_cb": self._on_kafka_error,
            "logger": self._producer_log,
            # Polled while a batch commits (flush) and, idle, at every empty poll of the
            # consumer (serve_idle): its reports say when a broker is up, as a committed
            # transaction does.
            "stats_cb": self._producer_log.statistics,
            "statistics.interval.ms": STATISTICS_INTERVAL_MS,
            "transaction.timeout.ms": cfg.transaction_timeout_ms,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": max(100_000, cfg.batch_size * 4),
            **cfg.kafka_settings,
        }
