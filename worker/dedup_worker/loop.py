"""The exactly-once loop of one worker: its input (and internal-topic) partitions -> window
-> its output partition, forwarding the records whose id another worker owns.

Start-up (docs/design.md, "Start-up and the loop"): fencing token, store, transactional
producer (`init_transactions` fences zombies), catch-up from the output topic, resume
input from the offsets committed in the last transaction. Then per batch: triage,
multi-get, one Kafka transaction (output records, forwarded records, dead letters, input
offsets), and only after the commit one store write batch.

A worker whose Lease hold lapsed (no successful renew within the renew deadline) pauses:
the transaction in flight is aborted (the input rewound to it), nothing is consumed or
committed, the producer and consumer stay open, /readyz says not ready and /healthz
stays OK. The store stays open for a short lapse (an API server restart); once the
pause has lasted a third of the Lease duration -- when others may see the Lease run
out and the volume may be moved to the next epoch -- it is closed (its files and lock
released; nothing has written to it since the pause began). When the hold is proved
again at its own epoch the worker resumes at once: it reopens the store if it had
closed it (and catches up from the output topic), then moves the input to the offset
committed by its last transaction. Only a Lease lost to another holder or a newer epoch
stops it (`Fenced`, exit 3).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter, or_
from typing import cast

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from dedup_contract import batch as batch_rules
from dedup_contract import broker_logs, faults, ownership
from dedup_contract.batch import DeadLetter, Firsts, Headers, Triage, select_new, triage
from dedup_contract.broker_logs import STATISTICS_INTERVAL_MS, ConnectionLog
from dedup_contract.ids import ID_HEADER
from dedup_contract.store import Store
from dedup_worker import routing
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import AlwaysHeld, Fenced, FencingToken
from dedup_worker.lease import Hold, WorkerState, next_state
from dedup_worker.metrics import Health, WorkerMetrics
from dedup_worker.recovery import catch_up, owned_from_other_partitions
from dedup_worker.routing import NO_FORWARDS, Forwards, OpenTransactionAge, Source, WindowClock

log = logging.getLogger(__name__)
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

# Dead-letter header names, re-exported from batch.py (which owns them).
DLQ_REASON = batch_rules.DLQ_REASON
DLQ_DETAIL = batch_rules.DLQ_DETAIL
DLQ_TOPIC = batch_rules.DLQ_TOPIC
DLQ_PARTITION = batch_rules.DLQ_PARTITION
DLQ_OFFSET = batch_rules.DLQ_OFFSET

DISK_GAUGE_EVERY_S = 10.0
ABORT_FLUSH_S = 10.0  # before a deliberate abort: the open transaction's records delivered
PAUSED_STEP_S = 0.05  # while paused, how often the hold is looked at again
DISCOVER_EVERY_S = 5.0  # how often the input's partitions are looked up (ownership)
DELETE_FORWARDED_EVERY_S = 10.0  # how often consumed forwarded records are deleted
FORWARDING_CRASH = "forwarding"  # test-only fault point: between two forwarded records

_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}
_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def _settle_heap(batch_size: int) -> None:
    """Keep the cyclic garbage collector out of the batch loop's way (once started).

    Everything allocated before the first batch (modules, clients, whatever the host
    process holds) is frozen out of the collector's generations: a full collection used
    to walk all of it, 100-160 ms with the GIL held, which stalled the committer thread
    and made the batch commit p99. The first generation's threshold is raised above a
    few batches' worth of tracked objects (the polled messages, candidates, lists): those
    die by reference counting when their batch completes, so they no longer trigger
    collections of young objects every 700 allocations (2,500 collections per million
    records); cycles, if any, are still collected.
    """
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, 10 * batch_size), middle, old)


def worth_retrying(err: object) -> bool:
    """Whether a failed offset lookup may succeed if asked again: a retriable error, or
    the group coordinator moving or still loading (a broker that has just started)."""
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in _COORDINATOR_MOVING)


class StoppedOnInput(RuntimeError):
    """The worker stops rather than drop what it read (exit 4)."""


class NoDeadLetterTopic(StoppedOnInput):
    """A record has no valid id and no dead-letter topic is configured: stopping rather
    than dropping it. The input offset is not committed, so nothing is lost."""


class ForwardedRecordsLost(StoppedOnInput):
    """Records forwarded to this worker were deleted from the internal topic before it
    read them (offset out of range): they were the only copy once their forwarder
    committed its input offset. Stopping, not skipping: the internal topic must keep
    every record (retention.ms -1; workers delete only what they have committed)."""


@dataclass(frozen=True)
class BatchResult:
    consumed: int
    published: int
    duplicates: int
    dead_letters: int


@dataclass(eq=False)
class _Batch:
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
            len(self.records), len(self.new), self.duplicates, len(self.dead_letters)
        )

    def on_last_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.last_output_offset = int(msg.offset())


_NOTHING = BatchResult(0, 0, 0, 0)
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


def _span(records: list[Message]) -> tuple[int, int]:
    """The first offset and the next to read of a batch read from one source."""
    return int(records[0].offset()), int(records[-1].offset()) + 1


def _named(offsets: dict[Source, int]) -> dict[str, int]:
    """Offsets by source for a log line: ``{"topic[partition]": offset}``."""
    return {f"{topic}[{partition}]": offset for (topic, partition), offset in offsets.items()}


class DedupWorker:
    def __init__(
        self,
        config: WorkerConfig,
        fencing: FencingToken | None = None,
        metrics: WorkerMetrics | None = None,
        health: Health | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.fencing = fencing or AlwaysHeld()
        self.metrics = metrics or WorkerMetrics(config.pipeline, config.partition)
        self.health = health or Health()
        self.clock = clock
        self._stop = threading.Event()
        self._clock = WindowClock()  # the window's clock over the sources read
        # what this worker reads: (topic, partition); one input partition without ownership
        self._sources: list[Source] = []
        self._single_input: Source | None = None  # the one input partition read, if one
        self._discovered_at = 0.0  # monotonic time the input's partitions were last looked up
        self._open_transaction = OpenTransactionAge()  # on the internal partitions read
        # internal partition -> the next offset our last committed transaction recorded,
        # and up to where the records before it were deleted (asked) already
        self._forwarded_committed: dict[int, int] = {}
        self._forwarded_deleted: dict[int, int] = {}
        self._deleted_at = 0.0
        self.admin: AdminClient | None = None
        self._admin_log = ConnectionLog()
        self._in_flight: _Batch | None = None
        self._commit_result: Future[bool] | None = None
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="committer")
        self._disk_measured = -DISK_GAUGE_EVERY_S
        self._fence: str | None = None  # why this worker is fenced, once it is
        self.state = WorkerState.RUNNING
        self._paused_at = 0.0  # monotonic time the current pause began
        # how long a pause keeps the store open: a third of the Lease duration (None: no
        # Lease, a standalone worker never pauses)
        lease = config.lease
        self._store_kept_s = None if lease is None else lease.duration_s / 3
        self._fatal: KafkaError | None = None  # the producer's fatal error, when it has one
        # wall-clock time the last commit returned (None before the first): the fenced
        # worker's log line carries it, to show it stopped before the next holder began
        self.last_commit_at: float | None = None
        self.store: Store | None = None
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        # Under ownership, the internal topic's own consumer (the same group, assigned
        # partitions): each poll returns records of one kind, so no record's topic is
        # read to tell forwarded records from input ones.
        self.forwarded_consumer: Consumer | None = None
        # each client's log lines, judged by what that client reports of its brokers
        self._producer_log = ConnectionLog()
        self._consumer_log = ConnectionLog()
        self._forwarded_log = ConnectionLog()

    # -- lifecycle -------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand and return (SIGTERM does this)."""
        self._stop.set()

    def run(self, max_batches: int | None = None) -> None:
        try:
            self.start()
            batches = 0
            while not self._stop.is_set() and (max_batches is None or batches < max_batches):
                self.process_batch()
                batches += 1
        finally:
            self.close()

    def start(self) -> None:
        cfg = self.config
        started = time.monotonic()
        if not self.fencing.held():
            raise self._fenced(f"not held at start: {self.fencing.why_not_held()}")
        self.store = Store.open(
            cfg.store_path, cfg.owner, cfg.window, cfg.store, cfg.ownership, cfg.ownership_switch
        )
        self.producer = Producer(self._producer_settings())
        log.info("initialising transactions", extra={"transactional_id": cfg.transactional_id})
        try:
            self.producer.init_transactions(60)
        except KafkaException as exc:
            self._raise_if_fenced(exc, "init_transactions")
            raise
        self._producer_log.request_succeeded()
        self.consumer = Consumer(self._consumer_settings())
        rebuild_from = None
        if cfg.window.duration_ms is not None:
            rebuild_from = int(self.clock() * 1000) - cfg.window.duration_ms
        recovered = catch_up(
            self.store, self.consumer, cfg.output_topic, cfg.partition, rebuild_from, cfg.workers
        )
        if self.store.switching:
            self._switch_store(rebuild_from)
        if cfg.owned_topic is not None:  # made now: a consumer not polled queues its reports
            self.forwarded_consumer = Consumer(self._forwarded_consumer_settings())
        self._sources = []
        resume = self._assign(self._find_sources())
        seconds = time.monotonic() - started
        self.metrics.recovery_seconds.set(seconds)
        self.metrics.recovered_ids.set(recovered.ids)
        self._refresh_store_gauges()
        self.health.ready = True
        self.health.beat()
        _settle_heap(cfg.batch_size)
        log.info(
            "worker ready",
            extra={
                "pipeline": cfg.pipeline,
                "partition": cfg.partition,
                "input_offset": resume.get((cfg.input_topic, cfg.partition)),
                "sources": _named(resume),
                "store_keys": self.store.key_count,
                "recovered_ids": recovered.ids,
                "startup_seconds": round(seconds, 3),
            },
        )

    def _switch_store(self, window_start_ms: int | None) -> None:
        """A store written before ownership (its ids: those of input partition p, all
        published to output partition p) gets the ids this worker owns that the other
        workers published, over the window, then becomes an ownership store. Every worker
        of the pipeline was stopped before any started under ownership, so nothing is
        published meanwhile (dedupctl switch-ownership)."""
        cfg = self.config
        assert self.store is not None and self.consumer is not None and cfg.workers
        added = owned_from_other_partitions(
            self.store, self.consumer, cfg.output_topic, cfg.partition, cfg.workers, window_start_ms
        )
        self.store.complete_switch()
        log.info(
            "store switched to ownership",
            extra={"ids_added": added, "workers": cfg.workers, "store_keys": self.store.key_count},
        )

    def close(self) -> None:
        """Complete the batch in flight (commit and store write), then release all."""
        self.health.ready = False
        try:
            if self._in_flight is not None and self.store is not None:
                if self._fence is None:
                    self._complete()
                else:
                    self._discard_in_flight()
        finally:
            self._release()

    def _discard_in_flight(self) -> None:
        """A fenced worker does not complete its batch in flight: the committer aborts it
        (token lost) or fails to commit it (fenced at the broker), and should it have
        committed, the store, unwritten, catches up from the output topic at the next
        start, as after a crash."""
        future = self._commit_result
        self._in_flight = self._commit_result = None
        if future is not None:
            with contextlib.suppress(Fenced, KafkaException):
                future.result()

    def _release(self) -> None:
        self._in_flight = self._commit_result = None
        self._committer.shutdown(wait=True)
        self.admin = None
        for consumer in (self.consumer, self.forwarded_consumer):
            if consumer is not None:
                consumer.close()
        self.consumer = self.forwarded_consumer = None
        if self.producer is not None:
            producer, self.producer = self.producer, None
            try:
                producer.flush(10)
            except KafkaException as exc:  # fenced or fatal: nothing of ours to deliver
                log.warning("producer not flushed on close", extra={"error": str(exc)})
        if self.store is not None:
            self.store.close()
            self.store = None

    # -- batches -------------------------------------------------------------------
    #
    # Two stages overlap: while batch N's transaction is being flushed and committed
    # (network waits, GIL released), batch N+1 is polled, triaged and looked up. N+1's
    # lookups also consult N's in-flight ids, which reach the store only after N commits.
    # A batch is *completed* when its commit has returned and its store write is done.

    def process_batch(self) -> BatchResult:
        """Prepare the next batch, complete the one in flight, send the prepared one.

        Returns what the *completed* batch did (zeros if none completed this call)."""
        if self._observe_hold() is WorkerState.PAUSED:
            return self._paused_step()
        prepared = self._prepare()
        in_flight = self._in_flight
        done, redo, expired = self._complete()
        if redo:
            # The aborted batch is re-polled (_complete rewound its sources); what was
            # prepared after it too: a source it did not read is rewound to where the
            # prepared batch began it, or its records there would be skipped.
            if prepared is not None and in_flight is not None:
                self._rewind(
                    {s: span for s, span in prepared.spans.items() if s not in in_flight.spans}
                )
            prepared = None
        elif expired and prepared is not None:
            # ids just expired are new
            prepared = self._look_up(
                prepared.records, prepared.split, prepared.spans, prepared.received
            )
        if prepared is not None:
            self._send(prepared)
        self._delete_consumed_forwards()
        return done

    # -- pause, don't die ------------------------------------------------------------

    def _observe_hold(self) -> WorkerState:
        """The token's hold (a clock comparison: no API call per batch) moves the state
        machine: raises Fenced when lost, resumes when held again after a pause."""
        hold = self.fencing.state()
        state = next_state(self.state, hold)
        if state is WorkerState.FENCED:
            self.state = state
            raise self._fenced(self.fencing.why_not_held())
        if state is WorkerState.PAUSED and self.state is WorkerState.RUNNING:
            self._pause()
        elif state is WorkerState.RUNNING and self.state is WorkerState.PAUSED:
            self._resume()
        return self.state

    def _pause(self) -> None:
        self.state = WorkerState.PAUSED
        self._paused_at = time.monotonic()
        self.health.ready = False
        self.health.paused = True
        self.metrics.paused.set(1)
        self.metrics.pauses.inc()
        log.warning(
            "paused: the Lease hold lapsed; no consuming or committing until it is renewed",
            extra={"reason": self.fencing.why_not_held(), "last_commit": self.last_commit_at},
        )

    def _paused_step(self) -> BatchResult:
        """One step of a paused worker: finish the transaction in flight (the committer
        aborts it, the token being lapsed, and the input is rewound to it; or it had
        committed just before the lapse and is completed as usual), then wait a little."""
        done, _, _ = self._complete()
        paused_s = time.monotonic() - self._paused_at
        kept = self._store_kept_s
        if (
            self.store is not None
            and self._in_flight is None
            and kept is not None
            and paused_s >= kept
        ):
            self.store.close()
            self.store = None
            log.warning(
                "paused: store closed (the Lease may have run out for others; the volume "
                "may move to the next epoch)",
                extra={"paused_seconds": round(paused_s, 3)},
            )
        self.health.beat()  # alive: paused on purpose, not stuck
        self._stop.wait(PAUSED_STEP_S)
        return done

    def _resume(self) -> None:
        """Held again at our epoch: consume from the offset the last committed
        transaction recorded (an aborted one left nothing; the store was only written
        after commits), so nothing is skipped or done twice."""
        assert self.consumer is not None and self._in_flight is None
        cfg = self.config
        if self.store is None:  # closed during a long pause: reopen, catch up, reassign
            self.store = Store.open(cfg.store_path, cfg.owner, cfg.window, cfg.store, cfg.ownership)
            self.consumer.unassign()
            catch_up(self.store, self.consumer, cfg.output_topic, cfg.partition, None, cfg.workers)
            sources, self._sources = self._sources, []
            offsets = self._assign(sources)
        else:
            offsets = self._resume_offsets(self._sources)
            for (topic, partition), offset in offsets.items():
                self._consumer_of(topic).seek(TopicPartition(topic, partition, offset))
        paused_s = time.monotonic() - self._paused_at
        self.state = WorkerState.RUNNING
        self.metrics.paused.set(0)
        self.metrics.paused_seconds.inc(paused_s)
        self.health.paused = False
        self.health.ready = True
        self.health.beat()
        log.info(
            "resumed: the Lease is held again at our epoch",
            extra={"sources": _named(offsets), "paused_seconds": round(paused_s, 3)},
        )

    def _prepare(self) -> _Batch | None:
        assert self.consumer is not None and self.store is not None
        cfg = self.config
        if cfg.owned_topic is not None and (
            time.monotonic() - self._discovered_at >= DISCOVER_EVERY_S
        ):
            self._discover()
        received, received_messages = self._poll_forwarded()
        # a backlog of forwarded records: no lingering for input records
        backlog = len(received) >= max(1, cfg.batch_size // 2)
        messages = self.consumer.consume(
            max(1, cfg.batch_size - len(received)), 0 if backlog else cfg.linger_ms / 1000
        )
        self.health.beat()
        inputs = self._records(messages)
        if not inputs and not received:
            self._serve_idle_producer()
            self._update_lag()
            return None
        records = inputs + received if received else inputs
        owned_topic = cfg.owned_topic
        if owned_topic is None:  # one source
            split = triage(inputs, cfg.id_spec)
            source = (cfg.input_topic, cfg.partition)
            spans = {source: _span(inputs)}
            self._clock.read(source, split.newest_ms)
        else:
            split, spans = self._triage_sources(records, inputs, received, owned_topic)
        self._clock_ends(messages, len(inputs))
        self._clock_ends(received_messages, len(received))
        if split.dead_letters and cfg.dead_letter_topic is None:
            bad = cast(Message, split.dead_letters[0].record)
            raise NoDeadLetterTopic(
                f"offset {bad.offset()} of {bad.topic()}[{bad.partition()}] has no valid "
                f"id ({split.dead_letters[0].reason}: {split.dead_letters[0].detail}) and no "
                "dead-letter topic is configured; set --dead-letter-topic "
                "(spec.kafka.deadLetterTopic) to route such records"
            )
        return self._look_up(records, split, spans, len(received))

    def _poll_forwarded(self) -> tuple[list[Message], list[Message]]:
        """(Ownership.) The forwarded records fetched so far, without waiting, up to
        half a batch (the rest of the batch is left to the input): the records, and the
        poll's messages with its partition-end events."""
        if self.forwarded_consumer is None:
            return [], []
        messages = self.forwarded_consumer.consume(max(1, self.config.batch_size // 2), 0)
        return self._records(messages), messages

    def _triage_sources(
        self,
        records: list[Message],
        inputs: list[Message],
        received: list[Message],
        owned_topic: str,
    ) -> tuple[Triage, dict[Source, tuple[int, int]]]:
        """Triage of a batch read from several sources (ownership; `records` is
        `inputs` then `received`): input records by the id rules, records of the
        internal topic by their forwarding header. Also each source's span and newest
        timestamp (for the window's clock)."""
        cfg = self.config
        single = self._single_input
        if not received and single is not None:  # the common case: one input partition
            split = triage(inputs, cfg.id_spec)
            self._clock.read(single, split.newest_ms)
            return split, {single: _span(inputs)}
        sources = list(
            zip(
                chain(repeat(cfg.input_topic, len(inputs)), repeat(owned_topic, len(received))),
                map(_partition, records),
                strict=True,
            )
        )
        first, last = sources[0], sources[-1]
        newest: dict[Source, int] = {}
        if first == last and sources.count(first) == len(sources):  # one source read
            spans = {first: _span(records)}
        else:
            spans = routing.source_spans(sources, list(map(_offset, records)))
            for source, timestamp in zip(sources, map(_timestamp, records), strict=True):
                if timestamp[1] > newest.get(source, 0):
                    newest[source] = timestamp[1]
        if not received:
            split = triage(inputs, cfg.id_spec)
        else:
            split = routing.merge(triage(inputs, cfg.id_spec), routing.triage_forwarded(received))
        for source, newest_ms in (newest or {first: split.newest_ms}).items():
            self._clock.read(source, newest_ms)
        return split, spans

    def _rewind(self, spans: dict[Source, tuple[int, int]]) -> None:
        """Read each source again from the first offset of its span."""
        for (topic, partition), (first, _) in spans.items():
            self._consumer_of(topic).seek(TopicPartition(topic, partition, first))

    def _clock_ends(self, messages: list[Message], records: int) -> None:
        """Sources the poll reached the end of no longer hold the window's clock back."""
        if records != len(messages):
            for msg in messages:
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    self._clock.at_end((msg.topic(), msg.partition()))

    def _look_up(
        self,
        records: list[Message],
        split: Triage,
        spans: dict[Source, tuple[int, int]],
        received: int = 0,
    ) -> _Batch:
        """Which first occurrences this worker owns, and which of those are new."""
        assert self.store is not None
        cfg = self.config
        firsts, forwards = split.firsts, NO_FORWARDS
        if cfg.workers is not None and firsts:
            owners = ownership.owners_unless_all_owned_by(
                cfg.partition, firsts.utf8_ids, cfg.workers
            )
            if owners is not None:  # else all are this worker's: producers keyed by id
                firsts, forwards = routing.route(firsts, owners, cfg.partition)
        keys = firsts.keys
        present = self.store.contains_many(keys)
        flying = frozenset() if self._in_flight is None else self._in_flight.new_keys
        if not flying.isdisjoint(keys):
            present = list(map(or_, present, map(flying.__contains__, keys)))
        new = select_new(firsts, present)
        return _Batch(records, split, new, frozenset(new.keys), spans, forwards, received)

    def _send(self, batch: _Batch) -> None:
        """Open the batch's transaction, produce its records, and commit it in the
        background."""
        self._produce_batch(batch)
        batch.started = time.monotonic()
        self._in_flight = batch
        self._commit_result = self._committer.submit(self._commit, batch)

    def _complete(self) -> tuple[BatchResult, bool, int]:
        """Wait for the batch in flight; on commit write the store and expire. Returns
        its result, whether it was aborted (then the input is rewound to redo it), and
        how many ids expired."""
        batch, future = self._in_flight, self._commit_result
        if batch is None or future is None:
            return _NOTHING, False, 0
        self._in_flight = self._commit_result = None
        assert self.store is not None and self.consumer is not None
        if not future.result():  # raises Fenced
            self._rewind(batch.spans)
            return _NOTHING, True, 0
        self.metrics.batch_seconds.observe(time.monotonic() - batch.started)
        faults.maybe_crash("after-commit")

        now_ms = self._clock.advance()
        self.store.record_batch(
            batch.new.keys,
            # The batch's newest timestamp, not its new records' newest: an id may be kept
            # a little longer than its own timestamp says, never shorter.
            max(now_ms, batch.newest_ms),
            input_next_offset=batch.next_input,
            output_next_offset=batch.last_output_offset + 1 if batch.new else None,
            # distinct (triage), not in the store at lookup, not in the batch before
            # (in-flight check), and nothing else writes the store meanwhile
            known_new=True,
        )
        expired = self.store.expire(now_ms)

        if batch.received:
            owned_topic = self.config.owned_topic
            for (topic, partition), (_, next_offset) in batch.spans.items():
                if topic == owned_topic:
                    self._forwarded_committed[partition] = next_offset

        m = self.metrics
        m.records_in.inc(len(batch.records) - batch.received)
        m.records_out.inc(len(batch.new))
        m.duplicates.inc(batch.duplicates)
        if batch.forwards:
            m.forwarded.inc(len(batch.forwards))
        if batch.received:
            m.received.inc(batch.received)
        for dead in batch.dead_letters:
            m.dead_letter(dead.reason)
        if expired:
            m.expired_ids.inc(expired)
        self._refresh_store_gauges()
        self._update_lag()
        return batch.result(), False, expired

    def _produce_batch(self, batch: _Batch) -> None:
        assert self.producer is not None
        cfg = self.config
        try:
            self.producer.begin_transaction()
            output, partition = cfg.output_topic, cfg.partition
            produce = self.producer.produce
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

    def _delete_consumed_forwards(self) -> None:
        """Every DELETE_FORWARDED_EVERY_S, delete the records of the internal partitions
        this worker reads below the offsets its committed transactions recorded (Kafka's
        deleteRecords, as Kafka Streams does for repartition topics): the topic keeps
        every record (retention.ms -1) until its owner has consumed it."""
        now = time.monotonic()
        cfg = self.config
        if cfg.owned_topic is None or now - self._deleted_at < DELETE_FORWARDED_EVERY_S:
            return
        self._deleted_at = now
        if self.admin is not None:
            self.admin.poll(0)  # serves its log lines
        due = {
            partition: offset
            for partition, offset in self._forwarded_committed.items()
            if offset > self._forwarded_deleted.get(partition, 0)
        }
        if not due:
            return
        if self.admin is None:
            # Made at the first records to delete: a worker whose producers key by id
            # receives none, and an idle client's threads cost the others CPU.
            self.admin = AdminClient(
                {
                    "bootstrap.servers": cfg.bootstrap_servers,
                    "logger": self._admin_log,
                    **cfg.kafka_settings,
                }
            )
        topic = cfg.owned_topic
        asked = [TopicPartition(topic, partition, offset) for partition, offset in due.items()]
        try:
            futures = self.admin.delete_records(asked, request_timeout=30)
        except KafkaException as exc:
            log.warning("consumed forwarded records not deleted", extra={"error": str(exc)})
            return
        self._forwarded_deleted.update(due)
        for tp, future in futures.items():
            future.add_done_callback(
                lambda done, tp=tp: self._deleted(tp.partition, tp.offset, done)  # type: ignore[misc]
            )

    def _deleted(self, partition: int, offset: int, done: Future[object]) -> None:
        """(Admin thread.) A deleteRecords request answered; a refusal is logged and the
        deletion asked again later (the records stay: only disk is spent)."""
        error = done.exception()
        if error is None:
            return
        if self._forwarded_deleted.get(partition) == offset:
            self._forwarded_deleted[partition] = 0
        log.warning(
            "consumed forwarded records not deleted; the internal topic grows until they are "
            "(the workers need the DeleteRecords ACL on it)",
            extra={"partition": partition, "offset": offset, "error": str(error)},
        )

    def _forward(self, forwards: Forwards) -> None:
        """Produce each record another worker owns to its owner's partition of the
        internal topic (in the open transaction), with the forwarding headers.

        The columns are taken with ``map`` (driven from C) and the produce call is
        positional: cheaper per call, measured in isolation; records/s did not move
        measurably (bench/HISTORY.md, "Per-call costs on the forwarding path")."""
        owned_topic = self.config.owned_topic
        if not forwards or owned_topic is None:
            return
        assert self.producer is not None
        produce = self.producer.produce
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

    def _commit(self, batch: _Batch) -> bool:
        """(Committer thread.) Flush, add the input offset, commit. False if the
        transaction was aborted and the batch must be redone; raises Fenced when this
        worker is a zombie."""
        assert self.producer is not None and self.consumer is not None
        producer = self.producer
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
                self.consumer.consumer_group_metadata(),
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
                try:
                    producer.abort_transaction(30)
                except KafkaException as abort_exc:
                    self._raise_if_fenced(abort_exc, "abort_transaction")
                    raise
                self.metrics.aborts.inc()
                return False
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
        return True

    def _check_token(self, producer: Producer) -> bool:
        """(Committer thread.) Before committing: still holding the fencing token? If
        lost, abort the open transaction (as far as the broker lets us) and raise Fenced;
        if lapsed, abort it and return False (the batch is redone after the pause)."""
        hold = self.fencing.state()
        if hold is Hold.HELD:
            return True
        if hold is Hold.LOST:
            fence = self._fenced(self.fencing.why_not_held())
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
        try:
            producer.flush(ABORT_FLUSH_S)
            producer.abort_transaction(30)
        except KafkaException as exc:
            self._raise_if_fenced(exc, "flush, abort_transaction")
            raise
        self.metrics.aborts.inc()
        return False

    def _fenced(self, reason: str) -> Fenced:
        """The exception a fenced worker stops with; counted once per worker."""
        if self._fence is None:
            self._fence = reason
            self.metrics.fencing_events.inc()
        return Fenced(f"partition {self.config.partition} of {self.config.pipeline}: {reason}")

    def _raise_if_fenced(self, exc: KafkaException, during: str = "a Kafka call") -> None:
        """Raise Fenced if `exc` says the producer is fenced or fatally failed, however the
        call learned it: the transactional calls return the fatal error itself, while
        `produce` only says `_FATAL` ("Unable to produce message"), the reason being
        served to the error callback by the next poll."""
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError):
            return
        code = err.code()
        if code not in _FENCED_CODES and not err.fatal() and code != KafkaError._FATAL:
            return
        if code == KafkaError._FATAL and self._fatal is None and self.producer is not None:
            try:
                self.producer.poll(0)  # serves the fatal error: to the callback, or raised
            except KafkaException as served:
                self._on_kafka_error(served.args[0] if served.args else None)
        cause = self._fatal if code == KafkaError._FATAL and self._fatal is not None else err
        raise self._fenced(
            f"another worker took over transactional id {self.config.transactional_id} "
            f"({cause.str()}; learned during {during}); this one must stop"
        ) from exc

    def _on_kafka_error(self, err: KafkaError | None) -> None:
        """The producer's error callback: remembers its fatal error (a fence), and tells
        its log hook when all brokers are down."""
        if isinstance(err, KafkaError) and err.fatal() and self._fatal is None:
            self._fatal = err
        self._producer_log.error(err)

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
        assert self.producer is not None
        while True:
            try:
                self.producer.produce(
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
                self.producer.poll(0.05)

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

    # -- helpers ---------------------------------------------------------------------

    def _records(self, messages: list[Message]) -> list[Message]:
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

    def _out_of_range(self, msg: Message, err: KafkaError) -> None:
        """(Ownership: auto.offset.reset=error.) A source's offset is no longer in its
        log. Forwarded records deleted unread are lost: stop. Input deleted by its
        retention before it was read: go on from the log start, as auto.offset.reset
        earliest does without ownership, with a warning."""
        assert self.consumer is not None
        topic, partition = str(msg.topic()), int(msg.partition())
        if topic == self.config.owned_topic:
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

    def _find_sources(self) -> list[Source]:
        """What this worker reads: its input partition; under ownership, every input
        and internal partition equal to it modulo the number of workers."""
        cfg = self.config
        if cfg.owned_topic is None or cfg.workers is None:
            return [(cfg.input_topic, cfg.partition)]
        self._discovered_at = time.monotonic()
        return [
            (topic, partition)
            for topic in (cfg.input_topic, cfg.owned_topic)
            for partition in routing.sources_of(
                cfg.partition, cfg.workers, self._partition_count(topic)
            )
        ]

    def _partition_count(self, topic: str, timeout_s: float = 30) -> int:
        assert self.consumer is not None
        metadata = self.consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None:
            err = None if metadata is None else metadata.error
            raise KafkaException(err or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return len(metadata.partitions)

    def _discover(self) -> None:
        """Start reading input partitions that appeared since the last look (the topic
        grew), each from its committed offset, else from its log start: nothing
        produced before this worker noticed the partition is skipped."""
        cfg = self.config
        assert cfg.workers is not None
        self._discovered_at = time.monotonic()
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
            offsets = self._assign(new)
            log.info(
                "input partitions discovered",
                extra={"topic": cfg.input_topic, "partitions": count, "sources": _named(offsets)},
            )

    def _assign(self, sources: list[Source]) -> dict[Source, int]:
        """Add `sources` to their consumers' assignments at their resume offsets (a
        consumer's first assignment, an incremental one after it)."""
        offsets = self._resume_offsets(sources)
        assigned = {topic for topic, _ in self._sources}
        for topic in dict.fromkeys(topic for topic, _ in sources):
            consumer = self._consumer_of(topic)
            partitions = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if t == topic]
            if topic in assigned:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)
        self._sources = [*self._sources, *sources]
        inputs = [s for s in self._sources if s[0] == self.config.input_topic]
        self._single_input = inputs[0] if len(inputs) == 1 else None
        return offsets

    def _consumer_of(self, topic: str) -> Consumer:
        """The consumer that reads `topic`: the internal topic has its own."""
        if topic == self.config.owned_topic and self.forwarded_consumer is not None:
            return self.forwarded_consumer
        assert self.consumer is not None
        return self.consumer

    def _resume_offsets(self, sources: list[Source]) -> dict[Source, int]:
        """Each source's offset committed by the last transaction; a source with none
        starts at its first offset (given explicitly: the logical OFFSET_BEGINNING costs
        librdkafka a reset round, about 1 s to the first fetch)."""
        assert self.consumer is not None
        committed = self._committed_offsets(sources)
        for source, offset in committed.items():
            if offset < 0:
                low, _ = self.consumer.get_watermark_offsets(TopicPartition(*source), timeout=30)
                committed[source] = int(low)
        return committed

    def _committed_offsets(
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

    def _serve_idle_producer(self) -> None:
        """With no transaction in flight, serve the producer's log lines, errors and
        statistics now: only a commit's flush serves them otherwise, and an idle worker
        would tell of a broker outage (its transaction coordinator's connection failing)
        at the next commit, judged late, or never. (A transaction in flight is flushed
        by the committer thread, which serves them.)"""
        if self._in_flight is None and self.producer is not None:
            self.producer.poll(0)

    def _update_lag(self) -> None:
        """Records not read yet: of the input (consumer lag) and of the internal topic."""
        cfg = self.config
        lag = dict.fromkeys((t for t in (cfg.input_topic, cfg.owned_topic) if t is not None), 0)
        try:
            for topic in lag:
                consumer = self._consumer_of(topic)
                read = [TopicPartition(t, p) for t, p in self._sources if t == topic]
                for tp in consumer.position(read) if read else ():
                    _, high = consumer.get_watermark_offsets(tp, cached=True)
                    if high >= 0 and tp.offset >= 0:
                        lag[topic] += max(0, high - tp.offset)
        except KafkaException:
            return
        self.metrics.consumer_lag.set(lag[cfg.input_topic])
        if cfg.owned_topic is not None:
            self.metrics.forwarded_lag.set(lag[cfg.owned_topic])

    def _refresh_store_gauges(self) -> None:
        assert self.store is not None
        self._refresh_disk_gauge()
        self.metrics.store_keys.set(self.store.key_count)
        oldest = self.store.oldest_timestamp_ms
        now_ms = self._clock.now_ms
        if oldest is not None and now_ms:
            self.metrics.window_age.set(max(0.0, (now_ms - oldest) / 1000))

    def _refresh_disk_gauge(self) -> None:
        """Store size on disk: lists files, so at most every DISK_GAUGE_EVERY_S."""
        now = time.monotonic()
        if self.store is not None and now - self._disk_measured >= DISK_GAUGE_EVERY_S:
            self._disk_measured = now
            self.metrics.store_bytes.set(self.store.disk_bytes())

    def _on_forwarded_statistics(self, report: str) -> None:
        """The internal topic's consumer's statistics (stats_cb, every second): its
        connections' states for the log levels, and each internal partition's high
        watermark and last stable offset for the age of the oldest open forwarder
        transaction."""
        owned_topic = self.config.owned_topic
        try:  # parsed once for both readers
            parsed = json.loads(report)
        except ValueError:
            return
        self._forwarded_log.statistics(parsed)
        try:
            partitions = parsed["topics"][owned_topic]["partitions"]
            now = time.monotonic()
            for number, stats in partitions.items():
                partition = int(number)
                if partition >= 0:  # -1 is librdkafka's unassigned-messages entry
                    self._open_transaction.observe(
                        partition, int(stats["hi_offset"]), int(stats["ls_offset"]), now
                    )
        except (ValueError, KeyError, TypeError):
            return
        self.metrics.forwarded_stalled.set(self._open_transaction.seconds(now))

    def _producer_settings(self) -> dict[str, object]:
        cfg = self.config
        return {
            "bootstrap.servers": cfg.bootstrap_servers,
            "transactional.id": cfg.transactional_id,
            "error_cb": self._on_kafka_error,
            "logger": self._producer_log,
            # Polled while a batch commits (flush) and, idle, at every empty poll of the
            # consumer (_serve_idle_producer): its reports say when a broker is up, as
            # a committed transaction does.
            "stats_cb": self._producer_log.statistics,
            "statistics.interval.ms": STATISTICS_INTERVAL_MS,
            "transaction.timeout.ms": cfg.transaction_timeout_ms,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": max(100_000, cfg.batch_size * 4),
            **cfg.kafka_settings,
        }

    def _consumer_settings(self) -> dict[str, object]:
        cfg = self.config
        return {
            "bootstrap.servers": cfg.bootstrap_servers,
            "group.id": cfg.group,
            "logger": self._consumer_log,
            "error_cb": self._consumer_log.error,
            # The consumer is polled all the time: its reports say when a broker is up.
            "stats_cb": self._consumer_log.statistics,
            "statistics.interval.ms": STATISTICS_INTERVAL_MS,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            # under ownership an offset out of range is decided per source (_out_of_range)
            "auto.offset.reset": "earliest" if cfg.owned_topic is None else "error",
            "enable.partition.eof": True,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "queued.min.messages": max(100_000, cfg.batch_size * 4),
            **cfg.kafka_settings,
        }

    def _forwarded_consumer_settings(self) -> dict[str, object]:
        """(Ownership.) The internal topic's consumer: the input consumer's settings,
        with its own log judge and statistics reader (polled at every batch too)."""
        return {
            **self._consumer_settings(),
            "logger": self._forwarded_log,
            "error_cb": self._forwarded_log.error,
            "stats_cb": self._on_forwarded_statistics,
        }
