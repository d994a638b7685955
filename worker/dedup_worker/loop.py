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

import gc
import logging
import threading
import time
from collections.abc import Callable
from itertools import chain, repeat
from operator import or_
from typing import cast

from confluent_kafka import Consumer, KafkaError, Message

from dedup_contract import batch as batch_rules
from dedup_contract import faults, ownership
from dedup_contract.batch import Triage, select_new, triage
from dedup_contract.release import VERSION
from dedup_contract.store import Store
from dedup_worker import routing
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import AlwaysHeld, FencingToken
from dedup_worker.internal_topic import ConsumerFactory, InternalTopic
from dedup_worker.lease import WorkerState, next_state
from dedup_worker.metrics import Health, WorkerMetrics
from dedup_worker.recovery import catch_up, owned_from_other_partitions
from dedup_worker.routing import NO_FORWARDS, Source, WindowClock
from dedup_worker.sources import SourceReader, StoppedOnInput, named
from dedup_worker.transaction import Batch, BatchResult, Publisher

log = logging.getLogger(__name__)

# Dead-letter header names, re-exported from batch.py (which owns them).
DLQ_REASON = batch_rules.DLQ_REASON
DLQ_DETAIL = batch_rules.DLQ_DETAIL
DLQ_TOPIC = batch_rules.DLQ_TOPIC
DLQ_PARTITION = batch_rules.DLQ_PARTITION
DLQ_OFFSET = batch_rules.DLQ_OFFSET

DISK_GAUGE_EVERY_S = 10.0
PAUSED_STEP_S = 0.05  # while paused, how often the hold is looked at again

PublisherFactory = Callable[
    [WorkerConfig, FencingToken, WorkerMetrics, Callable[[], object]], Publisher
]
"""Makes the worker's Publisher from its config, token, metrics and the input consumer's
group metadata (`Publisher` itself; a test or bench passes its own)."""


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


__all__ = ["DedupWorker", "NoDeadLetterTopic", "StoppedOnInput", "read_only_after"]


class NoDeadLetterTopic(StoppedOnInput):
    """A record has no valid id and no dead-letter topic is configured: stopping rather
    than dropping it. The input offset is not committed, so nothing is lost."""


_NOTHING = BatchResult(0, 0, 0, 0)
# A batch's columns, as Message's own (C) methods (the note in transaction.py).
_partition = Message.partition
_offset = Message.offset
_timestamp = Message.timestamp


def _span(records: list[Message]) -> tuple[int, int]:
    """The first offset and the next to read of a batch read from one source."""
    return int(records[0].offset()), int(records[-1].offset()) + 1


def read_only_after(
    aborted: dict[Source, tuple[int, int]], prepared: dict[Source, tuple[int, int]]
) -> dict[Source, tuple[int, int]]:
    """A batch's transaction was aborted while the next batch was prepared, and both
    are read again: the aborted batch's sources from its first offsets (the worker
    rewinds those when the abort is learned), and these, the sources only the prepared
    batch read, from the prepared batch's first offset of each (its records there would
    be skipped otherwise)."""
    return {source: span for source, span in prepared.items() if source not in aborted}


class DedupWorker:
    """One worker: start-up, the batch's stages, pause and resume. The commit protocol
    is its `publisher` (transaction.py), what it reads its `reader` (sources.py), and
    under ownership the internal topic it reads its `internal` (internal_topic.py), None
    without."""

    def __init__(
        self,
        config: WorkerConfig,
        fencing: FencingToken | None = None,
        metrics: WorkerMetrics | None = None,
        health: Health | None = None,
        clock: Callable[[], float] = time.time,
        publisher: PublisherFactory = Publisher,
        make_consumer: ConsumerFactory = Consumer,
    ) -> None:
        """`publisher` and `make_consumer` make the Kafka side (confluent-kafka's by
        default; a test passes fakes)."""
        self.config = config
        self.fencing = fencing or AlwaysHeld()
        self.metrics = metrics or WorkerMetrics(config.pipeline, config.partition)
        self.health = health or Health()
        self.clock = clock
        self._stop = threading.Event()
        self._clock = WindowClock()  # the window's clock over the sources read
        self._disk_measured = -DISK_GAUGE_EVERY_S
        self.state = WorkerState.RUNNING
        self._paused_at = 0.0  # monotonic time the current pause began
        # how long a pause keeps the store open: a third of the Lease duration (None: no
        # Lease, a standalone worker never pauses)
        lease = config.lease
        self._store_kept_s = None if lease is None else lease.duration_s / 3
        self.store: Store | None = None
        self.publisher = publisher(config, self.fencing, self.metrics, self._group_metadata)
        self.internal = (
            None
            if config.owned_topic is None
            else InternalTopic(config, self.metrics, make_consumer)
        )
        self.reader = SourceReader(config, self.metrics, self.internal, make_consumer)

    @property
    def last_commit_at(self) -> float | None:
        """Wall-clock time the last commit returned (None before the first): the fenced
        worker's log line carries it, to show it stopped before the next holder began."""
        return self.publisher.last_commit_at

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
            raise self.publisher.fenced(f"not held at start: {self.fencing.why_not_held()}")
        self.store = Store.open(
            cfg.store_path,
            cfg.owner,
            cfg.window,
            cfg.store,
            cfg.ownership,
            cfg.ownership_switch,
            cfg.finalized,
        )
        self.publisher.open()
        consumer = self.reader.open()
        rebuild_from = None
        if cfg.window.duration_ms is not None:
            rebuild_from = int(self.clock() * 1000) - cfg.window.duration_ms
        recovered = catch_up(
            self.store, consumer, cfg.output_topic, cfg.partition, rebuild_from, cfg.workers
        )
        if self.store.switching:
            self._switch_store(rebuild_from)
        if self.internal is not None:  # made now: a consumer not polled queues its reports
            self.internal.open(self.reader.settings())
        resume = self.reader.assign_all()
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
                "version": VERSION,
                "pipeline": cfg.pipeline,
                "partition": cfg.partition,
                "input_offset": resume.get((cfg.input_topic, cfg.partition)),
                "sources": named(resume),
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
        consumer = self.reader.consumer
        assert self.store is not None and consumer is not None and cfg.workers
        added = owned_from_other_partitions(
            self.store, consumer, cfg.output_topic, cfg.partition, cfg.workers, window_start_ms
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
            if self.publisher.in_flight is not None and self.store is not None:
                if self.publisher.fence is None:
                    self._complete()
                else:
                    self.publisher.discard()
        finally:
            self._release()

    def _release(self) -> None:
        self.publisher.close()
        self.reader.close()
        if self.internal is not None:
            self.internal.close()
        if self.store is not None:
            self.store.close()
            self.store = None

    def _group_metadata(self) -> object:
        """(Committer thread.) The input consumer's group metadata, for each commit."""
        consumer = self.reader.consumer
        assert consumer is not None
        return consumer.consumer_group_metadata()

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
        in_flight = self.publisher.in_flight
        done, redo, expired = self._complete()
        if redo:
            # The aborted batch is re-polled (_complete rewound its sources), and what was
            # prepared after it too.
            if prepared is not None and in_flight is not None:
                self.reader.rewind(read_only_after(in_flight.spans, prepared.spans))
            prepared = None
        elif expired and prepared is not None:
            # ids just expired are new
            prepared = self._look_up(
                prepared.records, prepared.split, prepared.spans, prepared.received
            )
        if prepared is not None:
            self.publisher.send(prepared)
        if self.internal is not None:
            self.internal.delete_consumed()
        return done

    # -- pause, don't die ------------------------------------------------------------

    def _observe_hold(self) -> WorkerState:
        """The token's hold (a clock comparison: no API call per batch) moves the state
        machine: raises Fenced when lost, resumes when held again after a pause."""
        hold = self.fencing.state()
        state = next_state(self.state, hold)
        if state is WorkerState.FENCED:
            self.state = state
            raise self.publisher.fenced(self.fencing.why_not_held())
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
            and self.publisher.in_flight is None
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
        consumer = self.reader.consumer
        assert consumer is not None and self.publisher.in_flight is None
        cfg = self.config
        if self.store is None:  # closed during a long pause: reopen, catch up, reassign
            self.store = Store.open(cfg.store_path, cfg.owner, cfg.window, cfg.store, cfg.ownership)
            consumer.unassign()
            catch_up(self.store, consumer, cfg.output_topic, cfg.partition, None, cfg.workers)
            offsets = self.reader.reassign()
        else:
            offsets = self.reader.seek_to_committed()
        paused_s = time.monotonic() - self._paused_at
        self.state = WorkerState.RUNNING
        self.metrics.paused.set(0)
        self.metrics.paused_seconds.inc(paused_s)
        self.health.paused = False
        self.health.ready = True
        self.health.beat()
        log.info(
            "resumed: the Lease is held again at our epoch",
            extra={"sources": named(offsets), "paused_seconds": round(paused_s, 3)},
        )

    def _prepare(self) -> Batch | None:
        reader, consumer = self.reader, self.reader.consumer
        assert consumer is not None and self.store is not None
        cfg = self.config
        internal = self.internal
        if internal is not None:
            reader.discover_if_due()
        received, received_messages = reader.poll_forwarded()
        # a backlog of forwarded records: no lingering for input records
        backlog = len(received) >= max(1, cfg.batch_size // 2)
        messages = consumer.consume(
            max(1, cfg.batch_size - len(received)), 0 if backlog else cfg.linger_ms / 1000
        )
        self.health.beat()
        inputs = reader.records(messages)
        if not inputs and not received:
            self.publisher.serve_idle()
            reader.update_lag()
            return None
        records = inputs + received if received else inputs
        if internal is None:  # one source
            split = triage(inputs, cfg.id_spec)
            source = (cfg.input_topic, cfg.partition)
            spans = {source: _span(inputs)}
            self._clock.read(source, split.newest_ms)
        else:
            split, spans = self._triage_sources(records, inputs, received, internal.topic)
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
        single = self.reader.single_input
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
    ) -> Batch:
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
        in_flight = self.publisher.in_flight
        flying = frozenset() if in_flight is None else in_flight.new_keys
        if not flying.isdisjoint(keys):
            present = list(map(or_, present, map(flying.__contains__, keys)))
        new = select_new(firsts, present)
        return Batch(records, split, new, frozenset(new.keys), spans, forwards, received)

    def _complete(self) -> tuple[BatchResult, bool, int]:
        """Wait for the batch in flight; on commit write the store and expire. Returns
        its result, whether it was aborted (then the input is rewound to redo it), and
        how many ids expired."""
        batch = self.publisher.in_flight
        if batch is None:
            return _NOTHING, False, 0
        assert self.store is not None
        if not self.publisher.result():  # raises Fenced
            self.reader.rewind(batch.spans)
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

        if batch.received and self.internal is not None:
            self.internal.committed(batch.spans)

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
        self.reader.update_lag()
        return batch.result(), False, expired

    # -- helpers ---------------------------------------------------------------------

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
